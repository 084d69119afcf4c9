#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transfer_engine/core/topology.h"
#include "transfer_engine/transport/tcp/client_lane.h"
#include "transfer_engine/transport/tcp/device_stager.h"
#include "transfer_engine/transport/tcp/io_loop.h"
#include "transfer_engine/transport/tcp/tcp_config.h"
#include "transfer_engine/transport/tcp/server_connection.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::tcp {

/// TCP transport over every NIC pair a host has.
///
/// - Paths: each of the peer's advertised data addresses (`tcp_data_ips`) paired with the local NIC on its
///   subnet (NICs from the allow-list / MC_CUSTOM_TOPO_JSON); MC_TCP_LANES_PER_PEER pooled, pipelined
///   connections per path, driven by MC_TCP_IO_THREADS epoll loops.
/// - Striping: a peer's slices wait in one queue; each connection pulls more whenever it has less than
///   MC_TCP_LANE_WINDOW bytes in flight, so faster paths carry more (bandwidth adds up, slow paths get less).
/// - Failover: a path whose connection fails or moves no data for MC_TCP_STALL_TIMEOUT_MS is marked down; its
///   slices go back to the queue for the other paths (at most MC_RETRY_CNT times each); a prober reconnects
///   down paths every MC_TCP_PROBE_INTERVAL_MS and puts them back into service. Only with no path left do
///   slices fail, with an error naming the peer and every path tried.
/// - Target side: one listener on all NICs; zero-copy into/out of registered memory (server_connection.h).
///   Any peer may connect, so connections are bounded: one that stalls in the middle of a frame for twice
///   MC_TRANSFER_TIMEOUT is closed (it may hold registered memory; its own client gave the slice up after
///   one MC_TRANSFER_TIMEOUT, and an unregistration stopped waiting for it then), and so is one that spends
///   that long on one request frame; beyond kMaxServerConnections (or half the descriptor limit), or when
///   descriptors run out, the quietest connection is closed to let a new one in (an idle pooled client
///   simply reconnects). Closing happens on the victim's loop, so during a burst of connections each new one
///   picks another victim, and at most limit/8 + 1 evictions are pending at once: beyond that (or with no
///   victim left) a new connection is closed at once ("refused"). ListenerStats() counts all three and the
///   most connections ever open ("peak").
/// - Device memory (any device kind a usable platform serves; declined at registration otherwise) goes through
///   a bounded pool of pinned host memory (device_stager.h, MC_TCP_STAGING_POOL_BYTES, allocated at the first
///   device registration, never on an I/O thread), one buffer per slice, so the copies of one slice overlap the
///   network transfer of others; slices wait for a buffer when the pool is used up. A local WRITE source is
///   copied to staging before its slice is queued, a local READ destination is filled from staging after its
///   payload arrived, and the target stages its own device memory in chunks (server_connection.h). Copies are
///   waited for on the stager's threads, never on an I/O thread.
class TcpTransport : public Transport, private LaneOwner {
 public:
  TcpTransport();
  ~TcpTransport() override;

  std::string name() const override { return "tcp"; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  std::string advertised_address() const override { return tcp_.bind_address; }
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  /// A device region that was staged: drops its hold on the platform's staging pool (freed after the last one).
  void UnregisterRegion(const MemoryRegion& region) override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  size_t slice_size() const override;
  nlohmann::json Stats() const override;
  nlohmann::json ListenerStats() const override;

 private:
  struct Peer;
  struct PeerPath : Path {
    Peer* peer = nullptr;
    std::string nic;  ///< local NIC name ("" when the kernel routes)
    std::vector<std::unique_ptr<ClientLane>> lanes;
    /// Measured throughput (bytes/s, EWMA over busy 100 ms ticks; 0 until measured). Sizes each lane's
    /// window so a slow path holds little work when a transfer ends. Written by loop 0's tick only.
    std::atomic<double> rate{0};
    uint64_t sampled_bytes = 0;
  };
  struct Peer {
    std::string name;
    std::vector<std::unique_ptr<PeerPath>> paths;
    std::mutex mu;              // guards queue
    std::deque<Slice*> queue;   // slices waiting for a connection with room
    std::atomic<uint32_t> next{0};
    std::atomic<bool> dispatch_requested{false};  // a loop thread needs a connection made: the prober does it
  };
  class Acceptor;

  static constexpr size_t kMaxServerConnections = 4096;
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};

