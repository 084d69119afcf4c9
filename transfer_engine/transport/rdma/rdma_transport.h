#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "transfer_engine/common/work_queue.h"
#include "transfer_engine/transport/rdma/rdma_config.h"
#include "transfer_engine/transport/rdma/rdma_endpoint.h"
#include "transfer_engine/transport/rdma/rdma_nic.h"
#include "transfer_engine/transport/rdma/rdma_responder.h"
#include "transfer_engine/transport/rdma/verbs_api.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::rdma {

class RdmaRegionState;
enum class RegPath : uint8_t;

/// RDMA WRITE / READ over ibverbs RC queue pairs (RoCE, InfiniBand). libibverbs is dlopen'ed (verbs_api.h).
///
/// NICs: every HCA the allow-list (device_name, else MC_TE_FILTERS) admits and InspectDevice accepts, each with
/// its own context, PD, CQs and polling threads (rdma_nic.h); skipped HCAs are logged with the reason.
/// Memory: every registration is registered on every NIC (host memory with ibv_reg_mr; device memory through
/// dma-buf or peer memory, else declined), in chunks of at most the smallest max_mr_size (or MC_MAX_MR_SIZE),
/// as a local MR and, for remote-accessible memory, a remote MR; the buffer's descriptor entry gets Mooncake's
/// `lkey[]`/`rkey[]` (indexed like `devices`, first chunk) and, for a chunked region, `rdma_chunk_size` and
/// `rdma_chunk_rkeys[device][chunk]`. Withdrawal deregisters the remote MRs at once.
/// The segment descriptor gets `devices: [{name, lid, gid}]`.
/// Connections: one RC QP per (local NIC, peer NIC), made on first use through the handshake methods
/// "rdma.connect" (QPN, PSN, GID, LID, MTU each way; the passive end is RTS before it replies) and
/// "rdma.ready". Slices are cut at registration-chunk boundaries, striped over the rails (local NIC i with peer
/// NIC i) by expected finish time (bytes queued / measured throughput), preferring the rails of the local NICs
/// nearest the memory (topology matrix, else NUMA node), other pairs only when no rail is usable, and posted with
/// at most MC_MAX_WR in flight per QP.
/// Errors: an error completion fails only its endpoint (backoff, doubling to MC_RDMA_RAIL_PAUSE_SECONDS) and
/// charges only its own WR; that WR moves to another NIC pair, at most MC_RETRY_CNT times per slice, then the
/// slice fails with kRefreshPeer once, then kOtherPath; the WRs flushed behind it move again, uncharged, once
/// the endpoint was reset; a retry or resubmission that finds only paused pairs waits (once) for the earliest;
/// a destroyed requester QP is announced to the peer ("rdma.close", best effort);
/// IBV_WC_REM_ACCESS_ERR (the peer no longer registers the range) fails with kRemoteRejected and kRefreshPeer.
/// Every remote range is checked against the peer's descriptor before posting; every descriptor and handshake
/// field from a peer is validated.
/// Threading: Submit from any thread (it may block for a handshake); completions on the NICs' polling threads;
/// retries and reconnections on the transport's retry pool, one strand per peer.
class RdmaTransport : public Transport {
 public:
  RdmaTransport();
  /// With a given verbs table (tests); LoadVerbsApi() otherwise.
  explicit RdmaTransport(const VerbsApi* api);
  ~RdmaTransport() override;

