#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <random>

#include <nlohmann/json.hpp>

#include "transfer_engine/common/log.h"
#include "transfer_engine/core/rpc.h"

namespace mooncake::te {
namespace {

constexpr size_t kLengthSize = sizeof(uint64_t);
constexpr auto kDrainWait = std::chrono::seconds(1);  // after the reply: time for the client to close first
constexpr auto kTick = std::chrono::milliseconds(200);
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);  // after accept failed for lack of resources

}  // namespace

struct RpcServer::Conn {
  enum class Phase { kRead, kWrite, kDrain };
  int fd = -1;
  Phase phase = Phase::kRead;
  net::Clock::time_point accepted;
  net::Clock::time_point deadline;  // of the current phase
  std::string in;                   // the request frame received so far (length field included)
  uint64_t frame_len = 0;           // from the length field, once complete
  std::string out;                  // the reply frame
  size_t sent = 0;
};

RpcServer::RpcServer() = default;
RpcServer::~RpcServer() { Stop(); }

Status RpcServer::Bind(const std::string& ip, uint16_t port, uint16_t min_port, uint16_t max_port, int backlog,
                       size_t max_length) {
  if (listen_fd_ >= 0) return Status(ErrorCode::kInvalidArgument, "RPC server is already bound");
  max_length_ = max_length;
  max_buffered_ = std::max(kMaxBufferedBytes, 2 * (max_length + kLengthSize));
  if (port != 0) {
    auto fd = net::Listen(ip, port, backlog);
    if (!fd.ok()) return fd.status();
    listen_fd_ = *fd;
  } else {
    std::mt19937 rng(std::random_device{}());
    int span = max_port - min_port + 1;
    int first = std::uniform_int_distribution<int>(0, span - 1)(rng);
    Status last;
    for (int i = 0; i < span && listen_fd_ < 0; ++i) {
      auto fd = net::Listen(ip, static_cast<uint16_t>(min_port + (first + i) % span), backlog);
      if (fd.ok()) listen_fd_ = *fd;
      else last = fd.status();
    }
    if (listen_fd_ < 0) {
      return Status(ErrorCode::kSocket, "no free RPC port in [" + std::to_string(min_port) + ", " +
                                            std::to_string(max_port) + "] (MC_MIN_RPC_PORT/MC_MAX_RPC_PORT): " +
                                            last.message());
    }
  }
  port_ = net::LocalPort(listen_fd_);
  Status nb = net::SetNonBlocking(listen_fd_, true);
  if (!nb.ok()) {
    close(listen_fd_);
    listen_fd_ = -1;
    return nb;
  }
  return Status::Ok();
}

Status RpcServer::Serve(Handler handler) {
  if (listen_fd_ < 0 || thread_.joinable()) return Status(ErrorCode::kInvalidArgument, "RPC server is not bound");
  handler_ = std::move(handler);
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void RpcServer::Stop() {
  if (thread_.joinable()) {
    stop_.store(true);
    shutdown(listen_fd_, SHUT_RDWR);  // wakes the poll
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

RpcServer::Counters RpcServer::counters() const {
  return {accepted_.load(), served_.load(), timed_out_.load(), evicted_.load(), malformed_.load(), open_.load()};
}

void RpcServer::Loop() {
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    auto now = net::Clock::now();
    auto wake = now + kTick;
    fds.clear();
    fds.push_back({now >= listen_paused_until_ ? listen_fd_ : -1, POLLIN, 0});
    for (const auto& c : conns_) {
      fds.push_back({c->fd, static_cast<short>(c->phase == Conn::Phase::kWrite ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c->deadline);
    }
    if (now < listen_paused_until_) wake = std::min(wake, listen_paused_until_);
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
    int r = poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(0, wait)));
    if (r < 0 && errno != EINTR) {
      MC_LOG(kError) << "RPC server: poll failed: " << strerror(errno);
      std::this_thread::sleep_for(kTick);
      continue;
    }
    now = net::Clock::now();
    const size_t polled = fds.size() - 1;  // conns_ may grow below; only these were polled
    for (size_t i = 0; i < polled; ++i) {
      Conn& c = *conns_[i];
      if (c.fd >= 0 && fds[i + 1].revents) Step(c, fds[i + 1].revents, now);
      if (c.fd >= 0 && now >= c.deadline) {
        if (c.phase != Conn::Phase::kDrain) {
          timed_out_.fetch_add(1, std::memory_order_relaxed);
          MC_LOG(kDebug) << "RPC server: closing a connection from " << net::PeerName(c.fd) << " that did not "
                         << (c.phase == Conn::Phase::kRead ? "send its request" : "take its reply") << " within "
                         << kServeBudget.count() << " s";
        }
        Close(c);
      }
    }
    if (!stop_.load() && (fds[0].revents & POLLIN)) AcceptAll(now);
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const auto& c) { return c->fd < 0; }),
                 conns_.end());
    open_.store(conns_.size(), std::memory_order_relaxed);
  }
  for (auto& c : conns_) Close(*c);
  conns_.clear();
  open_.store(0);
}

RpcServer::Conn* RpcServer::Oldest(const Conn* except, bool partial_only) {
  Conn* oldest = nullptr;
  for (auto& c : conns_) {
    if (c->fd < 0 || c.get() == except || (partial_only && c->in.empty())) continue;
    if (!oldest || c->accepted < oldest->accepted) oldest = c.get();
  }
  return oldest;
}