  Peer* GetPeer(const SegmentDescriptor& desc, Status* error);
  void OnAccept(int fd);
  void OnAcceptFailed(int err);  // loop 0
  struct ServerConn {
    ServerConnection* conn;
    bool evicting = false;  // a close is posted to its loop
  };
  /// Picks the server connection that moved no byte for the longest time (not one already being evicted)
  /// and posts its close to its loop. conns_mu_ held. False when there is none.
  bool EvictQuietestLocked(const std::string& why);
  void CloseStalledConnections(IoLoop* loop, std::chrono::steady_clock::time_point now);
  std::chrono::seconds StallLimit() const { return 2 * config_->transfer_timeout; }
  static size_t MaxServerConnections();
  void OnTick(size_t loop_index);
  void ProbeLoop();

  // LaneOwner
  void OnLaneRoom(ClientLane* lane) override;
  void OnLaneFailed(ClientLane* lane, std::vector<Slice*> slices, const Status& why) override;
  char* PayloadBuffer(Slice* slice) override;
  void OnSliceDone(Slice* slice, const Status& status) override;

  /// Whether the slice's local memory is device memory (moved through a staging buffer).
  static bool Staged(const Slice* s) { return s->task != nullptr && s->task->route.local_kind.is_device(); }
  /// Gives a staged slice its staging buffer from the pool (now or when one is free); a WRITE is queued once its
  /// source was copied into it, a READ at once. A slice that cannot be staged is completed with the error.
  void Stage(Peer* peer, Slice* s);
  /// Appends a slice to the peer's queue and dispatches (unless the peer's Submit on this thread will).
  void Queue(Peer* peer, Slice* s);
  /// Drops a staged slice's staging buffer (no-op for host slices); the buffer, or null.
  StagingRef Unstage(Slice* s);
  /// Complete / Fail for slices this transport gives up on, releasing their staging first.
  void Finish(Slice* s, const Status& st);
  void FailSlice(Slice* s, const Status& st, SliceRetry retry);
  /// Hands queued slices to every connection of every live path that has room; fails the queue when no
  /// path is left.
  void Dispatch(Peer* peer);
  void Refill(ClientLane* lane);
  /// Asks the prober thread to run Dispatch(peer) (used where connecting would block an epoll thread).
  void RequestDispatch(Peer* peer);
  size_t LaneWindow(const PeerPath& path) const;
  void SampleRates(std::chrono::steady_clock::time_point now);
  void MarkDown(PeerPath* path, const Status& why);
  static std::string NoPathError(const Peer& peer);
  static ClientLane* IdlestLane(Peer* peer);

  TransportContext ctx_;
  const EngineConfig* config_ = nullptr;  // engine-wide: timeouts, retry count, topology file
  TcpConfig tcp_;
  std::vector<NicInfo> local_nics_;     // empty: loopback-only / single address
  std::vector<std::string> data_ips_;   // advertised, first = ctx_.advertised_ip
  std::vector<std::unique_ptr<IoLoop>> loops_;
  std::unique_ptr<Acceptor> acceptor_;
  int listen_fd_ = -1;
  uint16_t data_port_ = 0;
  std::atomic<size_t> next_loop_{0};
  std::atomic<bool> stopped_{false};
  std::chrono::steady_clock::time_point last_sample_{};
  std::chrono::steady_clock::time_point last_stats_log_{};  // loop 0 only

  mutable std::mutex peers_mu_;
  std::map<std::string, std::unique_ptr<Peer>> peers_;  // by peer instance; never erased before Stop()

  mutable std::mutex conns_mu_;  // guards conns_, next_conn_id_, pending_evictions_, peak_conns_, last_evict_log_
  std::map<uint64_t, ServerConn> conns_;  // by serial id: an id is never reused (addresses are)
  uint64_t next_conn_id_ = 1;
  size_t pending_evictions_ = 0;
  size_t peak_conns_ = 0;
  std::chrono::steady_clock::time_point last_evict_log_{};
  uint64_t unlogged_evictions_ = 0;
  size_t max_server_conns_ = kMaxServerConnections;
  std::atomic<uint64_t> evicted_{0}, stalled_{0}, refused_{0};
  std::chrono::steady_clock::time_point accept_paused_until_{};  // loop 0 only
  std::chrono::steady_clock::time_point last_accept_log_{};      // loop 0 only

  std::unique_ptr<DeviceStager> stager_;
  std::mutex staged_mu_;
  std::unordered_map<const Slice*, StagingRef> staged_;  // staged slices between Stage and OnSliceDone

  std::mutex probe_mu_;
  std::condition_variable probe_cv_;
  bool dispatch_pending_ = false;  // guarded by probe_mu_
  std::thread prober_;
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_TRANSPORT_H_
