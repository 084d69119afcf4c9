#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_MUSA_MUSA_PLATFORM_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_MUSA_MUSA_PLATFORM_H_

#include <memory>
#include <string>
#include <vector>

#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

/// The MUSA platform ("musa", memory type kMusa, Moore Threads GPUs): the MUSA driver API (libmusa.so.1, which
/// mirrors CUDA's driver API: muInit, muMemAlloc, muPointerGetAttribute, muIpc*, muMemcpyAsync, streams and
/// events) loaded at run time with declarations written here from its public API, behind gpu::GpuPlatform
/// (gpu_platform.h). Entry points CUDA versions with a _v2 suffix are looked up as <name>_v2, then <name>.
/// Unusable reason without MUSA: "libmusa.so.*: not found (libmusa.so.1: cannot open shared object file: No
/// such file or directory)". NEVER RUN on a MUSA GPU, not even compiled against MUSA headers (README.md).
std::shared_ptr<Platform> MakeMusaPlatform();
/// The same with other library names (tried in order) instead of libmusa.so.1, libmusa.so.
std::shared_ptr<Platform> MakeMusaPlatform(std::vector<std::string> sonames);

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_MUSA_MUSA_PLATFORM_H_
