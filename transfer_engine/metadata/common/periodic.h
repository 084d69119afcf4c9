#ifndef MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_PERIODIC_H_
#define MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_PERIODIC_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace mooncake::te {

/// Runs `fn` every `interval` on its own thread until destroyed (destruction wakes and joins it).
/// Used by metadata backends to keep their keys' leases alive.
class Periodic {
 public:
  Periodic(std::chrono::milliseconds interval, std::function<void()> fn)
      : interval_(interval), fn_(std::move(fn)), thread_([this] { Run(); }) {}
  ~Periodic() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, interval_, [&] { return stop_; })) {
      lock.unlock();
      fn_();
      lock.lock();
    }
  }
  std::chrono::milliseconds interval_;
  std::function<void()> fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_PERIODIC_H_
