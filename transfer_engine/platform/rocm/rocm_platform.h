#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_ROCM_ROCM_PLATFORM_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_ROCM_ROCM_PLATFORM_H_

#include <memory>
#include <string>
#include <vector>

#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

/// The ROCm platform ("rocm", memory type kRocm): the HIP runtime (libamdhip64) loaded at run time, with the
/// few declarations it needs written here (no HIP headers), behind gpu::GpuPlatform (see gpu_platform.h for
/// the behaviour: hipMalloc / hipHostMalloc, hipIpcGetMemHandle / hipIpcOpenMemHandle handles, hipMemcpyAsync
/// with hipMemcpyDefault on a per-device stream, events for completion). Pointer classification reads
/// hipPointerGetAttributes with the memory-type numbering of the loaded runtime (it changed in ROCm 6).
/// Unusable reason without ROCm: "libamdhip64.so.*: not found (libamdhip64.so.7: cannot open shared object
/// file: No such file or directory)". Compiled and probed here only; never run on an AMD GPU (README.md).
std::shared_ptr<Platform> MakeRocmPlatform();
/// The same with other library names (tried in order) instead of libamdhip64.so.7, .6, .5, libamdhip64.so.
std::shared_ptr<Platform> MakeRocmPlatform(std::vector<std::string> sonames);

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_ROCM_ROCM_PLATFORM_H_
