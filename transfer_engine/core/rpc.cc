#include "transfer_engine/core/rpc.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"

namespace mooncake::te {
namespace {

constexpr int kMaxConcurrentConnections = 64;
constexpr auto kServeBudget = std::chrono::seconds(5);

Status WriteFrame(int fd, const RpcFrame& f, net::Clock::time_point deadline) {
  uint64_t len = f.body.size() + 1;
  std::string buf(sizeof(len) + len, '\0');
  memcpy(buf.data(), &len, sizeof(len));
  buf[sizeof(len)] = static_cast<char>(f.type);
  memcpy(buf.data() + sizeof(len) + 1, f.body.data(), f.body.size());
  return net::SendAll(fd, buf.data(), buf.size(), deadline);
}

StatusOr<RpcFrame> ReadFrame(int fd, size_t max_length, net::Clock::time_point deadline) {
  uint64_t len = 0;
  MC_RETURN_IF_ERROR(net::RecvAll(fd, &len, sizeof(len), deadline));
  if (len == 0 || len > max_length) {
    return Status(ErrorCode::kMalformedJson, "bad RPC frame length " + std::to_string(len) + " (max " +
                                                 std::to_string(max_length) + ", MC_HANDSHAKE_MAX_LENGTH)");
  }
  std::string buf(len, '\0');
  MC_RETURN_IF_ERROR(net::RecvAll(fd, buf.data(), len, deadline));
  RpcFrame f;
  uint8_t type = static_cast<uint8_t>(buf[0]);
  // Mooncake's oldest peers send an untyped frame: a first byte above 3 means "connection".
  f.type = type > 3 ? RpcType::kConnection : static_cast<RpcType>(type);
  f.body = type > 3 ? buf : buf.substr(1);
  return f;
}

}  // namespace

StatusOr<RpcFrame> RpcCall(const std::string& host, uint16_t port, const RpcFrame& request,
                           std::chrono::milliseconds timeout, size_t max_length) {
  auto deadline = net::Clock::now() + timeout;
  std::string peer = net::HostPort{host, port}.ToString();
  auto fd = net::Connect(host, port, timeout);
  if (!fd.ok()) return fd.status();
  Status st = WriteFrame(*fd, request, deadline);
  StatusOr<RpcFrame> reply = st.ok() ? ReadFrame(*fd, max_length, deadline) : StatusOr<RpcFrame>(st);
  close(*fd);
  if (!reply.ok()) {
    return Status(reply.status().code() == ErrorCode::kTimeout ? ErrorCode::kTimeout : ErrorCode::kPeerUnreachable,
                  "RPC to " + peer + ": " + reply.status().message());
  }
  return reply;
}

RpcServer::~RpcServer() { Stop(); }

Status RpcServer::Start(const std::string& ip, uint16_t port, uint16_t min_port, uint16_t max_port, int backlog,
                        size_t max_length, Handler handler) {
  handler_ = std::move(handler);
  max_length_ = max_length;
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
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return Status::Ok();
}

void RpcServer::Stop() {
  if (!accept_thread_.joinable()) return;
  stop_.store(true);
  shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  close(listen_fd_);
  listen_fd_ = -1;
  // Connection threads hold `this`: wait for them (each is bounded by kServeBudget).
  auto deadline = std::chrono::steady_clock::now() + kServeBudget + std::chrono::seconds(1);
  while (active_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void RpcServer::AcceptLoop() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    int r = poll(&p, 1, 200);
    if (r <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (active_.load() >= kMaxConcurrentConnections) {
      MC_LOG(kWarning) << "RPC server busy: refusing a connection from " << net::PeerName(fd);
      close(fd);
      continue;
    }
    active_.fetch_add(1);
    std::thread([this, fd] {
      Serve(fd);
      close(fd);
      active_.fetch_sub(1);
    }).detach();
  }
}

void RpcServer::Serve(int fd) {
  auto deadline = net::Clock::now() + kServeBudget;
  auto request = ReadFrame(fd, max_length_, deadline);
  if (!request.ok()) {
    MC_LOG(kDebug) << "bad RPC request from " << net::PeerName(fd) << ": " << request.status().message();
    return;
  }
  auto reply = handler_(*request);
  RpcFrame out;
  out.type = request->type;
  out.body = reply.ok() ? *reply : nlohmann::json{{"error", reply.status().ToString()}}.dump();
  if (!WriteFrame(fd, out, deadline).ok()) return;
  shutdown(fd, SHUT_WR);
  // Wait (briefly) for the client to close, so the reply is not cut by a reset.
  char sink[64];
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 1000) > 0) {
    ssize_t unused = recv(fd, sink, sizeof(sink), 0);
    (void)unused;
  }
}

}  // namespace mooncake::te
