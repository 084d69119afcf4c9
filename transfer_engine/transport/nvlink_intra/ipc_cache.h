#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_IPC_CACHE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_IPC_CACHE_H_

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "transfer_engine/api/status.h"
#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::nvlink_intra {

/// One peer buffer mapped into this process with Platform::ImportIpc; unmapped (CloseIpc) when the last holder
/// lets go, so a copy in flight keeps its mapping even after the cache forgot it.
class PeerMapping {
 public:
  PeerMapping(std::shared_ptr<Platform> platform, char* base, size_t length)
      : platform_(std::move(platform)), base_(base), length_(length) {}
  ~PeerMapping();
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;

  char* base() const { return base_; }
  size_t length() const { return length_; }

 private:
  std::shared_ptr<Platform> platform_;
  char* base_;
  size_t length_;
};

/// The peer buffers this process mapped, by (peer instance, buffer address): each is imported once and reused
/// until the handle the peer publishes for it changes (it re-registered) or the peer is forgotten (its descriptor
/// was refreshed, e.g. after it unregistered memory). Thread-safe.
class IpcCache {
 public:
  explicit IpcCache(std::shared_ptr<Platform> platform) : platform_(std::move(platform)) {}

  /// The mapping of `buffer` (with its `shm_name` handle) of the peer `desc` (its `pid` owns the handle),
  /// importing it the first time. The descriptor is untrusted: a missing or malformed field is an error
  /// (kMalformedJson), as is a handle the platform refuses (its error).
  StatusOr<std::shared_ptr<PeerMapping>> Get(const SegmentDescriptor& desc, const BufferDescriptor& buffer);
  /// Forgets every mapping of segment `segment_name`; how many.
  size_t Forget(const std::string& segment_name);
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
  };
  std::shared_ptr<Platform> platform_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, uint64_t>, Entry> entries_;  // (peer instance, buffer address)
  std::map<std::string, uint64_t> imports_;  // by segment
};

}  // namespace mooncake::te::nvlink_intra

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_IPC_CACHE_H_
