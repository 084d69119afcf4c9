#include "transfer_engine/bench/baseline.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "transfer_engine/common/net.h"

namespace mooncake::te::bench {
namespace {

constexpr auto kForever = std::chrono::hours(24);

net::Clock::time_point Deadline() { return net::Clock::now() + std::chrono::seconds(60); }

}  // namespace

RawSocketServer::~RawSocketServer() { Stop(); }

StatusOr<uint16_t> RawSocketServer::Start(const std::string& ip) {
  auto fd = net::Listen(ip, 0, 16);
  if (!fd.ok()) return fd.status();
  listen_fd_ = *fd;
  accept_thread_ = std::thread([this] {
    while (!stop_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      int c = accept(listen_fd_, nullptr, nullptr);
      if (c < 0) continue;
      net::SetNoDelay(c);
      workers_.emplace_back([this, c] { Serve(c); });
    }
  });
  return net::LocalPort(listen_fd_);
}

void RawSocketServer::Stop() {
  if (!accept_thread_.joinable()) return;
  stop_.store(true);
  accept_thread_.join();
  close(listen_fd_);
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void RawSocketServer::Serve(int fd) {
  std::unique_ptr<char[]> buf;
  size_t cap = 0;
  while (!stop_.load()) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    uint64_t hdr[2];
    if (!net::RecvAll(fd, hdr, sizeof(hdr), Deadline()).ok()) break;
    size_t len = hdr[1];
    if (len > (1ULL << 31)) break;
    if (len > cap) {
      buf.reset(new char[len]);
      memset(buf.get(), 1, len);
      cap = len;
    }
    if (hdr[0] == 1) {
      uint64_t ack = 0;
      if (!net::RecvAll(fd, buf.get(), len, Deadline()).ok()) break;
      if (!net::SendAll(fd, &ack, sizeof(ack), Deadline()).ok()) break;
    } else {
      if (!net::SendAll(fd, buf.get(), len, Deadline()).ok()) break;
    }
  }
  close(fd);
}

RawSocketClient::~RawSocketClient() {
  if (fd_ >= 0) close(fd_);
}

Status RawSocketClient::Connect(const std::string& host, uint16_t port) {
  auto fd = net::Connect(host, port, std::chrono::seconds(5));
  if (!fd.ok()) return fd.status();
  fd_ = *fd;
  return Status::Ok();
}

Status RawSocketClient::Write(const char* buf, size_t len, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint64_t hdr[2] = {1, len};
    MC_RETURN_IF_ERROR(net::SendAll(fd_, hdr, sizeof(hdr), Deadline()));
    MC_RETURN_IF_ERROR(net::SendAll(fd_, buf + i * len, len, Deadline()));
  }
  for (size_t i = 0; i < count; ++i) {
    uint64_t ack;
    MC_RETURN_IF_ERROR(net::RecvAll(fd_, &ack, sizeof(ack), Deadline()));
  }
  return Status::Ok();
}

Status RawSocketClient::Read(char* buf, size_t len, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint64_t hdr[2] = {2, len};
    MC_RETURN_IF_ERROR(net::SendAll(fd_, hdr, sizeof(hdr), Deadline()));
  }
  for (size_t i = 0; i < count; ++i) MC_RETURN_IF_ERROR(net::RecvAll(fd_, buf + i * len, len, Deadline()));
  return Status::Ok();
}

double MemcpyBandwidth(void* dst, const void* src, size_t len, int iters) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    memcpy(dst, src, len);
    asm volatile("" ::: "memory");
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(len) * iters / s / 1e9;
}

}  // namespace mooncake::te::bench
