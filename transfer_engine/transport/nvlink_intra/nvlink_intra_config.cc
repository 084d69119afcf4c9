#include "transfer_engine/transport/nvlink_intra/nvlink_intra_config.h"

namespace mooncake::te::nvlink_intra {

NvlinkIntraConfig NvlinkIntraConfig::From(const TransportOptions& o) {
  NvlinkIntraConfig c;
  c.slice_size = static_cast<size_t>(o.Int("slice_size", "MC_NVLINK_INTRA_SLICE_SIZE", c.slice_size, 4096, 1LL << 30));
  c.max_mappings =
      static_cast<size_t>(o.Int("max_mappings", "MC_NVLINK_INTRA_MAX_MAPPINGS", c.max_mappings, 1, 1 << 20));
  c.streams = static_cast<int>(o.Int("streams", "MC_NVLINK_INTRA_STREAMS", c.streams, 1, 64));
  return c;
}

}  // namespace mooncake::te::nvlink_intra
