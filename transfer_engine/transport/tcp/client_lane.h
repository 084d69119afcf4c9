#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_CLIENT_LANE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_CLIENT_LANE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/transport/tcp/tcp_config.h"
#include "transfer_engine/core/batch.h"
#include "transfer_engine/transport/tcp/io_loop.h"
#include "transfer_engine/transport/tcp/wire.h"

namespace mooncake::te::tcp {

class ClientLane;

/// One network path to a peer: a local NIC address (empty: the kernel picks) and one of the peer's data
/// addresses. Shared by the path's lanes; its up/down state is decided by the transport.
struct Path {
  std::string local_ip;
  std::string remote_ip;
  uint16_t port = 0;
  std::string label;  ///< "segment via local -> remote:port", for messages
  std::atomic<bool> down{false};
  std::mutex mu;           // guards last_error
  std::string last_error;  ///< why it went down
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> slices{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> failovers{0};  ///< slices moved off this path after it failed
};

/// What a lane asks of whoever owns it. Called without any lane lock held.
class LaneOwner {
 public:
  virtual ~LaneOwner() = default;
  /// The lane has room for more slices.
  virtual void OnLaneRoom(ClientLane* lane) = 0;
  /// The lane's connection failed (or could not be made); `slices` were in flight on it and are not
  /// completed: the owner retries them elsewhere or fails them.
  virtual void OnLaneFailed(ClientLane* lane, std::vector<Slice*> slices, const Status& why) = 0;
  /// Where a slice's payload is sent from (WRITE) or received into (READ): the slice's own memory, or a staging
  /// buffer the owner keeps alive until OnSliceDone. Asked once each time the slice is queued on a lane.
  virtual char* PayloadBuffer(Slice* slice) { return slice->local; }
  /// The lane is done with a slice (answered, or failed for good): the owner completes it, exactly once.
  virtual void OnSliceDone(Slice* slice, const Status& status) { slice->Complete(status); }
};

/// One pooled connection along a path, pipelining many slices. Requests are written by whichever thread
/// enqueues them (no hand-off when the socket has room) and continued by the loop on EPOLLOUT; responses are
/// read by the loop thread, payloads straight into the slices' memory.
///
/// Threading: Enqueue/TryDrive from any thread; OnEvents/CheckTimeout on the loop thread; one mutex guards
/// the state. Slices are completed, and the owner called, outside the mutex.
class ClientLane : public EventHandler {
 public:
  ClientLane(const TcpConfig& config, IoLoop* loop, Path* path, LaneOwner* owner);
  ~ClientLane() override;

  /// Queues the slices; connects first if needed (bounded by the connect timeout).
  void Enqueue(const std::vector<Slice*>& slices);
  /// When the lane is idle: queues the slices and drives the socket on the calling thread (poll, no epoll
  /// hand-off) until their answers arrived or the lane failed; returns true. Returns false, doing nothing,
  /// when the lane is busy (the caller then uses Enqueue).
  bool TryDrive(const std::vector<Slice*>& slices);
  void OnEvents(uint32_t events) override;
  /// Fails the lane when it has work outstanding but moved no byte for MC_TCP_STALL_TIMEOUT (link down, peer
  /// frozen): its slices go back to the owner for another path.
  void CheckTimeout(std::chrono::steady_clock::time_point now);
  /// Closes the connection; outstanding slices go to the owner (`reroute`) or complete with `why`.
  void Abort(const Status& why, bool reroute);

  size_t outstanding_bytes() const { return outstanding_bytes_.load(std::memory_order_relaxed); }
  bool connected() const { return connected_.load(std::memory_order_relaxed); }
  Path* path() const { return path_; }

 private:
  using Completions = std::vector<std::pair<Slice*, Status>>;
  struct Pending {
    Slice* slice;
    char* buf;  // the payload's memory (PayloadBuffer)
    uint64_t seq;
    uint8_t header[kRequestHeaderSize];
    size_t sent;  // bytes of header + payload written so far
  };
  /// Work collected under the mutex, acted on after releasing it.
  struct Outcome {
    Completions done;
    std::vector<Slice*> failed;
    Status why;
  };

  Status ConnectLocked();
  bool QueueLocked(const std::vector<Slice*>& slices, Outcome* out);
  void FlushLocked(Outcome* out);
  void ReadLocked(Outcome* out);
  ssize_t RecvLocked(char* dst, size_t len, Outcome* out);
  void CloseLocked(const Status& why, bool reroute, Outcome* out);
  void CompleteFrontLocked(const Status& status, Outcome* out);
  void UpdateInterestLocked(bool want_write);
  void Settle(Outcome& out);

  const TcpConfig& config_;
  IoLoop* loop_;
  Path* path_;
  LaneOwner* owner_;
  std::mutex mu_;
  int fd_ = -1;
  bool want_write_ = false;
  bool driving_ = false;  // a caller thread drives the socket; the loop thread keeps off
  bool shut_ = false;     // aborted for good (reroute=false: the transport stops): never reconnects
  Status shut_why_;
  uint64_t next_seq_ = 1;
  std::deque<Pending> pending_;  // in request order; [0, send_index_) fully written
  size_t send_index_ = 0;
  uint8_t rbuf_[16384];
  size_t rstart_ = 0, rend_ = 0;
  size_t payload_left_ = 0;  // > 0 while receiving a READ payload for pending_.front()
  std::chrono::steady_clock::time_point last_progress_{};
  std::atomic<size_t> outstanding_bytes_{0};
  std::atomic<bool> connected_{false};
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_CLIENT_LANE_H_
