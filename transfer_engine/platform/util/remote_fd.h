#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_REMOTE_FD_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_REMOTE_FD_H_

#include <cstddef>
#include <string>

#include "transfer_engine/api/status.h"

namespace mooncake::te::platform_util {

/// A duplicate (O_CLOEXEC, owned by the caller) of file descriptor `fd` of process `pid` on this host:
/// pidfd_getfd, else open("/proc/<pid>/fd/<fd>") (which needs only read access to the process: same user or
/// root). Errors: kNotFound when the process is gone or has no such fd; kInvalidArgument when not allowed.
/// `what` names the descriptor in messages ("host_emulation", "cuda").
StatusOr<int> DuplicateRemoteFd(int pid, int fd, const std::string& what);

/// What /proc/self/fd/<fd> links to ("/memfd:name (deleted)", "pipe:[123]"); empty when unreadable.
std::string FdTarget(int fd);

size_t PageSize();
inline size_t RoundUp(size_t n, size_t align) { return (n + align - 1) / align * align; }

}  // namespace mooncake::te::platform_util

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_REMOTE_FD_H_
