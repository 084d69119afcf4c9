#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_RPC_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_RPC_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/common/net.h"

namespace mooncake::te {

/// Handshake/RPC messages (Mooncake's framing, reference §1.8): one request frame and one reply frame per
/// TCP connection. Frame = uint64 length (host byte order; counts the type byte) + uint8 type + JSON text.
enum class RpcType : uint8_t { kConnection = 0, kMetadata = 1, kNotify = 2, kProbe = 3 };

struct RpcFrame {
  RpcType type = RpcType::kProbe;
  std::string body;
};

/// Sends one request and reads the reply, all bounded by `timeout`. Errors name the peer and the step;
/// `refused` (optional) tells a refused connection (nothing listens at host:port) from any other failure.
StatusOr<RpcFrame> RpcCall(const std::string& host, uint16_t port, const RpcFrame& request,
                           std::chrono::milliseconds timeout, size_t max_length, bool* refused = nullptr);

/// The wire form of a frame: length, type byte, body.
std::string EncodeRpcFrame(const RpcFrame& f);
/// A frame from its type byte and body (`payload` = everything after the length field; not empty).
RpcFrame DecodeRpcFrame(std::string_view payload);

/// Serves RPC requests on a port, to anyone who connects: every connection is bounded in time and memory, and
/// a new peer always gets in.
///
/// - One thread polls every connection (no thread per connection): slow or idle clients cost a socket, not a
///   thread, and cannot hold up the others.
/// - A connection must deliver its request and take its reply within kServeBudget (5 s, Mooncake's accept
///   timeout) of being accepted, or it is closed.
/// - At most kMaxConnections are open: a new connection beyond that closes the oldest one (legitimate
///   exchanges take milliseconds; the oldest is the likeliest to be stuck or hostile). Running out of file
///   descriptors does the same.
/// - Requests buffered at once are bounded in bytes (kMaxBufferedBytes, or twice the frame limit when that is
///   larger): the oldest partial requests are dropped to make room.
///
/// Threading: Bind/Serve/Stop from one thread. The handler runs on the server's thread, one request at a
/// time, and only after Serve (whatever the caller set up before Serve is visible to it): it must be
/// thread-safe with respect to the rest of the program and must not block. It returns the reply body (the
/// reply carries the request's type), or an error, which is sent as {"error": "..."}; an exception it throws
/// is answered the same way.
class RpcServer {
 public:
  using Handler = std::function<StatusOr<std::string>(const RpcFrame&)>;
  static constexpr size_t kMaxConnections = 256;
  static constexpr std::chrono::seconds kServeBudget{5};
  static constexpr size_t kMaxBufferedBytes = 64 << 20;

  /// Since Start; read from any thread.
  struct Counters {
    uint64_t accepted = 0;
    uint64_t served = 0;     ///< requests answered
    uint64_t timed_out = 0;  ///< closed for running past kServeBudget
    uint64_t evicted = 0;    ///< closed to make room for newer connections or bytes
    uint64_t malformed = 0;  ///< closed for a bad frame length
    size_t open = 0;
  };

  RpcServer();
  ~RpcServer();

  /// Binds `ip` at `port`, or when port is 0 at a random free port in [min_port, max_port], and listens:
  /// peers that connect now wait in the backlog until Serve.
  Status Bind(const std::string& ip, uint16_t port, uint16_t min_port, uint16_t max_port, int backlog,
              size_t max_length);
  /// Starts answering requests with `handler` (after a successful Bind).
  Status Serve(Handler handler);
  /// Stops serving and closes the port (also after a Bind without Serve). Idempotent.
  void Stop();
  uint16_t port() const { return port_; }
  Counters counters() const;

 private:
  struct Conn;
  void Loop();
  void AcceptAll(net::Clock::time_point now);
  void Step(Conn& c, short revents, net::Clock::time_point now);
  void Read(Conn& c);
  void Reply(Conn& c);
  void Write(Conn& c, net::Clock::time_point now);
  /// Makes room for `bytes` more buffered request bytes by closing the oldest other partial requests.
  bool Reserve(const Conn& c, size_t bytes);
  void Close(Conn& c);
  Conn* Oldest(const Conn* except, bool partial_only);

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  size_t max_length_ = 1 << 20;
  size_t max_buffered_ = kMaxBufferedBytes;
  Handler handler_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  // Server thread only.
  std::vector<std::unique_ptr<Conn>> conns_;
  size_t buffered_ = 0;
  net::Clock::time_point listen_paused_until_{};
  net::Clock::time_point last_full_log_{};
  // Counters (written by the server thread).
  std::atomic<uint64_t> accepted_{0}, served_{0}, timed_out_{0}, evicted_{0}, malformed_{0};
  std::atomic<size_t> open_{0};
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_RPC_H_
