#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_NVML_DOMAIN_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_NVML_DOMAIN_H_

#include <string>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te::nvlink {

/// The default NVML sonames, in the order tried.
std::vector<std::string> DefaultNvmlSonames();

/// The NVLink domain of the GPU at PCI address `pci_bus_id` ("0000:3b:00.0"), as NVML's fabric information says:
/// "<cluster uuid>:<clique id>" (the cluster UUID in 8-4-4-4-12 lower-case hex, the clique id in decimal), the
/// same text on every GPU that can reach this one over the NVLink fabric. CUDA's driver API has no such query.
/// NVML is resolved at run time: dlopen of the first of `sonames` that loads (RTLD_NOW | RTLD_LOCAL, kept loaded),
/// dlsym of nvmlInit_v2, nvmlShutdown, nvmlErrorString, nvmlDeviceGetHandleByPciBusId_v2 and
/// nvmlDeviceGetGpuFabricInfo; nothing links it. nvmlInit_v2 / nvmlShutdown bracket the query.
/// Errors say why there is no domain: kDeviceNotFound for no NVML (the first soname's dlerror) or a missing
/// symbol, kNotImplemented where the GPU is in no fabric (state NOT_SUPPORTED), its registration is not complete,
/// it reports a fabric error or no cluster UUID, kContext for an NVML call that fails (its nvmlErrorString).
/// Thread-safe.
StatusOr<std::string> NvlinkDomainFromNvml(const std::vector<std::string>& sonames, const std::string& pci_bus_id);

}  // namespace mooncake::te::nvlink

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_NVML_DOMAIN_H_
