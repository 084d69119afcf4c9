#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_SEGMENT_DESCRIPTOR_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_SEGMENT_DESCRIPTOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

struct BufferDescriptor {
  std::string name;  ///< the registration's location ("cpu:0", "cuda:0", "*")
  uint64_t addr = 0;
  uint64_t length = 0;
  /// The whole entry, transport fields included (e.g. rdma `rkey[]`, shm `shm_fd`); read them with Json*().
  nlohmann::json json = nlohmann::json::object();
};

/// Typed reads of fields any peer may have written: nullopt when absent or of another type (never throws).
std::optional<uint64_t> JsonUint(const nlohmann::json& j, const char* key);
std::optional<int64_t> JsonInt(const nlohmann::json& j, const char* key);
std::optional<std::string> JsonString(const nlohmann::json& j, const char* key);

/// What a segment publishes about itself (Mooncake's JSON shape, reference §1.6): `name`, `protocol`,
/// `buffers: [{name, addr, length, ...}]`, `timestamp`, the engine's `pid`, `pid_start`, `host_id`, `instance`,
/// plus transport-owned fields at the top level and in each buffer, kept in `json` (and BufferDescriptor::json)
/// for the transports to read and validate.
class SegmentDescriptor {
 public:
  std::string name;
  std::string protocol;
  std::vector<BufferDescriptor> buffers;  ///< registration order
  nlohmann::json json;                    ///< the whole document, transport fields included
  /// Set by the engine for a descriptor the application gave it (TransferEngine::DefineSegment), never for one
  /// fetched from the metadata service or a peer; transports may trust what such a descriptor names.
  bool defined_locally = false;

  /// Validates: an object with a non-empty name and protocol; each buffer with a name and non-zero addr and
  /// length; the engine's own fields of the right types ("corrupted segment descriptor" otherwise).
  /// kMalformedJson on any problem. Transport fields are the transports' to check.
  static StatusOr<SegmentDescriptor> Parse(std::string_view text);
  std::string Serialize() const;

  /// The buffer wholly containing [addr, addr+len), or null.
  const BufferDescriptor* FindBuffer(uint64_t addr, uint64_t len) const;
  /// The buffers that together cover [addr, addr+len) back to back (each starting where the one before ends),
  /// in address order, all of the same location (`name`); empty when there is no such run. A range inside one
  /// buffer gives that buffer alone.
  std::vector<const BufferDescriptor*> FindBufferRun(uint64_t addr, uint64_t len) const;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_SEGMENT_DESCRIPTOR_H_