  std::string name() const override { return "rdma"; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  /// Host memory: ibv_reg_mr. Device memory: ibv_reg_dmabuf_mr on region.backing_fd (the dma-buf the platform
  /// exported) when there is one, else ibv_reg_mr on the pointer when a peer-memory client is loaded, else
  /// declined with both reasons. Each NIC gets a local-only MR (lkey[]) and, for remote-accessible memory, a
  /// remote MR (rkey[]). The region's preferred NICs: those the topology matrix (MC_CUSTOM_TOPO_JSON) lists
  /// first for its location, else those on its NUMA node (host memory).
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  /// Deregisters the remote MRs: a peer's late access fails with a remote access error from now on.
  void WithdrawRegion(const MemoryRegion& region) override;
  void UnregisterRegion(const MemoryRegion& region) override;
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  /// Whether this engine's descriptor carries rdma's fields. Mooncake names them `devices`, `lkey[]`, `rkey[]`
  /// for rdma and for efa alike; an engine publishing protocol "efa" gives those names to the efa transport, so
  /// rdma then only initiates (peers cannot target this engine over rdma).
  bool Publishes() const { return ctx_.protocol != "efa"; }
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  size_t slice_size() const override { return cfg_.slice_size; }
  nlohmann::json Stats() const override;
  /// {"responder_qps": the responder QPs this engine keeps for its peers' connections}.
  nlohmann::json ListenerStats() const override;

  /// The NICs in use (for logs and tests).
  std::vector<NicInfo> nics() const;
  /// How this transport registered `region` ("host", "dma-buf", "peer memory"); "" when it holds no state for
  /// it (declined, or not registered). For logs and tests.
  static std::string RegistrationPath(const MemoryRegion& region);

 private:
  struct Peer;
  struct PeerNic;
  struct SliceJob;
  struct PeerCounters;
  class DelayQueue;

  Status LoadTopology(const std::string& path);
  std::vector<bool> PreferredNics(const MemoryRegion& region, std::string* why) const;
  StatusOr<std::shared_ptr<RdmaRegionState>> RegisterWith(const MemoryRegion& region, RegPath path,
                                                          nlohmann::json* fields) const;
  std::shared_ptr<Peer> PeerFor(const SegmentDescriptor& desc, Status* error);
  /// Posts the items on the peer's NIC pairs. `retry`: they failed on item->pair, which they avoid. `on_strand`:
  /// called on the peer's strand (a retry or a resubmission), where items that find only paused pairs wait for
  /// the earliest of them (once per item) instead of failing.
  void Dispatch(const std::shared_ptr<Peer>& peer, std::vector<std::unique_ptr<WorkItem>> items, bool retry,
                bool on_strand = false);
  bool SetKeys(const Peer& peer, WorkItem& item, size_t pair) const;
  StatusOr<QpAddress> Handshake(const Peer& peer, size_t peer_nic, const QpAddress& ours);
  void OnCompletion(size_t nic, const ibv_wc& wc);
  void Route(size_t nic, uint32_t qpn, const std::shared_ptr<Endpoint>& ep);
  void Unroute(size_t nic, uint32_t qpn, const Endpoint* ep);
  /// `ep` destroyed its QP `qpn` (non-zero): stops routing it and tells the peer's responder ("rdma.close",
  /// best effort, on closer_; skipped once stopping) so its QP goes too.
  void QpDestroyed(const std::shared_ptr<Endpoint>& ep, uint32_t qpn);
  void ItemFailed(std::unique_ptr<WorkItem> item, const Status& status, bool remote_access);
  /// Moves items that were not at fault again (on their peer's strand), without charging a retry.
  void Resubmit(std::vector<std::unique_ptr<WorkItem>> items);
  /// Runs `fn` on the worker pool after the peer's earlier jobs (one strand per peer).
  void RunForPeer(const std::shared_ptr<Peer>& peer, std::function<void()> fn);
  /// The live Peer for `old`'s key (re-made with fresh endpoints when it was forgotten meanwhile); null once
  /// stopping (Stop emptied the peers: none may come back).
  std::shared_ptr<Peer> CurrentPeer(const std::shared_ptr<Peer>& old);
  std::shared_ptr<Peer> MakePeerLocked(const std::string& key, const std::string& segment,
                                       const std::vector<PeerNic>& nics);
  /// Endpoints of a peer that is no longer used: idle ones close now, busy ones once drained.
  void RetireEndpoints(const Peer& peer);
  void FinishPiece(const std::shared_ptr<SliceJob>& job, const Status& status, SliceRetry retry);
  /// How a slice that no NIC pair could move fails: kRefreshPeer once, then kOtherPath.
  SliceRetry PathsExhausted(const SliceJob& job) const;

  const VerbsApi* api_ = nullptr;
  bool api_given_ = false;
  RdmaConfig cfg_;
  TransportContext ctx_;
  std::vector<std::shared_ptr<RdmaNic>> nics_;
  std::vector<std::vector<std::shared_ptr<CqBudget>>> budgets_;  // [nic][cq]
  uint64_t chunk_size_ = 0;  // registration chunk; 0: unlimited
  std::map<std::string, std::vector<std::string>> topology_;  // location -> its preferred NIC names
  std::unique_ptr<WorkQueue> worker_;  // retries and their reconnections, one strand per peer
  std::unique_ptr<DelayQueue> delayed_;  // items waiting for a paused endpoint (handed to the peer's strand)
  /// "rdma.close" calls, one at a time: a hung peer delays only other closes, never retries or handshakes.
  std::unique_ptr<WorkQueue> closer_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;  // guards peers_, routes_
  std::map<std::string, std::shared_ptr<Peer>> peers_;  // by the peer's instance id (else its name)
  std::unordered_map<uint64_t, std::shared_ptr<Endpoint>> routes_;  // (nic << 32 | qpn) -> endpoint
  std::map<std::string, std::shared_ptr<PeerCounters>> counters_;  // by segment name
  std::unique_ptr<Responder> responder_;  // the passive end of "rdma.connect"
};

/// Whether libibverbs loads and shows a usable HCA ("no RDMA device" here), and what device memory paths exist.
TransportProbe ProbeRdma();

}  // namespace mooncake::te::rdma

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_TRANSPORT_H_
