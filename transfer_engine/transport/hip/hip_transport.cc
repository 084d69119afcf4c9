#include "transfer_engine/transport/hip/hip_transport.h"

#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/transport/device_ipc/probe.h"

namespace mooncake::te::hip {
TransportProbe ProbeHip() {
  return device_ipc::ProbeRuntime(
      "rocm", "host emulation of ROCm devices (MC_PLATFORM_EMULATION=1, MC_PLATFORM_EMULATION_DEVICE=rocm; not a GPU)",
      {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"}, "HIP runtime",
      "no ROCm runtime");
}

HipTransport::HipTransport()
    : DeviceIpcTransport(device_ipc::DeviceIpcSpec{"hip", "MC_HIP", MemoryType::kRocm, "ROCm",
                                                   /*remote_hosts=*/false, AllocationKind::kDevice}) {}

MC_TRANSPORT_PLUGIN("hip", HipTransport, {"hip"}, /*exclusive_env=*/"", ProbeHip);

}  // namespace mooncake::te::hip
