#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_SEGMENT_DESCRIPTOR_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_SEGMENT_DESCRIPTOR_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

struct BufferDescriptor {
  std::string name;  ///< the registration's location ("cpu:0", "*")
  uint64_t addr = 0;
  uint64_t length = 0;
  int shm_fd = -1;  ///< memfd of the owning process backing this buffer (-1: none), for same-host mapping
  uint64_t shm_offset = 0;
};

/// What a segment publishes about itself (Mooncake's JSON shape, reference §1.6): `name`, `protocol`,
/// `buffers: [{name, addr, length}]`, `timestamp`, plus transport-owned fields (e.g. `tcp_data_port`), which
/// are kept in `json` for the transports to read.
class SegmentDescriptor {
 public:
  std::string name;
  std::string protocol;
  std::vector<BufferDescriptor> buffers;  ///< registration order
  nlohmann::json json;                    ///< the whole document, transport fields included

  /// Validates: an object with a non-empty name and protocol; each buffer with a name and non-zero addr and
  /// length ("Corrupted segment descriptor" otherwise). kMalformedJson on any problem.
  static StatusOr<SegmentDescriptor> Parse(std::string_view text);
  std::string Serialize() const;

  /// The buffer wholly containing [addr, addr+len), or null.
  const BufferDescriptor* FindBuffer(uint64_t addr, uint64_t len) const;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_SEGMENT_DESCRIPTOR_H_
