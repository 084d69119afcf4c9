#include "transfer_engine/common/process_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace mooncake::te {
namespace {

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture
#endif

struct StatFields {
  char state = 0;
  uint64_t start_time = 0;
};

// State (field 3) and start time (field 22) of /proc/<pid>/stat; start_time 0 when unreadable.
StatFields ReadStat(int pid) {
  StatFields out;
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return out;
  buf[n] = '\0';
  std::string text(buf, static_cast<size_t>(n));
  size_t paren = text.rfind(')');  // the command name (field 2) may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= text.size()) return out;
  const char* p = text.c_str() + paren + 2;
  out.state = *p;
  for (int field = 3; field < 22 && *p; ++field) {  // p is at `field`: skip to the next one
    while (*p && *p != ' ') ++p;
    while (*p == ' ') ++p;
  }
  if (*p) out.start_time = strtoull(p, nullptr, 10);
  return out;
}

bool Gone(const StatFields& st, uint64_t start_time) {
  return st.start_time == 0 || st.start_time != start_time || st.state == 'Z' || st.state == 'X';
}

}  // namespace

uint64_t ProcessStartTime(int pid) { return pid > 0 ? ReadStat(pid).start_time : 0; }

StatusOr<std::unique_ptr<ProcessWatch>> ProcessWatch::Open(int pid, uint64_t start_time, bool use_pidfd) {
  auto gone = [pid](const std::string& why) {
    return Status(ErrorCode::kPeerUnreachable, "process " + std::to_string(pid) + " " + why);
  };
  if (pid <= 0) return gone("is not a valid pid");
  // The pidfd first, then the start time: a pidfd opened on a reused pid shows up as a start-time mismatch.
  int pidfd = use_pidfd ? static_cast<int>(syscall(SYS_pidfd_open, pid, 0)) : -1;
  if (use_pidfd && pidfd < 0 && errno == ESRCH) return gone("has exited");
  StatFields st = ReadStat(pid);
  uint64_t expected = start_time != 0 ? start_time : st.start_time;
  if (Gone(st, expected)) {
    if (pidfd >= 0) close(pidfd);
    return gone(st.start_time != 0 && st.start_time != expected ? "has exited (its pid now belongs to another process)"
                                                                 : "has exited");
  }
  std::unique_ptr<ProcessWatch> w(new ProcessWatch(pid, expected, pidfd < 0 ? -1 : pidfd));
  if (w->Exited()) return gone("has exited");
  return w;
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) close(pidfd_);
}

bool ProcessWatch::Exited() const {
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    int n;
    do n = poll(&p, 1, 0);
    while (n < 0 && errno == EINTR);
    return n > 0;  // readable once the process has exited
  }
  if (kill(pid_, 0) != 0 && errno == ESRCH) return true;
  return Gone(ReadStat(pid_), start_time_);
}

}  // namespace mooncake::te
