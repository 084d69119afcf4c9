#include "transfer_engine/transport/nvlink_intra/nvlink_intra_transport.h"

#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/transport/device_ipc/probe.h"

namespace mooncake::te::nvlink_intra {
namespace {

// Usable where a CUDA platform can be: the driver library loads, or the host emulation is switched on. Whether the
// engine's platform registry really has a usable CUDA platform is known only at Start (an inert transport then).
TransportProbe ProbeNvlinkIntra() {
  return device_ipc::ProbeRuntime("cuda", "host emulation of CUDA devices (MC_PLATFORM_EMULATION=1; not a GPU)",
                                  {"libcuda.so.1"}, "CUDA driver", "no CUDA driver");
}

}  // namespace

NvlinkIntraTransport::NvlinkIntraTransport()
    : DeviceIpcTransport(device_ipc::DeviceIpcSpec{"nvlink_intra", "MC_NVLINK_INTRA", MemoryType::kCuda, "CUDA",
                                                   /*remote_hosts=*/false, AllocationKind::kShareable}) {}

MC_TRANSPORT_PLUGIN("nvlink_intra", NvlinkIntraTransport, {"nvlink_intra"}, /*exclusive_env=*/"", ProbeNvlinkIntra);

}  // namespace mooncake::te::nvlink_intra
