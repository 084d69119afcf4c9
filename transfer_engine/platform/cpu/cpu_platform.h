#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_CPU_CPU_PLATFORM_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_CPU_CPU_PLATFORM_H_

#include <memory>

#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

/// The host platform ("cpu", memory type kHost), always usable:
/// - Classify: nullopt (host is what the registry answers when no device platform claims a pointer).
/// - Allocate: kPinnedHost only: page-aligned anonymous mmap, mlock'ed when RLIMIT_MEMLOCK allows (best effort:
///   an allocation that cannot be locked is still returned). kDevice/kShareable: kNotImplemented. `device`
///   is ignored. Free accepts only what Allocate returned, with the same length (kInvalidArgument otherwise).
/// - IPC: kNotImplemented (host memory is shared by the shm transport, not by the platform).
/// - CopyAsync: a memmove on the calling thread; the completion is already done. Both ranges must be mapped
///   (the engine checks registrations before copying); null pointers are kInvalidArgument. No streams: a
///   non-null `stream` is kInvalidArgument.
/// Thread-safe. The registry owns the instance it creates; more instances are independent.
std::shared_ptr<Platform> MakeCpuPlatform();

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_CPU_CPU_PLATFORM_H_
