#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_RPC_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_RPC_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

/// Handshake/RPC messages (Mooncake's framing, reference §1.8): one request frame and one reply frame per
/// TCP connection. Frame = uint64 length (host byte order; counts the type byte) + uint8 type + JSON text.
enum class RpcType : uint8_t { kConnection = 0, kMetadata = 1, kNotify = 2, kProbe = 3 };

struct RpcFrame {
  RpcType type = RpcType::kProbe;
  std::string body;
};

/// Sends one request and reads the reply, all bounded by `timeout`. Errors name the peer and the step.
StatusOr<RpcFrame> RpcCall(const std::string& host, uint16_t port, const RpcFrame& request,
                           std::chrono::milliseconds timeout, size_t max_length);

/// Serves RPC requests on a port. The handler returns the reply body (the reply carries the request's type),
/// or an error, which is sent as {"error": "..."}.
///
/// Threading: an accept thread plus one short-lived thread per connection (at most 64 at once; more are
/// refused). Each connection has a 5 s budget. The handler must be thread-safe.
class RpcServer {
 public:
  using Handler = std::function<StatusOr<std::string>(const RpcFrame&)>;

  RpcServer() = default;
  ~RpcServer();

  /// Binds `ip` at `port`, or when port is 0 at a random free port in [min_port, max_port].
  Status Start(const std::string& ip, uint16_t port, uint16_t min_port, uint16_t max_port, int backlog,
               size_t max_length, Handler handler);
  void Stop();
  uint16_t port() const { return port_; }

 private:
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  size_t max_length_ = 1 << 20;
  Handler handler_;
  std::thread accept_thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> active_{0};
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_RPC_H_
