#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_HIP_HIP_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_HIP_HIP_TRANSPORT_H_

#include "transfer_engine/transport/device_ipc/device_ipc_transport.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::hip {

/// Same-host ROCm device-to-device transfers (Mooncake's `hip`): a DeviceIpcTransport
/// (device_ipc/device_ipc_transport.h) for MemoryType::kRocm with the default hooks, on the rocm platform's IPC
/// (hipIpcGetMemHandle / hipIpcOpenMemHandle, resolved at run time by platform/rocm; on the host emulation with
/// MC_PLATFORM_EMULATION_DEVICE=rocm its memfd). Peers of this host_id only; epochs in a memfd read through /proc.
/// Descriptor fields: `shm_name` (handle hex), `hip_platform`, `hip_epoch_fd`, per buffer `hip_epoch_slot` /
/// `hip_epoch`. Settings MC_HIP_SLICE_SIZE, MC_HIP_MAX_MAPPINGS, MC_HIP_STREAMS (hip.<key> options).
/// allocate_managed_buffer gives AllocationKind::kDevice (hipMalloc memory: hipIpc-exportable).
class HipTransport final : public device_ipc::DeviceIpcTransport {
 public:
  HipTransport();
};

/// The plugin's probe: usable when a HIP runtime loads (libamdhip64.so.7, .6, .5, libamdhip64.so) or the host
/// emulation presents ROCm devices (MC_PLATFORM_EMULATION=1 and MC_PLATFORM_EMULATION_DEVICE=rocm); otherwise
/// unusable, "no ROCm runtime: <why>".
TransportProbe ProbeHip();

}  // namespace mooncake::te::hip

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_HIP_HIP_TRANSPORT_H_