void RpcServer::AcceptAll(net::Clock::time_point now) {
  size_t open = 0;
  for (const auto& c : conns_) open += c->fd >= 0;
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      bool no_resources = errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM;
      Conn* victim = no_resources ? Oldest(nullptr, false) : nullptr;
      if (victim) {  // out of descriptors: a new peer matters more than the oldest exchange
        evicted_.fetch_add(1, std::memory_order_relaxed);
        Close(*victim);
        --open;
        continue;
      }
      if (now - last_full_log_ >= std::chrono::seconds(1)) {
        last_full_log_ = now;
        MC_LOG(kWarning) << "RPC server: accept failed: " << strerror(errno) << "; retrying shortly";
      }
      listen_paused_until_ = now + kAcceptBackoff;  // the listener stays readable: do not spin on it
      return;
    }
    if (open >= kMaxConnections) {
      Conn* victim = Oldest(nullptr, false);
      if (now - last_full_log_ >= std::chrono::seconds(1)) {
        last_full_log_ = now;
        MC_LOG(kWarning) << "RPC server has " << open << " connections open (the limit): closing the oldest, from "
                         << net::PeerName(victim->fd) << ", open for "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(now - victim->accepted).count()
                         << " ms, to let a new peer in";
      }
      evicted_.fetch_add(1, std::memory_order_relaxed);
      Close(*victim);
      --open;
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->accepted = now;
    c->deadline = now + kServeBudget;
    accepted_.fetch_add(1, std::memory_order_relaxed);
    conns_.push_back(std::move(c));
    ++open;
  }
}

void RpcServer::Step(Conn& c, short revents, net::Clock::time_point now) {
  switch (c.phase) {
    case Conn::Phase::kRead:
      Read(c);
      if (c.fd >= 0 && c.phase == Conn::Phase::kWrite) Write(c, now);
      return;
    case Conn::Phase::kWrite:
      Write(c, now);
      return;
    case Conn::Phase::kDrain: {
      char sink[256];
      ssize_t n = recv(c.fd, sink, sizeof(sink), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
          (revents & (POLLERR | POLLHUP))) {
        Close(c);
      }
      return;
    }
  }
}

void RpcServer::Read(Conn& c) {
  while (c.fd >= 0) {
    size_t want = (c.frame_len == 0 ? kLengthSize : kLengthSize + c.frame_len) - c.in.size();
    size_t chunk = std::min<size_t>(want, 64 << 10);
    if (!Reserve(c, chunk)) {
      evicted_.fetch_add(1, std::memory_order_relaxed);
      Close(c);
      return;
    }
    size_t old = c.in.size();
    c.in.resize(old + chunk);
    ssize_t n = recv(c.fd, c.in.data() + old, chunk, MSG_DONTWAIT);
    c.in.resize(old + std::max<ssize_t>(n, 0));
    if (n > 0) buffered_ += static_cast<size_t>(n);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      Close(c);  // the client went away (or broke) before its request was complete
      return;
    }
    if (n < 0) return;  // nothing more for now
    if (c.frame_len == 0 && c.in.size() == kLengthSize) {
      memcpy(&c.frame_len, c.in.data(), kLengthSize);
      if (c.frame_len == 0 || c.frame_len > max_length_) {
        malformed_.fetch_add(1, std::memory_order_relaxed);
        MC_LOG(kDebug) << "RPC server: bad frame length " << c.frame_len << " from " << net::PeerName(c.fd)
                       << " (max " << max_length_ << ", MC_HANDSHAKE_MAX_LENGTH)";
        Close(c);
        return;
      }
    }
    if (c.frame_len > 0 && c.in.size() == kLengthSize + c.frame_len) {
      Reply(c);
      return;
    }
  }
}

void RpcServer::Reply(Conn& c) {
  RpcFrame request = DecodeRpcFrame(std::string_view(c.in).substr(kLengthSize));
  buffered_ -= c.in.size();
  std::string().swap(c.in);
  StatusOr<std::string> reply = Status(ErrorCode::kRemoteRejected, "the request handler failed");
  try {
    reply = handler_(request);
  } catch (const std::exception& e) {  // a bug in one handler must not end the process
    MC_LOG(kError) << "RPC server: handler threw on a type " << static_cast<int>(request.type)
                   << " request: " << e.what();
    reply = Status(ErrorCode::kRemoteRejected, std::string("the request handler failed: ") + e.what());
  } catch (...) {
    MC_LOG(kError) << "RPC server: handler threw on a type " << static_cast<int>(request.type) << " request";
  }
  RpcFrame out;
  out.type = request.type;
  out.body = reply.ok() ? *reply
                       : nlohmann::json{{"error", reply.status().ToString()}, {"code", static_cast<int>(reply.status().code())}}.dump();
  c.out = EncodeRpcFrame(out);
  c.phase = Conn::Phase::kWrite;
  served_.fetch_add(1, std::memory_order_relaxed);
}

void RpcServer::Write(Conn& c, net::Clock::time_point now) {
  while (c.sent < c.out.size()) {
    ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    Close(c);
    return;
  }
  std::string().swap(c.out);
  shutdown(c.fd, SHUT_WR);
  // Wait (briefly) for the client to close, so the reply is not cut by a reset.
  c.phase = Conn::Phase::kDrain;
  c.deadline = now + kDrainWait;
}

bool RpcServer::Reserve(const Conn& c, size_t bytes) {
  while (buffered_ + bytes > max_buffered_) {
    Conn* victim = Oldest(&c, /*partial_only=*/true);
    if (!victim) return false;
    MC_LOG(kDebug) << "RPC server: dropping the partial request from " << net::PeerName(victim->fd)
                   << " to stay within " << max_buffered_ << " buffered bytes";
    evicted_.fetch_add(1, std::memory_order_relaxed);
    Close(*victim);
  }
  return true;
}

void RpcServer::Close(Conn& c) {
  if (c.fd < 0) return;
  close(c.fd);
  c.fd = -1;
  buffered_ -= c.in.size();
  std::string().swap(c.in);
  std::string().swap(c.out);
}

}  // namespace mooncake::te
