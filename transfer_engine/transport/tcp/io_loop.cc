#include "transfer_engine/transport/tcp/io_loop.h"

#include <errno.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>

#include "transfer_engine/common/log.h"

namespace mooncake::te::tcp {

IoLoop::IoLoop(std::string name) : name_(std::move(name)) {}

IoLoop::~IoLoop() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epfd_ >= 0) close(epfd_);
}

Status IoLoop::Start(std::function<void()> on_tick, std::chrono::milliseconds tick) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wake_fd_ < 0) return Status(ErrorCode::kSocket, std::string("epoll/eventfd: ") + strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // null marks the wake-up fd
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
    return Status(ErrorCode::kSocket, std::string("epoll_ctl: ") + strerror(errno));
  }
  on_tick_ = std::move(on_tick);
  tick_ = tick;
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void IoLoop::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  ssize_t unused = write(wake_fd_, &one, sizeof(one));
  (void)unused;
  thread_.join();
}

Status IoLoop::Add(int fd, uint32_t events, EventHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return Status(ErrorCode::kSocket, std::string("epoll_ctl(ADD): ") + strerror(errno));
  }
  return Status::Ok();
}

Status IoLoop::Modify(int fd, uint32_t events, EventHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) != 0) {
    return Status(ErrorCode::kSocket, std::string("epoll_ctl(MOD): ") + strerror(errno));
  }
  return Status::Ok();
}

void IoLoop::Remove(int fd) { epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr); }

void IoLoop::Post(std::function<void()> fn) {
  {
    std::lock_guard lock(posted_mu_);
    posted_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  ssize_t unused = write(wake_fd_, &one, sizeof(one));
  (void)unused;
}

namespace {
thread_local bool t_on_loop_thread = false;
}  // namespace

bool IoLoop::OnAnyLoopThread() { return t_on_loop_thread; }

void IoLoop::Run() {
  t_on_loop_thread = true;
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  auto next_tick = std::chrono::steady_clock::now() + tick_;
  while (!stop_.load(std::memory_order_relaxed)) {
    auto now = std::chrono::steady_clock::now();
    int wait_ms = static_cast<int>(
        std::max<long long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now).count()));
    int n = epoll_wait(epfd_, events, kMaxEvents, wait_ms);
    if (n < 0 && errno != EINTR) {
      MC_LOG(kError) << name_ << ": epoll_wait failed: " << strerror(errno);
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {
        uint64_t v;
        while (read(wake_fd_, &v, sizeof(v)) > 0) {
        }
        continue;
      }
      static_cast<EventHandler*>(events[i].data.ptr)->OnEvents(events[i].events);
    }
    std::vector<std::function<void()>> posted;
    {
      std::lock_guard lock(posted_mu_);
      posted.swap(posted_);
    }
    for (auto& fn : posted) fn();
    if (std::chrono::steady_clock::now() >= next_tick) {
      if (on_tick_) on_tick_();
      next_tick = std::chrono::steady_clock::now() + tick_;
    }
  }
}

}  // namespace mooncake::te::tcp
