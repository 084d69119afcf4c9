#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_IPC_CACHE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_IPC_CACHE_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "transfer_engine/api/status.h"
#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::device_ipc {

/// How a device-IPC transport maps a peer's handle: `import` maps `handle` exported by process `owner_pid`
/// (Platform::ImportIpc, or ImportFabric, which needs no pid), `close` undoes one import (CloseIpc /
/// CloseFabric). `what` names the transport in messages ("nvlink_intra"). Both must be thread-safe.
struct MappingOps {
  std::string what;
  std::function<StatusOr<void*>(const std::string& handle, int owner_pid, size_t length)> import;
  std::function<Status(void* mapped, size_t length)> close;
};

/// The platform's IPC handles (ExportIpc / ImportIpc / CloseIpc): same-host peers.
MappingOps IpcMappingOps(std::shared_ptr<Platform> platform, std::string what);

/// One peer buffer mapped into this process with MappingOps::import; unmapped (close) when the last holder
/// lets go, so a copy in flight keeps its mapping even after the cache forgot it.
class PeerMapping {
 public:
  PeerMapping(std::shared_ptr<const MappingOps> ops, char* base, size_t length)
      : ops_(std::move(ops)), base_(base), length_(length) {}
  ~PeerMapping();
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;

  char* base() const { return base_; }
  size_t length() const { return length_; }

 private:
  std::shared_ptr<const MappingOps> ops_;
  char* base_;
  size_t length_;
};

/// The peer buffers this process mapped, by (peer instance, buffer address): each is imported once and reused
/// until the handle the peer publishes for it changes (it re-registered), the buffer or the peer is forgotten (the
/// peer withdrew it, or its descriptor was refreshed), or it is evicted: at most `max_entries` mappings are kept,
/// and importing one more first drops the least recently used mapping that no copy holds. A mapping an in-flight
/// copy holds is never evicted (and never unmapped before the copy lets go), so while every cached mapping is in
/// use the cache may hold more than `max_entries` until those copies finish. Thread-safe.
class IpcCache {
 public:
  IpcCache(MappingOps ops, size_t max_entries)
      : ops_(std::make_shared<const MappingOps>(std::move(ops))), max_entries_(max_entries < 1 ? 1 : max_entries) {}

  /// The mapping of `buffer` (with its `shm_name` handle) of the peer `desc` (its `pid` owns the handle),
  /// importing it the first time. The descriptor is untrusted: a missing or malformed field is an error
  /// (kMalformedJson), as is a handle the platform refuses (its error).
  StatusOr<std::shared_ptr<PeerMapping>> Get(const SegmentDescriptor& desc, const BufferDescriptor& buffer);
  /// Forgets every mapping of segment `segment_name`; how many.
  size_t Forget(const std::string& segment_name);
  /// Forgets the mapping of the buffer at `buffer_addr` of peer instance `instance` (it was withdrawn).
  void ForgetBuffer(const std::string& instance, uint64_t buffer_addr);
  /// Mappings dropped to stay within max_entries.
  uint64_t evictions() const;
  void Clear();
  size_t size() const;
  /// Per segment: buffers mapped now, and imports made since creation (a reused mapping does not count).
  std::map<std::string, std::pair<size_t, uint64_t>> CountBySegment() const;

 private:
  struct Entry {
    std::string segment;
    std::string handle;
    uint64_t length;
    std::shared_ptr<PeerMapping> mapping;
    uint64_t last_use = 0;  // use_clock_ at the last Get that returned it
  };
  /// Drops the least recently used entry no copy holds; false when every entry is held. mu_ held.
  bool EvictOneLocked();

  std::shared_ptr<const MappingOps> ops_;
  const size_t max_entries_;
  mutable std::mutex mu_;
  uint64_t use_clock_ = 0;
  uint64_t evictions_ = 0;
  std::map<std::pair<std::string, uint64_t>, Entry> entries_;  // (peer instance, buffer address)
  std::map<std::string, uint64_t> imports_;  // by segment
};

}  // namespace mooncake::te::device_ipc

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_IPC_CACHE_H_
