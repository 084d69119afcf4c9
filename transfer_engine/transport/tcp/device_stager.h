#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_DEVICE_STAGER_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_DEVICE_STAGER_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::tcp {

/// A run of pinned host memory from a stager's pool that device memory is staged through. Goes back to the pool
/// when the last reference goes (any thread: releasing never frees or allocates pinned memory, it only hands the
/// chunks to the next waiter on a stager thread). A reference keeps the pool alive after the stager is gone.
struct StagingBuffer {
  char* data = nullptr;
  size_t capacity = 0;
};
using StagingRef = std::shared_ptr<StagingBuffer>;

/// Who holds a staging buffer. Each role has its own half of the pool, so neither can starve the other: an
/// initiator's buffers wait only for the peer's target, a target's only for local copies and the peer's reading,
/// so two engines staging towards each other never wait for each other's pools in a cycle.
enum class StagingRole : uint8_t { kInitiator = 0, kTarget = 1 };

/// Moves device memory for the tcp transport through a bounded pool of pinned host memory, and copies between it
/// and device memory with the platform's CopyAsync.
///
/// - Pool: per device platform, `pool_bytes` of pinned host memory (Allocate kPinnedHost), half per role, cut
///   into chunks of `chunk_bytes`. It is allocated by Prepare (called for each region of that platform as it is
///   registered, on the registering thread; the first one allocates) and freed on a stager thread once every
///   Prepare was matched by an Unprepare (the last region of the platform is gone) and no buffer or copy of it
///   is left, or when the stager and every buffer are gone. The next Prepare allocates a new pool. No I/O thread
///   ever allocates or frees pinned memory.
/// - Streams: each pool has `streams_per_device` streams per device (StreamPool, created by Prepare for its
///   region's device), and every copy goes to the least busy one, so copies of unrelated transfers run
///   concurrently. A platform without streams copies on its own stream.
/// - Buffers: Acquire queues (FIFO) until enough adjacent chunks of the role are free; TryAcquireOrNotify never
///   queues: it returns a chunk, or arranges a wake-up once one is released (the target's backpressure).
/// - Copies: waited for by a few stager threads (kWaiters, started with the first copy), which block in the
///   completion's Wait, then run the copy's continuation; grants and wake-ups run on the same threads. No I/O
///   thread ever waits for a copy, and one slow copy does not hold back the continuations of others.
/// - Locking: no platform call (Allocate, Free, CopyAsync, stream creation) is made while the stager's lock is
///   held, so a slow copy start or free holds up no other Acquire, Copy, release or Stats.
///
/// Thread-safe. Continuations, grants and wake-ups run on a stager thread (or at once on the caller's when the
/// copy cannot start, the buffer is free at once, or the stager has stopped); they must not block for long and
/// must not call Stop.
class DeviceStager {
 public:
  static constexpr int kWaiters = 2;
  static constexpr int kDefaultStreamsPerDevice = 4;

  /// `pool_bytes`: the pinned budget per device platform (both roles); `chunk_bytes`: the unit (clamped to
  /// [4 KiB, pool_bytes / 2]); `streams_per_device`: copy streams per device (at least 1).
  DeviceStager(PlatformRegistry* platforms, size_t pool_bytes, size_t chunk_bytes,
               int streams_per_device = kDefaultStreamsPerDevice);
  ~DeviceStager();  // Stop()
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  /// Whether memory of `kind` (a device kind) can be staged: a usable platform of its type is registered.
  bool CanStage(const MemoryKind& kind);
  /// Allocates the pool of `kind`'s platform unless it exists, creates the streams of `kind`'s device, and counts
  /// one holder of the pool (a registered region). Never call it on an I/O thread. kDeviceNotFound without a
  /// usable platform; the platform's error when the pinned memory cannot be had (nothing is counted then).
  Status Prepare(const MemoryKind& kind);
  /// Drops one holder counted by a successful Prepare of the same memory type; the last one lets the pool go
  /// (see above). Any thread (it never frees memory itself). An Unprepare without a Prepare is logged and ignored.
  void Unprepare(const MemoryKind& kind);

  size_t chunk_bytes() const { return chunk_; }
  /// The largest buffer one role can hold (Acquire of more fails).
  size_t role_bytes() const { return chunks_per_role_ * chunk_; }
  /// `slice` when every slice the engine cuts at that size (a tail of up to a quarter is merged into the last
  /// one: up to 1.25 x) fits role_bytes(); else the largest size, in 4 KiB steps (at least 4 KiB), whose slices do.
  size_t SliceFitting(size_t slice) const;

  /// Calls `granted` with a buffer of at least `length` (> 0) bytes of `role`'s share once one is free: at once
  /// on the calling thread when it is (and nobody queued before), else later on a stager thread. Errors (no pool,
  /// larger than the role's share, the stager stopped) are given to `granted` too.
  void Acquire(const MemoryKind& kind, StagingRole role, size_t length,
               std::function<void(StatusOr<StagingRef>)> granted);
  /// One chunk of `role`'s share when one is free and nobody waits for one; otherwise null, and `wake` runs once
  /// (on a stager thread) after a chunk of the role is released, or when the stager stops. Errors: no pool.
  StatusOr<StagingRef> TryAcquireOrNotify(const MemoryKind& kind, StagingRole role, std::function<void()> wake);

  /// Starts copying `length` bytes from `src` to `dst` (one side memory of `kind`, the other a staging buffer), on
  /// the least busy stream of `kind`'s device, and calls `done` with the copy's outcome once it has finished. The caller keeps both ranges alive until then (e.g.
  /// by capturing their references in `done`).
  void Copy(const MemoryKind& kind, void* dst, const void* src, size_t length, std::function<void(const Status&)> done);

  /// Waits for the copies already started and runs their continuations; queued Acquires fail (kSocket, "shutting
  /// down"), wake-ups run; ends the threads; later copies and acquires fail at once. Idempotent.
  void Stop();

  /// Whether the calling thread is a stager's (its continuations must not block either, e.g. on a connect).
  static bool OnStagerThread();

  /// {"copies", "copied_bytes", "copy_errors", "pool_bytes" (the budget), "chunk_bytes", "pinned_bytes" (pools
  /// allocated now), "in_use_bytes", "peak_in_use_bytes", "acquire_waits" (Acquires that queued),
  /// "target_pauses" (TryAcquireOrNotify found none free), "pools_freed" (pools let go after their last
  /// region), "streams" (copy streams now), "streams_per_device"}.
  nlohmann::json Stats() const;

 private:
  struct State;  // shared with the buffers' deleters and the threads
  std::shared_ptr<Platform> PlatformFor(MemoryType type);

  PlatformRegistry* platforms_;
  const size_t chunk_;
  const size_t chunks_per_role_;
  const int streams_per_device_;
  std::shared_ptr<State> s_;
  std::vector<std::thread> threads_;  // guarded by s_->mu
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_DEVICE_STAGER_H_
