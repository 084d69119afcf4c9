#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_CLIENT_LANE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_CLIENT_LANE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/common/config.h"
#include "transfer_engine/core/batch.h"
#include "transfer_engine/transport/tcp/io_loop.h"
#include "transfer_engine/transport/tcp/wire.h"

namespace mooncake::te::tcp {

/// Shared state of one remote data endpoint (ip:port): reachability and counters.
struct PeerEndpoint {
  std::string host;
  uint16_t port = 0;
  std::string label;  ///< "segment (ip:port)" for messages
  std::mutex mu;      // guards down_until, last_error
  std::chrono::steady_clock::time_point down_until{};
  std::string last_error;
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> slices{0};
  std::atomic<uint64_t> errors{0};
};

/// One pooled connection to a peer, pipelining many slices. Requests are written by whichever thread
/// enqueues them (no hand-off when the socket has room) and continued by the loop on EPOLLOUT; responses
/// are read by the loop thread, payloads straight into the slices' memory.
///
/// Threading: Enqueue from any thread; OnEvents/CheckTimeout on the loop thread; one mutex guards the state.
/// Slices are completed outside the mutex.
class ClientLane : public EventHandler {
 public:
  ClientLane(const EngineConfig& config, IoLoop* loop, PeerEndpoint* peer);
  ~ClientLane() override;

  /// Queues the slices; connects first if needed. Fails them (never blocks past the connect timeout) when
  /// the peer is unreachable.
  void Enqueue(const std::vector<Slice*>& slices);
  /// When the lane is idle: queues the slices and drives the socket on the calling thread (poll, no epoll
  /// hand-off) until their answers arrived or the lane failed; returns true. Returns false, doing nothing,
  /// when the lane is busy (the caller then uses Enqueue).
  bool TryDrive(const std::vector<Slice*>& slices);
  void OnEvents(uint32_t events) override;
  /// Fails everything when the oldest outstanding slice waited longer than the transfer timeout.
  void CheckTimeout(std::chrono::steady_clock::time_point now);
  /// Closes the connection, failing outstanding slices with `why`.
  void Shutdown(const Status& why);

  size_t outstanding_bytes() const { return outstanding_bytes_.load(std::memory_order_relaxed); }
  bool connected() const { return connected_.load(std::memory_order_relaxed); }

 private:
  using Completions = std::vector<std::pair<Slice*, Status>>;
  struct Pending {
    Slice* slice;
    uint64_t seq;
    uint8_t header[kRequestHeaderSize];
    size_t sent;  // bytes of header + payload written so far
    std::chrono::steady_clock::time_point queued;
  };

  Status ConnectLocked();
  /// Connects if needed and appends the slices; on failure appends them to `done` and returns false.
  bool QueueLocked(const std::vector<Slice*>& slices, Completions* done);
  void FlushLocked(Completions* done);
  void ReadLocked(Completions* done);
  /// recv() into dst: bytes read (> 0), 0 when nothing is available, -1 after closing the lane on EOF/error.
  ssize_t RecvLocked(char* dst, size_t len, Completions* done);
  void CloseLocked(const Status& why, Completions* done);
  void UpdateInterestLocked(bool want_write);
  static void Finish(Completions& done);

  const EngineConfig& config_;
  IoLoop* loop_;
  PeerEndpoint* peer_;
  std::mutex mu_;
  int fd_ = -1;
  bool want_write_ = false;
  bool driving_ = false;  // a caller thread drives the socket; the loop thread keeps off
  uint64_t next_seq_ = 1;
  std::deque<Pending> pending_;  // in request order; [0, send_index_) fully written
  size_t send_index_ = 0;
  uint8_t rbuf_[16384];
  size_t rstart_ = 0, rend_ = 0;
  size_t payload_left_ = 0;  // > 0 while receiving a READ payload for pending_.front()
  std::atomic<size_t> outstanding_bytes_{0};
  std::atomic<bool> connected_{false};
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_CLIENT_LANE_H_
