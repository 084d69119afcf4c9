#include "transfer_engine/platform/cpu/cpu_platform.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "transfer_engine/common/format.h"

namespace mooncake::te {
namespace {

size_t RoundUpToPage(size_t n) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

class DoneCompletion final : public CopyCompletion {
 public:
  bool Done() override { return true; }
  Status Wait() override { return Status::Ok(); }
};

class CpuPlatform final : public Platform {
 public:
  std::string name() const override { return "cpu"; }
  MemoryType device_type() const override { return MemoryType::kHost; }

  PlatformProbe Probe() override {
    PlatformProbe p;
    p.usable = true;
    p.reason = "host memory";
    return p;
  }

  std::optional<MemoryKind> Classify(const void*) override { return std::nullopt; }

  StatusOr<void*> Allocate(size_t length, AllocationKind kind, int /*device*/) override {
    if (kind != AllocationKind::kPinnedHost) {
      return Status(ErrorCode::kNotImplemented, "cpu platform: only pinned host memory can be allocated");
    }
    if (length == 0) return InvalidArgument("cpu platform: cannot allocate 0 bytes");
    const size_t mapped = RoundUpToPage(length);
    if (mapped < length) return InvalidArgument("cpu platform: length " + std::to_string(length) + " too large");
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return Status(ErrorCode::kMemory, "cpu platform: mmap of " + std::to_string(mapped) +
                                            " bytes failed: " + strerror(errno));
    }
    (void)mlock(p, mapped);  // best effort: RLIMIT_MEMLOCK is often small for unprivileged processes
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[p] = length;
    return p;
  }

  Status Free(void* ptr, size_t length, AllocationKind kind) override {
    if (kind != AllocationKind::kPinnedHost) {
      return Status(ErrorCode::kNotImplemented, "cpu platform: only pinned host memory can be freed");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = allocations_.find(ptr);
      if (it == allocations_.end()) {
        return InvalidArgument("cpu platform: " + Hex(reinterpret_cast<uintptr_t>(ptr)) +
                               " was not allocated by this platform");
      }
      if (it->second != length) {
        return InvalidArgument("cpu platform: free of " + Hex(reinterpret_cast<uintptr_t>(ptr)) + " with length " +
                               std::to_string(length) + ", allocated with " + std::to_string(it->second));
      }
      allocations_.erase(it);
    }
    munmap(ptr, RoundUpToPage(length));  // also drops the lock
    return Status::Ok();
  }

  StatusOr<std::string> ExportIpc(void*, size_t) override { return NoIpc(); }
  StatusOr<void*> ImportIpc(const std::string&, int, size_t) override { return NoIpc(); }
  Status CloseIpc(void*, size_t) override { return NoIpc(); }

  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t length, int /*device*/,
                                                      void* stream) override {
    if (stream != nullptr) {
      return InvalidArgument("cpu platform: no streams (copies run on the calling thread); the stream must be null");
    }
    if (length > 0 && (dst == nullptr || src == nullptr)) {
      return InvalidArgument("cpu platform: copy of " + std::to_string(length) + " bytes with a null address");
    }
    if (length > 0) memmove(dst, src, length);
    return std::unique_ptr<CopyCompletion>(new DoneCompletion());
  }

 private:
  static Status NoIpc() {
    return Status(ErrorCode::kNotImplemented,
                  "cpu platform has no IPC handles (host memory is shared by the shm transport)");
  }

  std::mutex mu_;
  std::map<void*, size_t> allocations_;  // address -> length asked for
};

}  // namespace

std::shared_ptr<Platform> MakeCpuPlatform() { return std::make_shared<CpuPlatform>(); }

}  // namespace mooncake::te
