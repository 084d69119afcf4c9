#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_CONFIG_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_CONFIG_H_

#include <cstddef>

#include "transfer_engine/transport/options.h"

namespace mooncake::te::nvlink_intra {

/// nvlink_intra's settings: option "nvlink_intra.<key>", else the MC_* variable, else the default. Plain value type.
struct NvlinkIntraConfig {
  size_t slice_size = 16 << 20;  ///< slice_size / MC_NVLINK_INTRA_SLICE_SIZE: bytes per copy (4 KiB .. 1 GiB)
  /// max_mappings / MC_NVLINK_INTRA_MAX_MAPPINGS: peer buffers kept mapped (least recently used dropped first)
  size_t max_mappings = 1024;
  /// streams / MC_NVLINK_INTRA_STREAMS: copy streams per device (1 .. 64); each copy takes the least busy one, so
  /// unrelated transfers do not queue behind each other on one stream
  int streams = 4;

  static NvlinkIntraConfig From(const TransportOptions& options);
};

}  // namespace mooncake::te::nvlink_intra

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_CONFIG_H_
