#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_DEVICE_IPC_CONFIG_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_DEVICE_IPC_CONFIG_H_

#include <cstddef>
#include <string>

#include "transfer_engine/transport/options.h"

namespace mooncake::te::device_ipc {

/// A device-IPC transport's settings: option "<transport>.<key>", else the variable <env_prefix>_<KEY>
/// (MC_NVLINK_INTRA_SLICE_SIZE, MC_HIP_STREAMS, ...), else the default. Plain value type.
struct DeviceIpcConfig {
  size_t slice_size = 16 << 20;  ///< slice_size / <P>_SLICE_SIZE: bytes per copy (4 KiB .. 1 GiB)
  /// max_mappings / <P>_MAX_MAPPINGS: peer buffers kept mapped (least recently used dropped first; 1 .. 2^20)
  size_t max_mappings = 1024;
  /// streams / <P>_STREAMS: copy streams per device (1 .. 64); each copy takes the least busy one, so unrelated
  /// transfers do not queue behind each other on one stream
  int streams = 4;

  static DeviceIpcConfig From(const TransportOptions& options, const std::string& env_prefix);
};

}  // namespace mooncake::te::device_ipc

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_DEVICE_IPC_CONFIG_H_
