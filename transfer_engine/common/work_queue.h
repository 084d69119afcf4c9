#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_WORK_QUEUE_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_WORK_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mooncake::te {

/// A FIFO of jobs run by a fixed set of threads. Thread-safe. Stop() (also run by the destructor) lets the
/// threads finish every job already posted, then joins them; Post() after Stop() refuses the job.
class WorkQueue {
 public:
  explicit WorkQueue(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~WorkQueue() { Stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  /// false (and `fn` not run) once stopping.
  bool Post(std::function<void()> fn) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return false;
      jobs_.push_back(std::move(fn));
    }
    cv_.notify_one();
    return true;
  }

  void Stop() {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // last: started after the members they use
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_WORK_QUEUE_H_
