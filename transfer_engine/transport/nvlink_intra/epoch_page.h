#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_EPOCH_PAGE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_EPOCH_PAGE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "transfer_engine/api/status.h"
#include "transfer_engine/core/segment_descriptor.h"

namespace mooncake::te::nvlink_intra {

/// Descriptor fields: the epoch when the descriptor was built, and the fd (in the publisher) of its epoch page.
inline constexpr const char kEpochField[] = "nvlink_intra_epoch";
inline constexpr const char kEpochFdField[] = "nvlink_intra_epoch_fd";

/// This process's registration epoch, shared read-only with same-host peers: a counter in a one-page memfd
/// (size sealed) that moves on whenever a region is withdrawn. A peer holding a descriptor with an older value
/// must refresh it before touching this process's device memory. Thread-safe.
class LocalEpoch {
 public:
  LocalEpoch();  ///< without a memfd (fd() < 0) the counter is private and peers cannot check it
  ~LocalEpoch();
  LocalEpoch(const LocalEpoch&) = delete;
  LocalEpoch& operator=(const LocalEpoch&) = delete;

  int fd() const { return fd_; }
  uint64_t value() const { return value_->load(std::memory_order_acquire); }
  void Advance() { value_->fetch_add(1, std::memory_order_acq_rel); }

 private:
  int fd_ = -1;
  std::atomic<uint64_t> private_{0};
  std::atomic<uint64_t>* value_ = &private_;
};

/// The epoch pages of peers, mapped read-only once per peer instance. Thread-safe.
class PeerEpochs {
 public:
  ~PeerEpochs();
  /// Ok when the peer's epoch still equals the one in `desc`; kStaleMetadata when it moved on (the peer withdrew
  /// memory since `desc` was built); kMalformedJson when `desc` lacks valid epoch fields; the mapping's error
  /// when the page cannot be mapped (e.g. the peer exited).
  Status Check(const SegmentDescriptor& desc);
  /// Unmaps the pages of segment `segment_name`.
  void Forget(const std::string& segment_name);

 private:
  struct Page {
    std::string segment;
    const std::atomic<uint64_t>* value;
    void* base;
  };
  std::mutex mu_;
  std::map<std::string, Page> pages_;  // by peer instance
};

}  // namespace mooncake::te::nvlink_intra

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_EPOCH_PAGE_H_
