#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_SHM_NAMES_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_SHM_NAMES_H_

#include <string>

namespace mooncake::te {

/// Names of /dev/shm files a process creates and should not outlive it: "<prefix><pidns>-<pid>-<rest>", where
/// <pidns> is the inode of the creator's PID namespace. A process killed without cleanup leaves its files (RAM
/// in tmpfs); a later process of the same PID namespace can tell they are stale (their pid is gone) and remove
/// them, while files of other PID namespaces sharing /dev/shm (containers, sandboxes), whose pids it cannot
/// see, are never touched.

/// "<pidns>-<pid>" of this process (pidns 0 when /proc/self/ns/pid cannot be read).
std::string ShmOwnerTag();

/// Removes the files /dev/shm/<prefix><pidns>-<pid>-* of this process's PID namespace whose pid no longer
/// exists (kill(pid, 0) fails with ESRCH). A pid reused by a live process keeps its files (left, not lost).
/// `dir` is for tests. Returns how many were removed; errors are ignored (best effort, never fatal).
int RemoveStaleShmFiles(const std::string& prefix, const std::string& dir = "/dev/shm");

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_SHM_NAMES_H_
