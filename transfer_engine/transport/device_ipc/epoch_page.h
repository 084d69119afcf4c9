#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_EPOCH_PAGE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_EPOCH_PAGE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/core/segment_descriptor.h"

namespace mooncake::te::device_ipc {

/// Slots of an epoch table (8 bytes each): the most regions one process registers with one transport at once.
inline constexpr size_t kEpochSlots = 32768;
inline constexpr size_t kEpochTableBytes = kEpochSlots * sizeof(uint64_t);

/// The descriptor fields of a transport's epochs: at the top level `table` (where peers find the publisher's
/// epoch table: "<transport>_epoch_fd", its fd, for same-host tables); in each buffer's entry `slot` (the buffer's
/// slot in that table) and `value` (the slot's value when the buffer was registered).
struct EpochFields {
  std::string table, slot, value;
  /// "<transport>_epoch_fd", "<transport>_epoch_slot", "<transport>_epoch".
  static EpochFields For(const std::string& transport);
};

/// This process's registration epochs, one per registered region. A region's counter moves on when it is
/// withdrawn (and again when its slot is given up), so a peer holding a descriptor with an older value for that
/// buffer must not touch it, while the other buffers stay valid. Values only grow: a slot reused by a later
/// region never matches an old descriptor. Thread-safe.
///
/// Two forms: the shared one keeps the counters in a memfd (size sealed) that same-host peers map read-only
/// (fd()); the published one keeps them private and calls `publish(slot, value)` after every change (the
/// caller copies the value to where its peers read it; calls for one slot come in order of the changes).
class LocalEpochs {
 public:
  /// The shared form, memfd `memfd_name`; without a memfd (fd() < 0) the counters are private and peers cannot
  /// check them.
  explicit LocalEpochs(const std::string& memfd_name);
  /// The published form (fd() < 0).
  explicit LocalEpochs(std::function<void(uint32_t slot, uint64_t value)> publish);
  ~LocalEpochs();
  LocalEpochs(const LocalEpochs&) = delete;
  LocalEpochs& operator=(const LocalEpochs&) = delete;

  int fd() const { return fd_; }
  /// A free slot for a region being registered and the slot's current value; kTooManyRequests when all
  /// kEpochSlots are taken.
  StatusOr<std::pair<uint32_t, uint64_t>> Assign();
  /// The region of `slot` was withdrawn: peers stop touching it.
  void Advance(uint32_t slot);
  /// The region of `slot` is gone: its value moves on and the slot may be assigned again.
  void Release(uint32_t slot);
  uint64_t value(uint32_t slot) const;

 private:
  void Bump(uint32_t slot);

  int fd_ = -1;
  std::atomic<uint64_t>* values_ = nullptr;           // kEpochSlots counters (the memfd's mapping, or private_)
  std::unique_ptr<std::atomic<uint64_t>[]> private_;  // when there is no memfd
  std::function<void(uint32_t, uint64_t)> publish_;   // the published form
  std::mutex publish_mu_;                             // orders publish_ calls
  std::mutex mu_;                                     // guards the slot bookkeeping below
  std::vector<uint32_t> free_;
  uint32_t next_ = 0;  // slots below it have been assigned at least once
};

/// The epochs one submission read from one peer's table (slot -> what Read gave), so that its slices share one
/// read per buffer. Made at the start of a submission, dropped at its end: a withdrawal that completed before
/// the submission started is seen by its first read. Not thread-safe (one submitting thread).
using EpochReads = std::map<uint32_t, StatusOr<uint64_t>>;

/// The epoch tables of peers, each opened once per peer instance (by the derived class). Thread-safe.
class PeerEpochs {
 public:
  PeerEpochs(std::string what, EpochFields fields) : what_(std::move(what)), fields_(std::move(fields)) {}
  virtual ~PeerEpochs() = default;
  /// Ok when the epoch of `buffer` (its slot in the peer's table) still equals the one `desc` published for it;
  /// kStaleMetadata when it moved on (the peer withdrew that buffer since `desc` was built); kMalformedJson when
  /// `desc` or `buffer` lack valid epoch fields; the table's error when it cannot be read (e.g. the peer exited).
  /// With `reads` (one submission's, all to the peer of `desc`), a slot already read there is not read again.
  Status Check(const SegmentDescriptor& desc, const BufferDescriptor& buffer, EpochReads* reads = nullptr);
  /// Closes the tables of segment `segment_name`.
  virtual void Forget(const std::string& segment_name) = 0;
  /// Reads of peers' tables made so far (Read calls), by segment name.
  std::map<std::string, uint64_t> ReadCounts() const;

 protected:
  /// The current value of `slot` (< kEpochSlots) in the table of peer instance `instance` (non-empty) that
  /// `desc` publishes, opening the table the first time.
  virtual StatusOr<uint64_t> Read(const SegmentDescriptor& desc, const std::string& instance, uint32_t slot) = 0;

  const std::string what_;
  const EpochFields fields_;

 private:
  mutable std::mutex count_mu_;
  std::map<std::string, uint64_t> reads_;  // by segment (count_mu_)
};

/// Tables of same-host peers (the shared LocalEpochs form): the publisher's memfd, opened through
/// /proc/<pid>/fd/<fields.table> (same user or root) and mapped read-only once per peer instance.
class ProcPeerEpochs final : public PeerEpochs {
 public:
  using PeerEpochs::PeerEpochs;
  ~ProcPeerEpochs() override;
  void Forget(const std::string& segment_name) override;

 protected:
  StatusOr<uint64_t> Read(const SegmentDescriptor& desc, const std::string& instance, uint32_t slot) override;

 private:
  struct Page {
    std::string segment;
    const std::atomic<uint64_t>* values;
    void* base;
  };
  std::mutex mu_;
  std::map<std::string, Page> pages_;  // by peer instance
};

}  // namespace mooncake::te::device_ipc

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_EPOCH_PAGE_H_
