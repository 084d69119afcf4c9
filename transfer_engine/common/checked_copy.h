#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_CHECKED_COPY_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_CHECKED_COPY_H_

#include <cstddef>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

/// Copies `len` bytes from `src` to `dst`, both addresses of this process, without ever faulting: a range
/// that is not mapped, not readable (src) or not writable (dst: read-only or PROT_NONE) is a kInvalidArgument
/// error naming the address, never a SIGSEGV/SIGBUS. Works on any mapping of the process, registered or not.
///
/// The copy goes through the kernel (process_vm_writev on this process, or a pipe where a sandbox forbids
/// that), so a bad address is reported by the system call instead of trapping. Both ranges are first checked
/// to be mapped in full, so an unmapped destination is never partly written; a destination that is mapped but
/// protected part-way may have its writable prefix written (the error says how many bytes).
///
/// Threading: thread-safe; blocks only for the copy itself. Another thread unmapping the range meanwhile
/// yields an error, not a crash.
Status CheckedCopy(void* dst, const void* src, size_t len);

/// Whether [addr, addr + len) is mapped in full (any protection); ok or kInvalidArgument naming the range.
Status CheckMapped(const void* addr, size_t len, const char* what);

namespace checked_copy_internal {
/// Tests only: use the pipe fallback (as when process_vm_writev is refused) or go back to detecting it.
void ForcePipeCopy(bool on);
}  // namespace checked_copy_internal

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_CHECKED_COPY_H_
