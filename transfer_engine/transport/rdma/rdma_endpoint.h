#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_ENDPOINT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_ENDPOINT_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/rdma/rdma_config.h"
#include "transfer_engine/transport/rdma/rdma_nic.h"

namespace mooncake::te::rdma {

/// One work request the transport wants done: a contiguous piece of a slice, with the keys of the NIC pair it
/// was given to. `job` is the transport's (opaque here).
struct WorkItem {
  uint64_t local = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote = 0;
  uint32_t rkey = 0;
  bool read = false;
  size_t pair = 0;            ///< the (local NIC, peer NIC) pair index it was posted on
  /// Set at its first wait for a paused or draining endpoint: it may wait again until then (zero: never waited).
  std::chrono::steady_clock::time_point wait_limit{};
  std::shared_ptr<void> job;  ///< the slice piece's owner (the transport's SliceJob)
};

/// What each side of an RC connection tells the other (the "rdma.connect" request and reply).
struct QpAddress {
  std::string nic;  ///< the HCA's name
  uint32_t qpn = 0;
  uint32_t psn = 0;
  ibv_gid gid{};
  uint16_t lid = 0;
  int mtu = 0;  ///< IBV_MTU_*: the sender's active MTU capped by its MC_MTU (AdvertisedMtu)
  /// RDMA READs the sender serves at once as a responder (its max_qp_rd_atom); 0: not sent (an older peer).
  int rd_atom = 0;
};

/// The MTU this end advertises in a handshake: the port's active MTU capped by MC_MTU. Both ends then take the
/// minimum of their own and the peer's value, so their QPs agree on the path MTU (RC needs the same on both).
int AdvertisedMtu(const NicInfo& nic, const RdmaConfig& cfg);

/// Work requests in flight on one CQ, bounded by its size (shared by the endpoints using that CQ).
struct CqBudget {
  explicit CqBudget(int capacity) : capacity(capacity) {}
  const int capacity;
  std::atomic<int> inflight{0};
  std::atomic<bool> starved{false};  ///< an endpoint found the CQ full: kick endpoints after completions
};

/// Which end of a connection a QP is: the requester posts RDMA WRITE/READ (no remote access of its own); the
/// responder only serves them (remote read/write access, no send queue to speak of).
enum class QpRole { kRequester, kResponder };

/// Moves a QP through INIT -> RTR -> RTS towards `peer` (both sides use it). An errno text on failure.
Status ConnectQp(const VerbsApi* api, ibv_qp* qp, const NicInfo& local, const QpAddress& peer, uint32_t local_psn,
                 const RdmaConfig& cfg, QpRole role);
/// A new RC QP on `nic` using CQ `cq`; null with errno.
ibv_qp* CreateQp(RdmaNic& nic, size_t cq, const RdmaConfig& cfg, QpRole role);

/// The requester end of one RC connection (local NIC -> peer NIC) to one peer: its QP, the work requests in
/// flight (at most cfg.max_wr, and within the CQ's budget) and those waiting for room.
///
/// States: idle (no QP; after a failure, not usable until the backoff passes), connected, failed (an error
/// completion arrived: nothing new is posted; the WRs still in flight come back flushed, then the QP is
/// destroyed and the endpoint is idle again). The backoff doubles with each consecutive failure up to
/// cfg.rail_pause, and resets after a success. Thread-safe.
class Endpoint {
 public:
  /// Performs the handshake: sends our address, returns the peer's. Called without the endpoint's lock.
  using Handshake = std::function<StatusOr<QpAddress>(const QpAddress& ours)>;

  /// `peer_segment`, `peer_nic`: where the QP leads (for "rdma.close"; opaque here).
  Endpoint(std::shared_ptr<RdmaNic> nic, size_t nic_index, std::shared_ptr<CqBudget> budget, size_t cq,
           const RdmaConfig& cfg, std::string label, std::string peer_segment = "", std::string peer_nic = "");
  ~Endpoint();

  const std::string& label() const { return label_; }
  const std::string& peer_segment() const { return peer_segment_; }
  const std::string& peer_nic() const { return peer_nic_; }
  size_t nic_index() const { return nic_index_; }
  /// False while failed, or idle within the backoff.
  bool Usable() const;
  /// When a paused endpoint may be used again: the end of its backoff (idle), or, while it drains after a failure
  /// (failed), that end but at least a short drain time from now. nullopt when usable now, or closed.
  std::optional<std::chrono::steady_clock::time_point> PausedUntil() const;
  /// Connects when idle (a blocking handshake); ok when connected. On failure the endpoint backs off. The QP
  /// number, once connected, is reported through `on_qp` (the transport's completion routing).
  Status EnsureConnected(const Handshake& handshake, const std::function<void(uint32_t qpn)>& on_qp);
  /// Takes the items and posts what fits; false (items untouched) when not connected. When posting fails the
  /// endpoint fails and its waiting items are handed back in `flushed`; when that destroyed the QP (nothing was
  /// in flight), its number is stored in `*destroyed_qpn` (else 0): the caller stops routing it.
  bool Enqueue(std::vector<std::unique_ptr<WorkItem>>& items, std::vector<std::unique_ptr<WorkItem>>* flushed,
               uint32_t* destroyed_qpn);
  /// Posts waiting items that now fit (the CQ budget moved); as Enqueue for `flushed` and `destroyed_qpn`.
  void Kick(std::vector<std::unique_ptr<WorkItem>>* flushed, uint32_t* destroyed_qpn);

