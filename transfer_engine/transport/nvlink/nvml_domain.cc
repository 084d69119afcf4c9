#include "transfer_engine/transport/nvlink/nvml_domain.h"

#include <cstdio>

#include "transfer_engine/platform/gpu/dl_library.h"

namespace mooncake::te::nvlink {
namespace {

// NVML's types and constants as its API reference documents them (no nvml.h is needed to build).
using NvmlReturn = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
using NvmlDevice = void*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned char kFabricStateNotSupported = 0;  // NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
constexpr unsigned char kFabricStateCompleted = 3;     // NVML_GPU_FABRIC_STATE_COMPLETED

struct NvmlGpuFabricInfo {  // nvmlGpuFabricInfo_t (the unversioned form nvmlDeviceGetGpuFabricInfo fills)
  unsigned char cluster_uuid[16];
  NvmlReturn status;        // meaningful once state is COMPLETED
  unsigned int clique_id;
  unsigned char state;      // nvmlGpuFabricState_t
};

struct Nvml {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*fabric_info)(NvmlDevice, NvmlGpuFabricInfo*) = nullptr;

  std::string Error(NvmlReturn r) const {
    const char* text = error_string != nullptr ? error_string(r) : nullptr;
    return "NVML error " + std::to_string(r) + (text != nullptr ? std::string(" (") + text + ")" : "");
  }
};

std::string Uuid(const unsigned char (&b)[16]) {
  char out[37];
  snprintf(out, sizeof(out), "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
           b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

}  // namespace

std::vector<std::string> DefaultNvmlSonames() { return {"libnvidia-ml.so.1", "libnvidia-ml.so"}; }

StatusOr<std::string> NvlinkDomainFromNvml(const std::vector<std::string>& sonames, const std::string& pci_bus_id) {
  if (sonames.empty()) return Status(ErrorCode::kDeviceNotFound, "no NVML library to try");
  // Kept loaded (DlLibrary never closes): NVML may hold threads of its own; loading twice returns the same handle.
  auto lib = gpu::DlLibrary::Open(sonames, "libnvidia-ml.so.*");
  if (!lib.ok()) return Status(ErrorCode::kDeviceNotFound, "no NVML: " + lib.status().message());
  Nvml n;
  std::string missing;
  lib->Require(&n.init, {"nvmlInit_v2"}, &missing);
  lib->Require(&n.shutdown, {"nvmlShutdown"}, &missing);
  lib->Require(&n.error_string, {"nvmlErrorString"}, &missing);
  lib->Require(&n.by_pci_bus_id, {"nvmlDeviceGetHandleByPciBusId_v2"}, &missing);
  lib->Require(&n.fabric_info, {"nvmlDeviceGetGpuFabricInfo"}, &missing);
  if (!missing.empty()) {
    return Status(ErrorCode::kDeviceNotFound,
                  lib->soname() + " has no " + missing + " (an NVML without GPU fabric information)");
  }
  if (NvmlReturn r = n.init(); r != kNvmlSuccess) {
    return Status(ErrorCode::kContext, "nvmlInit_v2 failed: " + n.Error(r));
  }
  NvmlDevice device = nullptr;
  NvmlGpuFabricInfo info{};
  NvmlReturn r = n.by_pci_bus_id(pci_bus_id.c_str(), &device);
  std::string failed = r != kNvmlSuccess ? "nvmlDeviceGetHandleByPciBusId_v2(" + pci_bus_id + ")" : "";
  if (failed.empty()) {
    r = n.fabric_info(device, &info);
    if (r != kNvmlSuccess) failed = "nvmlDeviceGetGpuFabricInfo(" + pci_bus_id + ")";
  }
  n.shutdown();
  if (!failed.empty()) return Status(ErrorCode::kContext, failed + " failed: " + n.Error(r));
  const std::string gpu = "GPU " + pci_bus_id;
  if (info.state == kFabricStateNotSupported) {
    return Status(ErrorCode::kNotImplemented, gpu + " is in no NVLink fabric (NVML fabric state NOT_SUPPORTED)");
  }
  if (info.state != kFabricStateCompleted) {
    return Status(ErrorCode::kNotImplemented, gpu + "'s fabric registration is not complete (NVML fabric state " +
                                                  std::to_string(info.state) + ")");
  }
  if (info.status != kNvmlSuccess) {
    return Status(ErrorCode::kNotImplemented, gpu + "'s fabric registration failed: " + n.Error(info.status));
  }
  bool any = false;
  for (unsigned char b : info.cluster_uuid) any = any || b != 0;
  if (!any) return Status(ErrorCode::kNotImplemented, gpu + " reports no fabric cluster UUID");
  return Uuid(info.cluster_uuid) + ":" + std::to_string(info.clique_id);
}

}  // namespace mooncake::te::nvlink
