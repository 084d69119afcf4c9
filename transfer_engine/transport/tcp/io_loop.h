#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_IO_LOOP_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_IO_LOOP_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te::tcp {

/// Receives readiness events for one file descriptor; called on its loop's thread only.
class EventHandler {
 public:
  virtual ~EventHandler() = default;
  virtual void OnEvents(uint32_t events) = 0;
};

/// One epoll thread. Registration calls are thread-safe; handlers run on the loop thread. Sleeps in
/// epoll_wait (no spinning); a periodic tick (default 100 ms) drives timeouts.
class IoLoop {
 public:
  explicit IoLoop(std::string name);
  ~IoLoop();

  Status Start(std::function<void()> on_tick, std::chrono::milliseconds tick);
  /// Stops and joins the thread. Handlers stay registered (their owners close them). Idempotent.
  void Stop();

  Status Add(int fd, uint32_t events, EventHandler* handler);
  Status Modify(int fd, uint32_t events, EventHandler* handler);
  void Remove(int fd);

  /// Runs `fn` on the loop thread soon.
  void Post(std::function<void()> fn);
  bool InLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  /// Whether the calling thread is any IoLoop's thread (where nothing may block).
  static bool OnAnyLoopThread();

 private:
  void Run();

  std::string name_;
  int epfd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::function<void()> on_tick_;
  std::chrono::milliseconds tick_{100};
  std::mutex posted_mu_;
  std::vector<std::function<void()>> posted_;
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_IO_LOOP_H_
