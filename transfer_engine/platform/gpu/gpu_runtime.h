#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_GPU_RUNTIME_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_GPU_RUNTIME_H_

#include <cstddef>
#include <optional>
#include <string>

#include "transfer_engine/api/status.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::gpu {

/// What a vendor runtime found when it loaded.
struct RuntimeInfo {
  int device_count = 0;
  std::string summary;  ///< "HIP runtime 6.2 (libamdhip64.so.6)"
};

/// The vendor seam of GpuPlatform: the few calls of one accelerator runtime (HIP, MUSA, ACL, a test fake),
/// each a thin wrapper over a function resolved at run time. Errors carry the vendor's error name and text.
/// Opaque handles (streams, events) are void*. Calls other than Load are made only after Load succeeded, on
/// any thread, after SetDevice(d) on that thread for the device concerned; implementations must be
/// thread-safe to that extent (the vendor runtimes are).
class Runtime {
 public:
  virtual ~Runtime() = default;

  /// Loads the vendor library and initialises it; kDeviceNotFound with the exact reason when it cannot
  /// ("libamdhip64.so.*: not found (libamdhip64.so.7: cannot open shared object file: ...)"). Called once.
  virtual StatusOr<RuntimeInfo> Load() = 0;

  /// Makes `device` current on the calling thread.
  virtual Status SetDevice(int device) = 0;
  /// The kind of `ptr` as the runtime sees it: device memory (with its ordinal), the runtime's pinned host
  /// memory (host), or nullopt (unknown to it, or the runtime cannot tell).
  virtual std::optional<MemoryKind> PointerKind(const void* ptr) = 0;

  virtual StatusOr<void*> Malloc(size_t length) = 0;
  virtual Status Free(void* ptr) = 0;
  virtual StatusOr<void*> HostMalloc(size_t length) = 0;
  virtual Status HostFree(void* ptr) = 0;

  /// Whether the IPC calls below are implemented (else GpuPlatform answers kNotImplemented).
  virtual bool has_ipc() const = 0;
  /// The start and size of the device allocation containing `ptr`.
  virtual StatusOr<std::pair<void*, size_t>> AddressRange(const void* ptr) = 0;
  /// The runtime's IPC handle (raw bytes) of the allocation starting at `base`.
  virtual StatusOr<std::string> IpcGetHandle(void* base) = 0;
  /// Maps a handle of another process; the mapped allocation's start in this process.
  virtual StatusOr<void*> IpcOpen(const std::string& handle) = 0;
  virtual Status IpcClose(void* base) = 0;

  /// A new non-blocking stream on the current device.
  virtual StatusOr<void*> CreateStream() = 0;
  /// Releases a stream CreateStream made (GpuPlatform calls it only after the stream's work has completed).
  virtual Status DestroyStream(void* stream) = 0;
  /// An asynchronous copy on `stream`; `dst_device` / `src_device`: whether that side is device memory
  /// (runtimes without unified addressing need the direction).
  virtual Status MemcpyAsync(void* dst, const void* src, size_t length, bool dst_device, bool src_device,
                             void* stream) = 0;
  /// A new event recorded on `stream` (the caller destroys it with DestroyEvent).
  virtual StatusOr<void*> RecordEvent(void* stream) = 0;
  /// true: the event's work has finished; false: not yet; an error: it failed.
  virtual StatusOr<bool> QueryEvent(void* event) = 0;
  virtual Status SynchronizeEvent(void* event) = 0;
  virtual void DestroyEvent(void* event) = 0;
};

}  // namespace mooncake::te::gpu

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_GPU_RUNTIME_H_
