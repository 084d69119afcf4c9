#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_ASCEND_ASCEND_PLATFORM_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_ASCEND_ASCEND_PLATFORM_H_

#include <memory>
#include <string>
#include <vector>

#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

/// The Ascend platform ("ascend", memory type kNpu): CANN's ACL runtime (libascendcl.so) loaded at run time
/// with declarations written here from Huawei's public API reference, behind gpu::GpuPlatform
/// (gpu_platform.h): aclrtMalloc / aclrtMallocHost, aclrtMemcpyAsync with the direction from classification,
/// aclrtCreateStream, events (aclrtQueryEventStatus, or aclrtQueryEvent on older CANN). Pointers are
/// classified with aclrtPointerGetAttributes where the runtime has it (CANN 8), else by this platform's own
/// allocations. No IPC: ExportIpc / ImportIpc answer kNotImplemented (Ascend memory is shared through HCCL /
/// HIXL, not through this layer).
/// Unusable reason without CANN: "libascendcl.so: not found (libascendcl.so: cannot open shared object file:
/// No such file or directory)". NEVER RUN on an Ascend NPU, not even compiled against CANN headers
/// (README.md).
std::shared_ptr<Platform> MakeAscendPlatform();
/// The same with other library names (tried in order) instead of libascendcl.so.
std::shared_ptr<Platform> MakeAscendPlatform(std::vector<std::string> sonames);

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_ASCEND_ASCEND_PLATFORM_H_
