#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_STREAM_POOL_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_STREAM_POOL_H_

#include <cstddef>
#include <memory>

#include "transfer_engine/api/status.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

/// A few streams per device of one platform, for copies that need not be ordered with each other (a transport's
/// unrelated transfers): each copy goes to the stream of its device with the fewest copies in flight (ties taken
/// in turn), so independent copies run concurrently instead of queuing on the platform's one stream.
///
/// - Streams: `per_device` (>= 1) per device, all created by Prepare(device), or by the first copy on the device
///   when nobody prepared it, on the calling thread (Platform::CreateStream). A platform without streams
///   (kNotImplemented), a failed creation (logged once per device) or `device` -1 uses the platform's own stream
///   (CopyAsync's null stream): copies still work, only without the concurrency.
/// - In flight: a copy counts against its stream from CopyAsync until its completion first reports it finished
///   (Done true, or Wait returned) or is dropped.
/// - Lifetime: the completions handed out share the pool's streams; they are destroyed (Platform::DestroyStream,
///   which lets enqueued work finish) once the pool and every such completion are gone, on the thread that drops
///   the last of them.
/// Thread-safe.
class StreamPool {
 public:
  StreamPool(std::shared_ptr<Platform> platform, int per_device);
  ~StreamPool();
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  /// Creates `device`'s streams unless that was done (or tried) before. The streams made: `per_device`, or 0
  /// when the device uses the platform's own stream (no streams, or creation failed: the error is returned, once).
  StatusOr<size_t> Prepare(int device);

  /// Platform::CopyAsync on `device`'s least busy stream (Prepare first when needed). `device` -1: the platform's
  /// own stream. Errors are the platform's.
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t length, int device);

  int per_device() const { return per_device_; }
  /// Streams created now (all devices).
  size_t streams() const;
  /// Copies in flight now (all devices, own stream included).
  size_t in_flight() const;

  struct State;  // internal: shared with the completions handed out

 private:
  std::shared_ptr<State> s_;
  const int per_device_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_STREAM_POOL_H_
