#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_PROCESS_WATCH_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_PROCESS_WATCH_H_

#include <cstdint>
#include <memory>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

/// The start time of process `pid` in this PID namespace (field 22 of /proc/<pid>/stat: clock ticks after
/// boot); with the pid it names one process for the life of the host. 0 when it cannot be read (no such pid).
uint64_t ProcessStartTime(int pid);

/// Tells whether one process of this host (same PID namespace) has exited. Holds a pidfd where the kernel has
/// pidfd_open (Linux 5.3), which stays bound to that process even after its pid is reused; elsewhere it
/// compares the pid's start time (kill(pid, 0) and /proc/<pid>/stat) with the one it was opened with.
///
/// Threading: Exited() may be called concurrently; it never blocks.
class ProcessWatch {
 public:
  /// Watches `pid`, which must be the process that started at `start_time` (ProcessStartTime; 0: whichever
  /// process holds the pid now). kPeerUnreachable when no such process runs any more (exited, or its pid now
  /// belongs to another process). `use_pidfd` false: the start-time comparison only (what kernels without
  /// pidfd_open get).
  static StatusOr<std::unique_ptr<ProcessWatch>> Open(int pid, uint64_t start_time, bool use_pidfd = true);
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  /// Whether the process has exited (a zombie not yet reaped counts as exited).
  bool Exited() const;
  int pid() const { return pid_; }

 private:
  ProcessWatch(int pid, uint64_t start_time, int pidfd) : pid_(pid), start_time_(start_time), pidfd_(pidfd) {}
  int pid_;
  uint64_t start_time_;  // as read when opened (never 0 once opened)
  int pidfd_;            // -1: no pidfd_open here; start-time comparison instead
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_PROCESS_WATCH_H_
