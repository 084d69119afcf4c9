#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_GPU_PLATFORM_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_GPU_PLATFORM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/platform/gpu/gpu_runtime.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::gpu {

/// A Platform on a vendor Runtime (the rocm, musa and ascend platforms derive from it with their runtime;
/// CUDA has its own, with VMM handles).
///
/// - Probe: Runtime::Load once; its verdict afterwards.
/// - Classify: Runtime::PointerKind, falling back to this platform's own allocations and imports when the
///   runtime cannot tell.
/// - Allocate: kPinnedHost = HostMalloc, kDevice = Malloc (on `device`, made current first); kShareable:
///   kNotImplemented (no VMM export in this seam yet). Free takes only what Allocate returned.
/// - IPC (when the runtime has it): ExportIpc gives the runtime handle of the allocation containing the range
///   plus the range's offset, as "mc-<name>-ipc:v1:<pid>:<device>:<offset>:<length>:<hex handle>"; ImportIpc
///   opens it once per allocation (reference-counted) into the handle's device ordinal (0 when this process
///   has fewer); a process cannot import its own handles.
/// - CopyAsync: on `stream` (the runtime's stream handle, of `device`; the caller's) or, when it is null, on a
///   per-device stream of the platform, completed through an event recorded on the same stream. `device` -1:
///   the device of whichever side is device memory, else 0; it is made current first. The runtime's null
///   (default) stream cannot be named: null means the platform's own.
/// - CreateStream: Runtime::CreateStream on `device` (made current first); DestroyStream records an event on the
///   stream and waits for it (some runtimes must not destroy a stream with work pending), then
///   Runtime::DestroyStream. Only streams this platform created are accepted (kInvalidArgument otherwise).
/// Thread-safe. Allocations and imports still held at destruction are not released (the vendor runtime may
/// already be shutting down at exit).
class GpuPlatform : public Platform {
 public:
  GpuPlatform(std::string name, MemoryType type, std::unique_ptr<Runtime> runtime);
  ~GpuPlatform() override;

  std::string name() const override { return name_; }
  MemoryType device_type() const override { return type_; }
  PlatformProbe Probe() override;
  std::optional<MemoryKind> Classify(const void* ptr) override;
  StatusOr<void*> Allocate(size_t length, AllocationKind kind, int device) override;
  Status Free(void* ptr, size_t length, AllocationKind kind) override;
  StatusOr<std::string> ExportIpc(void* ptr, size_t length) override;
  StatusOr<void*> ImportIpc(const std::string& handle, int owner_pid, size_t length) override;
  Status CloseIpc(void* mapped, size_t length) override;
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t length, int device,
                                                      void* stream) override;
  using Platform::CopyAsync;  // the form on the platform's own stream
  StatusOr<void*> CreateStream(int device) override;
  Status DestroyStream(void* stream) override;

 private:
  struct Allocation {
    AllocationKind kind;
    size_t length;
    int device;
  };
  struct Mapping {  // one opened IPC handle
    void* base;
    size_t size;
    int device;
    int refs;
  };
  struct Import {
    std::string key;
    size_t length;
    int refs;
  };

  Status Init();
  Status EnterDevice(int device);
  StatusOr<void*> Stream(int device);
  std::optional<MemoryKind> OwnKind(uintptr_t addr);
  std::string Prefix() const { return "mc-" + name_ + "-ipc:v1:"; }

  const std::string name_;
  const MemoryType type_;
  std::shared_ptr<Runtime> runtime_;  // shared with the completions, which may outlive the platform
  std::once_flag init_once_;
  PlatformProbe probe_;  // written once by Init

  std::mutex import_mu_;  // serialises ImportIpc / CloseIpc (taken before mu_)
  std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;
  std::vector<void*> streams_;  // per device, created on first use
  std::map<void*, int> created_streams_;  // CreateStream's, alive -> device
  std::map<std::string, Mapping> mappings_;  // "<pid>:<hex handle>" -> opened mapping
  std::map<uintptr_t, Import> imports_;      // address ImportIpc returned -> import
};

}  // namespace mooncake::te::gpu

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_GPU_PLATFORM_H_
