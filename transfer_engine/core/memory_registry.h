#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_MEMORY_REGISTRY_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_MEMORY_REGISTRY_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

/// One registered range of this process's memory.
struct MemoryRegion {
  uint64_t start = 0;
  uint64_t length = 0;
  std::string location;  ///< "cpu:N", "*", ...
  bool remote_accessible = true;
  /// When the range is backed by a memfd this process holds: its descriptor and the range's offset in it, so
  /// same-host peers can map it (-1: private memory).
  int shm_fd = -1;
  uint64_t shm_offset = 0;
  uint64_t end() const { return start + length; }
};

/// A reference that keeps a region registered: Unregister waits until no pin is held, so memory is never
/// unregistered (and freed by its owner) while a transfer still reads or writes it.
using RegionPin = std::shared_ptr<const MemoryRegion>;

/// The set of locally registered ranges. Thread-safe; lookups take a shared lock only.
class MemoryRegistry {
 public:
  MemoryRegistry();
  ~MemoryRegistry();

  /// Counts unregistrations. It lives in a one-page memfd (`epoch_fd()`, -1 if unavailable) that same-host
  /// peers map read-only: a peer whose cached descriptor carries an older epoch must refresh it before
  /// touching this process's memory.
  uint64_t epoch() const;
  int epoch_fd() const { return epoch_fd_; }

  /// kInvalidArgument for a null address or zero length; kAddressOverlapped when [addr, addr+len) overlaps
  /// an existing registration.
  Status Register(uint64_t addr, uint64_t length, std::string location, bool remote_accessible,
                  int shm_fd = -1, uint64_t shm_offset = 0);

  /// Removes the registration starting at `addr` (kAddressNotRegistered otherwise), then waits (up to
  /// `drain_timeout`) for transfers still using it. New transfers are rejected at once.
  Status Unregister(uint64_t addr, std::chrono::milliseconds drain_timeout);

  /// The region wholly containing [addr, addr+len), or null. With `remote` set, only remote-accessible
  /// regions qualify.
  RegionPin Find(uint64_t addr, uint64_t length, bool remote) const;

  /// Snapshot in registration order.
  std::vector<MemoryRegion> List() const;
  size_t size() const;

 private:
  int epoch_fd_ = -1;
  std::atomic<uint64_t>* epoch_ = nullptr;  // in the shared page (or in fallback_epoch_)
  std::atomic<uint64_t> fallback_epoch_{0};
  mutable std::shared_mutex mu_;
  std::map<uint64_t, std::shared_ptr<MemoryRegion>> by_start_;
  std::vector<uint64_t> order_;  // registration order (starts)
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_MEMORY_REGISTRY_H_
