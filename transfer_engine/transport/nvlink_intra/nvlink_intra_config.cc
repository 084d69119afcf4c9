#include "transfer_engine/transport/nvlink_intra/nvlink_intra_config.h"

namespace mooncake::te::nvlink_intra {

NvlinkIntraConfig NvlinkIntraConfig::From(const TransportOptions& o) {
  NvlinkIntraConfig c;
  c.slice_size = static_cast<size_t>(o.Int("slice_size", "MC_NVLINK_INTRA_SLICE_SIZE", c.slice_size, 4096, 1LL << 30));
  return c;
}

}  // namespace mooncake::te::nvlink_intra
