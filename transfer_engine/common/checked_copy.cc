#include "transfer_engine/common/checked_copy.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "transfer_engine/common/format.h"

namespace mooncake::te {
namespace {

std::atomic<bool> g_cross_memory_ok{true};  // false once the kernel or a sandbox refused process_vm_writev

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::string Where(const void* addr, size_t len) { return Range(reinterpret_cast<uint64_t>(addr), len); }

// Bytes copied (> 0), 0 when the kernel copied nothing (fault at the first byte), -1 with errno otherwise.
ssize_t CrossMemoryCopy(char* dst, const char* src, size_t len) {
  iovec local{const_cast<char*>(src), len};
  iovec remote{dst, len};
  ssize_t n = process_vm_writev(getpid(), &local, 1, &remote, 1, 0);
  if (n < 0 && errno == EFAULT) return 0;
  return n;
}

// The same through a pipe: write() reads src and read() writes dst, each failing with EFAULT on a bad page.
// Chunks never cross a page of either side (at most one page: below any pipe's capacity, so a write never
// blocks), so a fault stops the copy exactly at the first bad page.
ssize_t PipeCopy(char* dst, const char* src, size_t len) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  const size_t page = PageSize();
  size_t done = 0;
  while (done < len) {
    size_t chunk = std::min({len - done, page - reinterpret_cast<uintptr_t>(src + done) % page,
                             page - reinterpret_cast<uintptr_t>(dst + done) % page});
    ssize_t w = write(p[1], src + done, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    size_t got = 0;
    while (got < static_cast<size_t>(w)) {
      ssize_t r = read(p[0], dst + done + got, static_cast<size_t>(w) - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    done += got;
    if (got < static_cast<size_t>(w)) break;
  }
  close(p[0]);
  close(p[1]);
  return static_cast<ssize_t>(done);
}

}  // namespace

void checked_copy_internal::ForcePipeCopy(bool on) { g_cross_memory_ok.store(!on); }

Status CheckMapped(const void* addr, size_t len, const char* what) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  if (len == 0) return Status::Ok();
  if (a + len < a) return InvalidArgument(std::string(what) + " range " + Where(addr, len) + " wraps around");
  uintptr_t start = a & ~(PageSize() - 1);
  // msync checks that every page of the range is mapped (ENOMEM otherwise) and, with MS_ASYNC, does nothing.
  if (msync(reinterpret_cast<void*>(start), a + len - start, MS_ASYNC) != 0) {
    return InvalidArgument(std::string(what) + " range " + Where(addr, len) + " is not mapped in this process" +
                           (errno == ENOMEM ? "" : std::string(" (") + strerror(errno) + ")"));
  }
  return Status::Ok();
}

Status CheckedCopy(void* dst, const void* src, size_t len) {
  if (len == 0) return Status::Ok();
  MC_RETURN_IF_ERROR(CheckMapped(src, len, "source"));
  MC_RETURN_IF_ERROR(CheckMapped(dst, len, "destination"));
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  size_t done = 0;
  while (done < len) {
    ssize_t n = -1;
    if (g_cross_memory_ok.load(std::memory_order_relaxed)) {
      n = CrossMemoryCopy(d + done, s + done, len - done);
      if (n < 0 && (errno == ENOSYS || errno == EPERM)) {
        g_cross_memory_ok.store(false, std::memory_order_relaxed);
        continue;
      }
      // process_vm_writev cannot pin VM_IO / VM_PFNMAP pages (device memory mapped into this process) and
      // reports EFAULT for them although they are accessible: the pipe copies through them.
      if (n == 0) n = PipeCopy(d + done, s + done, len - done);
    } else {
      n = PipeCopy(d + done, s + done, len - done);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status(ErrorCode::kMemory, std::string("copy failed: ") + strerror(errno));
    if (n == 0) {
      // Nothing more could be copied: say which side is at fault (mapped but protected, or unmapped meanwhile).
      MC_RETURN_IF_ERROR(CheckMapped(s + done, 1, "source"));
      MC_RETURN_IF_ERROR(CheckMapped(d + done, 1, "destination"));
      char probe;  // which side is protected: can the source byte be read at all?
      bool readable = g_cross_memory_ok.load() ? CrossMemoryCopy(&probe, s + done, 1) == 1
                                               : PipeCopy(&probe, s + done, 1) == 1;
      std::string bad = readable ? "destination " + Hex(reinterpret_cast<uint64_t>(d + done)) + " is not writable"
                                 : "source " + Hex(reinterpret_cast<uint64_t>(s + done)) + " is not readable";
      return InvalidArgument("cannot copy " + Where(src, len) + " to " + Where(dst, len) + ": " + bad +
                             " (protected mapping); " + std::to_string(done) + " bytes were copied before it");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace mooncake::te
