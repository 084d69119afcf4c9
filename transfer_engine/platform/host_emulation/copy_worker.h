#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_COPY_WORKER_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_COPY_WORKER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "transfer_engine/platform/platform.h"

namespace mooncake::te::host_emulation {

struct CopyState;  // a job's outcome, shared by the worker and the job's completion

/// One worker thread that runs jobs in submission order (the emulation's "stream"). The thread starts with the
/// first job. The destructor runs every job already queued, then joins: a completion handed out always
/// finishes. Thread-safe.
class CopyWorker {
 public:
  CopyWorker() = default;
  ~CopyWorker();
  CopyWorker(const CopyWorker&) = delete;
  CopyWorker& operator=(const CopyWorker&) = delete;

  /// Queues `job`; the completion reports its Status once it has run. The completion may outlive the worker.
  std::unique_ptr<CopyCompletion> Submit(std::function<Status()> job);

 private:
  struct Job {
    std::function<Status()> fn;
    std::shared_ptr<CopyState> state;
  };
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mooncake::te::host_emulation

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_COPY_WORKER_H_
