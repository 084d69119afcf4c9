#ifndef MOONCAKE_TRANSFER_ENGINE_BENCH_BASELINE_H_
#define MOONCAKE_TRANSFER_ENGINE_BENCH_BASELINE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te::bench {

/// The yardsticks the Transfer Engine benchmark measures itself against, in the same run:
/// a plain single-stream TCP socket doing the same work (write = send N bytes, wait for an 8-byte ack;
/// read = ask for N bytes, receive them), and single-core memcpy.
///
/// Wire: 16-byte request {u64 op (1 write, 2 read), u64 length}, then the payload for a write.
class RawSocketServer {
 public:
  ~RawSocketServer();
  /// Listens on ip (port 0 = ephemeral); serves each connection on its own thread.
  StatusOr<uint16_t> Start(const std::string& ip);
  void Stop();

 private:
  void Serve(int fd);
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::vector<std::thread> workers_;
};

/// One blocking connection. Not thread-safe.
class RawSocketClient {
 public:
  ~RawSocketClient();
  Status Connect(const std::string& host, uint16_t port);
  /// `count` requests of `len` bytes each, pipelined (all sent, then all answers read).
  Status Write(const char* buf, size_t len, size_t count = 1);
  Status Read(char* buf, size_t len, size_t count = 1);

 private:
  int fd_ = -1;
};

/// Copies len bytes `iters` times on the calling thread; returns GB/s (1e9 bytes per second).
double MemcpyBandwidth(void* dst, const void* src, size_t len, int iters);

}  // namespace mooncake::te::bench

#endif  // MOONCAKE_TRANSFER_ENGINE_BENCH_BASELINE_H_
