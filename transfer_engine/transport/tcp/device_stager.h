#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_DEVICE_STAGER_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_DEVICE_STAGER_H_

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::tcp {

/// A pinned host buffer device memory is staged through. Returned to its stager's cache (or freed) when the last
/// reference goes; a reference keeps the buffer valid even after the stager is gone.
struct StagingBuffer {
  char* data = nullptr;
  size_t capacity = 0;
};
using StagingRef = std::shared_ptr<StagingBuffer>;

/// Moves device memory for the tcp transport through pinned host memory: buffers from the device's platform
/// (Allocate kPinnedHost), cached for reuse up to `cache_bytes`, and copies between them and device memory with
/// the platform's CopyAsync on its own stream. One thread (started with the first copy) waits for the copies in
/// the order they were started and then runs each one's continuation, so no I/O thread ever waits for a copy.
///
/// Thread-safe. A continuation runs on the stager's thread (or, when the copy cannot start or the stager has
/// stopped, at once on the caller's); it must not block for long and must not call Stop.
class DeviceStager {
 public:
  DeviceStager(PlatformRegistry* platforms, size_t cache_bytes);
  ~DeviceStager();  // Stop()
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  /// Whether memory of `kind` (a device kind) can be staged: a usable platform of its type is registered.
  bool CanStage(const MemoryKind& kind);

  /// A pinned buffer of at least `length` (> 0) bytes from `kind`'s platform; from the cache when one of the size
  /// class fits. kDeviceNotFound when no usable platform has that memory type; the platform's error otherwise.
  StatusOr<StagingRef> Acquire(const MemoryKind& kind, size_t length);

  /// Starts copying `length` bytes from `src` to `dst` (one side memory of `kind`, the other a staging buffer) and
  /// calls `done` with the copy's outcome once it has finished. The caller keeps both ranges alive until then (e.g.
  /// by capturing their references in `done`).
  void Copy(const MemoryKind& kind, void* dst, const void* src, size_t length, std::function<void(const Status&)> done);

  /// Waits for the copies already started, runs their continuations and ends the thread; later copies fail at once
  /// (kSocket, "shutting down"). Idempotent.
  void Stop();

  /// Whether the calling thread is a stager's (its continuations must not block either, e.g. on a connect).
  static bool OnStagerThread();

  /// {"copies", "copied_bytes", "copy_errors", "pinned_bytes" (allocated, cached or in use), "cached_bytes"}.
  nlohmann::json Stats() const;

 private:
  struct Cache;  // pinned buffers by (platform, size class); shared with the buffers' deleters
  struct Job {
    std::unique_ptr<CopyCompletion> completion;
    size_t length;
    std::function<void(const Status&)> done;
  };
  std::shared_ptr<Platform> PlatformFor(MemoryType type);
  void Run();

  PlatformRegistry* platforms_;
  std::shared_ptr<Cache> cache_;
  std::mutex mu_;  // guards the fields below
  std::array<std::shared_ptr<Platform>, 8> by_type_{};  // resolved platforms, by MemoryType
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::thread thread_;
  std::atomic<uint64_t> copies_{0}, copied_bytes_{0}, copy_errors_{0};
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_DEVICE_STAGER_H_
