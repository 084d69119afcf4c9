#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_EPOCH_PAGE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_EPOCH_PAGE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/core/segment_descriptor.h"

namespace mooncake::te::nvlink_intra {

/// Descriptor fields: at the top level the fd (in the publisher) of its epoch table; in each buffer's entry the
/// buffer's slot in that table and the slot's value when the buffer was registered.
inline constexpr const char kEpochFdField[] = "nvlink_intra_epoch_fd";
inline constexpr const char kEpochSlotField[] = "nvlink_intra_epoch_slot";
inline constexpr const char kEpochField[] = "nvlink_intra_epoch";
/// Slots of an epoch table (8 bytes each): the most regions one process registers with nvlink_intra at once.
inline constexpr size_t kEpochSlots = 32768;
inline constexpr size_t kEpochTableBytes = kEpochSlots * sizeof(uint64_t);

/// This process's registration epochs, one per registered region, shared read-only with same-host peers: counters
/// in a memfd (size sealed). A region's counter moves on when it is withdrawn (and again when its slot is given
/// up), so a peer holding a descriptor with an older value for that buffer must not touch it, while the other
/// buffers stay valid. Values only grow: a slot reused by a later region never matches an old descriptor.
/// Thread-safe.
class LocalEpochs {
 public:
  LocalEpochs();  ///< without a memfd (fd() < 0) the counters are private and peers cannot check them
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
  int fd_ = -1;
  std::atomic<uint64_t>* values_ = nullptr;           // kEpochSlots counters (the memfd's mapping, or private_)
  std::unique_ptr<std::atomic<uint64_t>[]> private_;  // when there is no memfd
  std::mutex mu_;                                     // guards the slot bookkeeping below
  std::vector<uint32_t> free_;
  uint32_t next_ = 0;  // slots below it have been assigned at least once
};

/// The epoch tables of peers, mapped read-only once per peer instance. Thread-safe.
class PeerEpochs {
 public:
  ~PeerEpochs();
  /// Ok when the epoch of `buffer` (its slot in the peer's table) still equals the one `desc` published for it;
  /// kStaleMetadata when it moved on (the peer withdrew that buffer since `desc` was built); kMalformedJson when
  /// `desc` or `buffer` lack valid epoch fields; the mapping's error when the table cannot be mapped (e.g. the peer
  /// exited).
  Status Check(const SegmentDescriptor& desc, const BufferDescriptor& buffer);
  /// Unmaps the tables of segment `segment_name`.
  void Forget(const std::string& segment_name);

 private:
  struct Page {
    std::string segment;
    const std::atomic<uint64_t>* values;
    void* base;
  };
  std::mutex mu_;
  std::map<std::string, Page> pages_;  // by peer instance
};

}  // namespace mooncake::te::nvlink_intra

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_EPOCH_PAGE_H_
