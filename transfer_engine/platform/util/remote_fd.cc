#include "transfer_engine/platform/util/remote_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace mooncake::te::platform_util {

StatusOr<int> DuplicateRemoteFd(int pid, int fd, const std::string& what) {
  const std::string owner = "process " + std::to_string(pid);
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0 && errno == ESRCH) return Status(ErrorCode::kNotFound, what + ": the owner " + owner + " is gone");
  if (pidfd >= 0) {
    int local = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    const int err = errno;
    close(pidfd);
    if (local >= 0) return local;
    if (err == EBADF) {
      return Status(ErrorCode::kNotFound, what + ": " + owner + " has no fd " + std::to_string(fd) +
                                              " (the memory was freed?)");
    }
    // EPERM (ptrace rules, seccomp) or ENOSYS: /proc checks read access only.
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int local = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (local >= 0) return local;
  if (errno == ENOENT) {
    return Status(ErrorCode::kNotFound, what + ": " + path + " does not exist (owner gone or memory freed)");
  }
  return Status(ErrorCode::kInvalidArgument,
                what + ": cannot open " + path + " (needs the owner's user or root): " + strerror(errno));
}

std::string FdTarget(int fd) {
  char link[512];
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = readlink(self.c_str(), link, sizeof(link) - 1);
  if (n < 0) return "";
  return std::string(link, static_cast<size_t>(n));
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace mooncake::te::platform_util
