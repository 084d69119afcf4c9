#include "transfer_engine/transport/device_ipc/device_ipc_config.h"

namespace mooncake::te::device_ipc {

DeviceIpcConfig DeviceIpcConfig::From(const TransportOptions& o, const std::string& p) {
  DeviceIpcConfig c;
  const std::string slice = p + "_SLICE_SIZE", mappings = p + "_MAX_MAPPINGS", streams = p + "_STREAMS";
  c.slice_size = static_cast<size_t>(o.Int("slice_size", slice.c_str(), c.slice_size, 4096, 1LL << 30));
  c.max_mappings = static_cast<size_t>(o.Int("max_mappings", mappings.c_str(), c.max_mappings, 1, 1 << 20));
  c.streams = static_cast<int>(o.Int("streams", streams.c_str(), c.streams, 1, 64));
  return c;
}

}  // namespace mooncake::te::device_ipc
