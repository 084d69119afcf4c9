#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_SHM_PARALLEL_COPY_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_SHM_PARALLEL_COPY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "transfer_engine/api/status.h"
#include "transfer_engine/common/work_queue.h"

namespace mooncake::te::shm {

/// Runs one large copy as consecutive parts on the calling thread and up to `threads - 1` helper threads at
/// once. Parts are claimed one at a time from a shared cursor, so a thread that is descheduled (a busy host)
/// leaves its share to the others. The caller always copies parts itself: a copy finishes even when every
/// helper is busy with other copies or never gets a core; a helper can delay it only by a part it claimed.
///
/// Threading: Run may be called from many threads at once; they share the helpers (first come, first served).
/// Stop (and the destructor) joins the helpers once they have finished the parts they claimed; Runs after Stop
/// copy on the caller alone. No Run may be in progress when the destructor runs.
class ParallelCopier {
 public:
  /// Copies shorter than 2 * min_part run on the caller alone (waking a helper costs more than it saves).
  /// Parts are `length / threads` rounded up to 4 KiB, clamped to [min_part, max_part].
  ParallelCopier(int threads, size_t min_part = 1u << 20, size_t max_part = 4u << 20);
  ~ParallelCopier();
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  /// Copies part `[offset, offset + len)` of the whole; called concurrently for disjoint parts.
  using PartFn = std::function<Status(size_t offset, size_t len)>;

  struct Outcome {
    Status status;           ///< the first failure; after one, parts not yet started are skipped
    size_t parts = 0;        ///< how many parts the copy was cut into
    size_t helper_parts = 0; ///< how many of them helper threads copied
  };

  /// Copies [0, length) through `fn`. Returns once every part has been copied or skipped, and `fn` is not
  /// called after it returns.
  Outcome Run(size_t length, const PartFn& fn);

  /// Joins the helpers; idempotent.
  void Stop();

  int threads() const { return threads_; }
  /// The part size Run uses for `length` (length itself when it is not split).
  size_t PartSize(size_t length) const;

 private:
  struct Job;
  static void Work(Job& job, bool helper);

  const int threads_;
  const size_t min_part_, max_part_;
  std::unique_ptr<WorkQueue> helpers_;  // threads_ - 1 threads; null when threads_ == 1
};

/// Usable CPUs of this process (its affinity mask), at least 1.
int UsableCpus();

}  // namespace mooncake::te::shm

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_SHM_PARALLEL_COPY_H_
