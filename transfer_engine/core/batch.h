#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_BATCH_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_BATCH_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/api/types.h"
#include "transfer_engine/core/latency_histogram.h"
#include "transfer_engine/core/memory_registry.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

class Batch;
class Task;

/// What the engine may do with a slice a transport could not move.
enum class SliceRetry : uint8_t {
  kFinal = 0,    ///< the error is the task's outcome
  kOtherPath,    ///< another installed transport that can reach the peer may move it
  kRefreshPeer,  ///< the peer may have restarted or dropped our connections: move it again once, on a fresh
                 ///< descriptor and fresh connections
};

/// The unit a transport moves: a contiguous piece of one task. Owned by its Task; a transport may keep a
/// pointer until it calls Complete() exactly once.
struct Slice {
  Task* task = nullptr;
  OpCode opcode = OpCode::kWrite;
  char* local = nullptr;
  uint64_t remote = 0;
  size_t length = 0;
  uint32_t attempts = 0;  ///< transport-owned: how often the slice was moved to another path after a failure
  uint32_t engine_attempts = 0;  ///< engine-owned: how often it was handed to a transport again
  uint64_t tried_transports = 0;  ///< engine-owned: bit i set once transport i failed it
  bool refreshed = false;         ///< engine-owned: already moved again after a descriptor refresh
  /// engine-owned: when the engine last handed the slice to a transport (steady clock)
  std::chrono::steady_clock::time_point handed_out{};

  /// Reports the outcome. Thread-safe; must be called exactly once per slice (Complete or Fail). After the
  /// last slice of the last task completes, the batch (and this slice) may be destroyed: do not touch the
  /// slice afterwards.
  void Complete(const Status& status);
  /// Reports a failure the engine may retry (see SliceRetry); the slice then comes back to a transport
  /// later, or completes with `status`. Counts as the transport's one completion.
  void Fail(const Status& status, SliceRetry retry);
};

/// Decides about a failed, retriable slice: returns true when it took the slice over (it will be submitted
/// again and completed later), false to let it complete with its error. Called on the transport's thread: it
/// must not block.
using SliceRetryHook = std::function<bool(Slice* slice, const Status& status, SliceRetry retry)>;

/// Cuts `length` bytes at (local, remote) into slices of at most `slice_size`; a tail of at most slice_size/4
/// is merged into the previous slice (fewer tiny frames). Zero length yields no slices.
std::vector<Slice> CutIntoSlices(OpCode op, char* local, uint64_t remote, size_t length, size_t slice_size);

/// One request of a batch: its slices, state and first error. Thread-safe.
class Task {
 public:
  TransferStatus status() const;
  /// The first error reported by a slice (ok while none failed).
  Status error() const;
  std::vector<Slice>& slices() { return slices_; }

  /// Set by the engine before the task starts: what its retry hook needs to move a slice again.
  struct Route {
    std::string segment;       ///< target segment name
    MemoryKind local_kind;     ///< of the source range
    MemoryKind remote_kind;    ///< of the target buffer
    /// Where the task's latency (Start to completion) is recorded when it completes; null: nowhere.
    std::shared_ptr<LatencyHistogram> latency;
  };
  Route route;

 private:
  friend class Batch;
  friend struct Slice;
  void Start(std::shared_ptr<Batch> owner, std::vector<Slice> slices, RegionPin local_pin);
  void Fail(std::shared_ptr<Batch> owner, const Status& status);
  void OnSliceDone(size_t bytes, const Status& status);
  void Finish();

  Batch* batch_ = nullptr;
  std::vector<Slice> slices_;
  RegionPin local_pin_;
  std::chrono::steady_clock::time_point started_{};
  std::shared_ptr<Batch> keep_alive_;  // held while in flight, so a freed handle never frees live slices
  std::atomic<size_t> remaining_{0};
  std::atomic<size_t> transferred_{0};
  std::atomic<uint8_t> state_{static_cast<uint8_t>(TransferState::kWaiting)};
  mutable std::mutex error_mu_;
  Status error_;
};

/// A fixed-capacity group of tasks and its completion state. Waiting blocks on a condition variable.
/// Thread-safe, except that AddTask calls for one batch must not race each other (the engine serializes them
/// with submit_mutex()).
class Batch : public std::enable_shared_from_this<Batch> {
 public:
  explicit Batch(size_t capacity);
  ~Batch();

  /// Held by a submission for its whole check-reserve-start sequence.
  std::mutex& submit_mutex() { return submit_mu_; }

  size_t capacity() const { return capacity_; }
  size_t size() const { return size_.load(std::memory_order_acquire); }

  /// Reserves the next task slot (kTooManyRequests when full) and returns it, not yet started.
  StatusOr<Task*> AddTask();
  /// Starts a reserved task with its slices (an empty list completes it at once).
  void StartTask(Task* task, std::vector<Slice> slices, RegionPin local_pin);
  /// Ends a reserved task with an error before anything was sent.
  void FailTask(Task* task, const Status& status);

  Task& task(size_t i) { return tasks_[i]; }
  const Task& task(size_t i) const { return tasks_[i]; }

  /// COMPLETED when every task completed; FAILED/TIMEOUT once all are terminal and one failed;
  /// else PENDING (WAITING when empty). transferred_bytes sums the tasks.
  TransferStatus status() const;
  bool finished() const { return unfinished_.load(std::memory_order_acquire) == 0; }

  /// Blocks until every started task is terminal or `deadline` passes; returns finished().
  bool WaitUntil(std::chrono::steady_clock::time_point deadline);

  /// Installed once, before the first task starts (the engine's retry rules).
  void SetRetryHook(SliceRetryHook hook) { retry_hook_ = std::move(hook); }
  const SliceRetryHook& retry_hook() const { return retry_hook_; }

  /// Runs `fn` once, when the batch finishes (at once if it already has); every registered function runs. Used to send a notification
  /// after the data is in place. `fn` runs on the completing thread: it must not block for long.
  void OnFinished(std::function<void(const Batch&)> fn);

 private:
  friend class Task;
  void TaskFinished();

  const size_t capacity_;
  std::unique_ptr<Task[]> tasks_;
  std::atomic<size_t> size_{0};
  std::atomic<size_t> unfinished_{0};
  std::mutex submit_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void(const Batch&)>> on_finished_;  // each runs once
  SliceRetryHook retry_hook_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_BATCH_H_
