#include "transfer_engine/platform/host_emulation/copy_worker.h"

#include <utility>

namespace mooncake::te::host_emulation {

struct CopyState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};

namespace {

class WorkerCompletion final : public CopyCompletion {
 public:
  explicit WorkerCompletion(std::shared_ptr<CopyState> state) : state_(std::move(state)) {}

  bool Done() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
  }

  Status Wait() override {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [this] { return state_->done; });
    return state_->status;
  }

 private:
  std::shared_ptr<CopyState> state_;
};

}  // namespace

CopyWorker::~CopyWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<CopyCompletion> CopyWorker::Submit(std::function<Status()> job) {
  auto state = std::make_shared<CopyState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Job{std::move(job), state});
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }
  cv_.notify_one();
  return std::make_unique<WorkerCompletion>(std::move(state));
}

void CopyWorker::Run() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Status st = job.fn();
    {
      std::lock_guard<std::mutex> lock(job.state->mu);
      job.state->status = std::move(st);
      job.state->done = true;
    }
    job.state->cv.notify_all();
  }
}

}  // namespace mooncake::te::host_emulation
