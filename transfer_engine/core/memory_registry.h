#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_MEMORY_REGISTRY_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_MEMORY_REGISTRY_H_

#include <atomic>
#include <functional>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

/// What a transport keeps per registered region (memory keys per NIC, an IPC handle, ...): see
/// Transport::RegisterRegion. Owned by the region, destroyed after the transport's UnregisterRegion.
class TransportRegionState {
 public:
  virtual ~TransportRegionState() = default;
};

/// One registered range of this process's memory.
struct MemoryRegion {
  /// A transport's part of the registration.
  struct TransportEntry {
    std::string transport;             ///< the transport's name
    nlohmann::json descriptor_fields;  ///< merged into the buffer's descriptor entry
    std::shared_ptr<TransportRegionState> state;
    bool declined = false;  ///< the transport does not move this region
    std::string why_declined;
  };

  uint64_t start = 0;
  uint64_t length = 0;
  std::string location;  ///< Mooncake's location string as registered ("cpu:N", "cuda:0", "*", ...)
  MemoryKind kind;       ///< what the memory is (from the location, else the platform layer)
  bool remote_accessible = true;
  /// A file descriptor of this process that backs the range (a memfd, a file, a device), and the range's offset
  /// in it; -1 for anonymous memory. Transports that share memory by mapping it use this.
  /// For device memory the engine asks the owning platform for a dma-buf (Platform::ExportDmabuf, best effort:
  /// -1 when it cannot export one). That fd is the engine's: it is valid only during Transport::RegisterRegion
  /// and closed once every transport has registered (the stored region then says -1). A transport that needs
  /// the dma-buf later takes its own reference during RegisterRegion (ibv_reg_dmabuf_mr does; or dup it).
  int backing_fd = -1;
  uint64_t backing_offset = 0;
  /// For device memory: where the device sits (NUMA node, PCI bus id) as its platform reports it; unknown
  /// (-1 / empty) for host memory or when the platform cannot tell. Transports use it to prefer nearby NICs.
  DeviceLocality locality;
  std::vector<TransportEntry> transports;

  uint64_t end() const { return start + length; }
  /// The entry of `transport`, or null when it has none.
  const TransportEntry* transport(const std::string& name) const;
  bool declined_by(const std::string& name) const {
    const TransportEntry* e = transport(name);
    return e && e->declined;
  }
};

/// A reference that keeps a region registered: Unregister waits until no pin is held, so memory is never
/// unregistered (and freed by its owner) while a transfer still reads or writes it.
using RegionPin = std::shared_ptr<const MemoryRegion>;

/// The set of locally registered ranges. Thread-safe; lookups take a shared lock only.
class MemoryRegistry {
 public:
  MemoryRegistry();
  ~MemoryRegistry();

  /// kInvalidArgument for a null address, zero length or a wrapping range; kAddressOverlapped when
  /// [addr, addr+len) overlaps an existing registration.
  Status CheckRange(uint64_t addr, uint64_t length) const;
  /// Adds the region (checked as CheckRange).
  Status Register(MemoryRegion region);

  /// Removes the registration starting at `addr` (kAddressNotRegistered otherwise): new transfers are rejected
  /// at once and `on_withdrawn` runs (before waiting); then waits (up to `drain_timeout`) for transfers still
  /// using it. The removed region is returned through `removed` when not null.
  Status Unregister(uint64_t addr, std::chrono::milliseconds drain_timeout,
                    const std::function<void(const MemoryRegion&)>& on_withdrawn = nullptr,
                    MemoryRegion* removed = nullptr);

  /// The region wholly containing [addr, addr+len), or null. With `remote` set, only remote-accessible
  /// regions qualify.
  RegionPin Find(uint64_t addr, uint64_t length, bool remote) const;

  /// Snapshot in registration order.
  std::vector<MemoryRegion> List() const;
  size_t size() const;

  /// Counts unregistrations (moves on as a region is withdrawn): a caller that checked a range at
  /// generation g may keep using it without another lookup while generation() == g.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

 private:
  Status CheckRangeLocked(uint64_t addr, uint64_t length) const;

  mutable std::shared_mutex mu_;
  std::map<uint64_t, std::shared_ptr<MemoryRegion>> by_start_;
  std::vector<uint64_t> order_;  // registration order (starts)
  std::atomic<uint64_t> generation_{0};
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_MEMORY_REGISTRY_H_