  struct Completed {
    /// The completed item: a success, or the error that failed the endpoint (the offending WR); null when the
    /// id is unknown or the item was flushed behind another WR's error (held for `resubmit`).
    std::unique_ptr<WorkItem> item;
    /// Items that were not at fault (flushed in flight, or waiting, when another WR failed the endpoint),
    /// handed back together once the endpoint was reset (its QP destroyed), to be moved again without charging
    /// their retry budget.
    std::vector<std::unique_ptr<WorkItem>> resubmit;
    bool failed_now = false;     // this completion moved the endpoint to failed
    /// Non-zero: this completion destroyed the QP (the failure's reset, the last WR of a retired endpoint, or a
    /// failure with nothing else in flight): the caller stops routing it.
    uint32_t destroyed_qpn = 0;
  };
  /// A completion of this endpoint's QP (polling thread).
  Completed OnCompletion(const ibv_wc& wc);
  /// Moves a connected endpoint to failed (e.g. a post failed); its waiting items are returned. As Enqueue for
  /// `destroyed_qpn`.
  std::vector<std::unique_ptr<WorkItem>> Fail(const std::string& why, uint32_t* destroyed_qpn);
  /// No new work will come (the peer was forgotten): the QP is destroyed once nothing is in flight. Returns the
  /// QP number when that happened now (0 otherwise; OnCompletion reports it later).
  uint32_t Retire();
  /// Destroys the QP at once and returns every item (in flight or waiting). Later calls return nothing.
  std::vector<std::unique_ptr<WorkItem>> Close(uint32_t* qpn);

  /// A QP this endpoint destroyed, with the PSN it connected with (a reconnect whose HCA reused the QPN has
  /// another): what "rdma.close" names.
  struct ClosedQp {
    uint32_t qpn = 0;
    uint32_t psn = 0;
  };
  /// The QPs destroyed since the last call (at most the last 64).
  std::vector<ClosedQp> TakeClosedQps();

  /// "idle", "connected", "failed: <why>", "paused <ms> ms: <why>".
  std::string StateText() const;
  uint64_t failures() const {
    std::lock_guard lock(mu_);
    return total_failures_;
  }
  /// Work requests in flight or waiting (the striping weight: a faster path drains sooner and gets more).
  size_t load() const {
    std::lock_guard lock(mu_);
    return inflight_.size() + waiting_.size();
  }
  /// Measured throughput in bytes/s: an average over busy periods (from the first post until nothing is in
  /// flight); 0 until one ended.
  double rate() const {
    std::lock_guard lock(mu_);
    return rate_;
  }
  /// Bytes of successful work requests.
  uint64_t bytes() const { return bytes_.load(); }

 private:
  enum class State { kIdle, kConnected, kFailed };
  /// Returns the QPN when a post failure destroyed the QP (else 0).
  uint32_t PostLocked(std::vector<std::unique_ptr<WorkItem>>* flushed);
  /// The QP failed: its waiting work goes to `out`, work in flight comes back flushed. `path_fault`: the path
  /// itself is suspect (backoff before reconnecting); false for a peer's refusal of a range (a remote access
  /// error after it unregistered memory: routine, so the endpoint reconnects at once). Returns the QPN when the
  /// QP was destroyed now (nothing in flight), else 0.
  uint32_t FailLocked(const std::string& why, std::vector<std::unique_ptr<WorkItem>>* out, bool path_fault = true);
  uint32_t DestroyQpLocked();

  std::shared_ptr<RdmaNic> nic_;
  const size_t nic_index_;
  std::shared_ptr<CqBudget> budget_;
  const size_t cq_;
  const RdmaConfig cfg_;
  const std::string label_;
  const std::string peer_segment_, peer_nic_;

  mutable std::mutex mu_;
  std::mutex connect_mu_;  // one handshake at a time
  State state_ = State::kIdle;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;  // the PSN qp_ connected with
  std::vector<ClosedQp> closed_qps_;
  bool closed_ = false;
  bool retired_ = false;
  std::chrono::steady_clock::time_point retry_after_{};
  int consecutive_failures_ = 0;
  uint64_t total_failures_ = 0;
  std::atomic<uint64_t> bytes_{0};
  std::chrono::steady_clock::time_point busy_since_{};  // when the current busy period began
  uint64_t busy_bytes_ = 0;                              // bytes completed in it
  double rate_ = 0;
  std::string why_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<WorkItem>> inflight_;
  std::deque<std::unique_ptr<WorkItem>> waiting_;
  std::vector<std::unique_ptr<WorkItem>> held_;  // not at fault, waiting for the reset (Completed::resubmit)
};

}  // namespace mooncake::te::rdma

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_ENDPOINT_H_
