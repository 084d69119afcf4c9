#include "transfer_engine/transport/shm/parallel_copy.h"

#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace mooncake::te::shm {

// One Run's shared state. Helpers hold it by shared_ptr, so one that wakes after the copy is done finds the
// cursor exhausted and leaves without touching `fn` (which lives on the caller's stack).
struct ParallelCopier::Job {
  const PartFn* fn = nullptr;
  size_t length = 0, part = 0, parts = 0;
  std::atomic<size_t> next{0};       // the next part to claim
  std::atomic<bool> failed{false};   // a part failed: skip the rest
  std::mutex mu;
  std::condition_variable done_cv;
  size_t finished = 0;      // parts copied or skipped; guarded by mu
  size_t helper_parts = 0;  // guarded by mu
  Status error;             // the first failure; guarded by mu
};

ParallelCopier::ParallelCopier(int threads, size_t min_part, size_t max_part)
    : threads_(std::max(1, threads)),
      min_part_(std::max<size_t>(4096, min_part)),
      max_part_(std::max(min_part_, max_part)) {
  if (threads_ > 1) helpers_ = std::make_unique<WorkQueue>(threads_ - 1);
}

ParallelCopier::~ParallelCopier() { Stop(); }

void ParallelCopier::Stop() {
  if (helpers_) helpers_->Stop();  // runs the jobs already posted: their parts complete
}

size_t ParallelCopier::PartSize(size_t length) const {
  if (!helpers_ || length < 2 * min_part_) return length;
  size_t share = (length + threads_ - 1) / threads_;
  share = (share + 4095) & ~size_t{4095};
  return std::clamp(share, min_part_, max_part_);
}

void ParallelCopier::Work(Job& job, bool helper) {
  for (size_t i = job.next.fetch_add(1); i < job.parts; i = job.next.fetch_add(1)) {
    Status st;
    bool copied = false;
    if (!job.failed.load(std::memory_order_relaxed)) {
      const size_t offset = i * job.part;
      st = (*job.fn)(offset, std::min(job.part, job.length - offset));
      copied = true;
    }
    std::lock_guard lock(job.mu);
    if (!st.ok() && job.error.ok()) {
      job.error = st;
      job.failed.store(true, std::memory_order_relaxed);
    }
    if (helper && copied) job.helper_parts++;
    if (++job.finished == job.parts) job.done_cv.notify_all();
  }
}

ParallelCopier::Outcome ParallelCopier::Run(size_t length, const PartFn& fn) {
  Outcome out;
  if (length == 0) return out;
  const size_t part = PartSize(length);
  if (part >= length) {
    out.parts = 1;
    out.status = fn(0, length);
    return out;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->length = length;
  job->part = part;
  job->parts = (length + part - 1) / part;
  const size_t wanted = std::min<size_t>(threads_ - 1, job->parts - 1);
  for (size_t i = 0; i < wanted; ++i) {
    if (!helpers_->Post([job] { Work(*job, /*helper=*/true); })) break;  // stopping: the caller copies alone
  }
  Work(*job, /*helper=*/false);
  std::unique_lock lock(job->mu);
  job->done_cv.wait(lock, [&] { return job->finished == job->parts; });
  out.status = job->error;
  out.parts = job->parts;
  out.helper_parts = job->helper_parts;
  return out;
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace mooncake::te::shm
