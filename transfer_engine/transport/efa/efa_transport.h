#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_TRANSPORT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "transfer_engine/transport/efa/efa_config.h"
#include "transfer_engine/transport/efa/efa_descriptor.h"
#include "transfer_engine/transport/efa/efa_epoch.h"
#include "transfer_engine/transport/efa/fabric_api.h"
#include "transfer_engine/transport/efa/fabric_domain.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::efa {

/// RMA over libfabric (any provider with FI_EP_RDM and FI_RMA: efa on AWS, verbs;ofi_rxm, and the software
/// providers tcp;ofi_rxm and shm). libfabric is dlopen'ed (fabric_api.h).
///
/// NICs: one domain (RDM endpoint, address vector, completion queue, progress thread) per NIC the device
/// filter allows (fabric_domain.h, FabricDomain::OpenAll). Each local NIC is paired with one NIC of a peer
/// (the same IPv4 subnet where addresses are IP, else by index): a path. A submission's slices are spread
/// over the peer's paths that are up, each to the one with the fewest bytes in flight. A path whose operation
/// fails or times out is down for 5 s (then tried again); its slices move to another path, each at most
/// MC_RETRY_CNT times (Slice::attempts); with no path left they fail with SliceRetry::kOtherPath (another
/// transport may reach the peer).
///
/// Memory: every host registration is registered with every domain, in chunks of at most
/// `efa.max_mr_size`; a slice that crosses a chunk (local or remote) is posted as several operations.
/// Descriptor fields: efa_descriptor.h.
///
/// Trust: providers do not protect memory (a wrong key on tcp kills the connection without an error; shm
/// writes past the end of a region), so nothing is posted outside what the peer's descriptor lists, and a
/// submission is posted only once the peer's registration epoch was read back equal to the descriptor's,
/// at most half the peer's efa_epoch_lease_us before (a lease; WithdrawRegion waits the whole lease after
/// moving the epoch on; the argument is in efa_submit.cc, Start): when it moved on since the descriptor was
/// fetched (memory was withdrawn), the slices fail with kStaleMetadata and kRefreshPeer before any byte moves.
/// Where a write's completion does not mean delivery, each path's writes end with another epoch read on that
/// path. A peer that publishes no epoch (a Mooncake engine) gets neither check.
///
/// Device memory (cuda, rocm) is registered with fi_mr_regattr where every domain was opened with FI_HMEM
/// (efa.hmem, a usable device platform, and the provider offers it); else, or when the provider refuses a
/// region, it is declined with the reason.
///
/// Threading: Submit and SubmitAndDrive from any thread; completions on the domains' progress threads, or
/// on the thread inside SubmitAndDrive (including other submissions' completions it reaps meanwhile).
struct DriveCount;

class EfaTransport : public Transport {
 public:
  EfaTransport();
  /// Uses `api` instead of the libfabric LoadFabricApi loads (a fake of the table, testing/); outlives this.
  explicit EfaTransport(const FabricApi* api) : EfaTransport() { injected_api_ = api; }
  ~EfaTransport() override;

  std::string name() const override { return "efa"; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  /// Host memory, and device memory where FI_HMEM is on: registered with every domain. Other kinds, and
  /// device memory the provider refuses, are declined with the reason.
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  /// A remotely accessible region: moves the registration epoch on, then waits efa.epoch_lease_us, so no
  /// peer holds a lease on the old value when it returns.
  void WithdrawRegion(const MemoryRegion& region) override;
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  /// A submission of at most efa.drive_max_bytes is posted and its completions reaped on the calling thread
  /// (no hand-off to the progress thread either way) for up to efa.drive_us; what is left then completes
  /// on the progress threads. Larger ones go to Submit.
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  size_t slice_size() const override { return slice_size_; }
  /// Per peer: bytes, slices, errors, stale_epoch, state, and `paths` (local and remote NIC, state, bytes, and
  /// local_drives: how many synchronous calls reaped on the local NIC, for all peers).
  nlohmann::json Stats() const override;

  /// The domains (NICs) in use, in rail order (for logs and tests): empty before Start.
  std::vector<DomainInfo> domains() const;
  /// The first domain's (empty before Start).
  DomainInfo domain_info() const;

 private:
  struct Rail;
  struct Path;
  struct Peer;
  struct Item;
  struct Run;
  struct Group;

  std::shared_ptr<Peer> PeerFor(const SegmentDescriptor& desc, Status* error);
  /// Submit's work; with `drive`, the items it starts count down drive->left as they finish.
  void SubmitItems(const SegmentDescriptor& desc, const std::vector<Slice*>& slices,
                   const std::shared_ptr<DriveCount>& drive);
  /// The up path of `peer` with the fewest bytes in flight, or -1. `revive`: down paths due again are tried
  /// again first (new submissions; a slice moving after a failure takes only paths that are up, so a dead
  /// peer's slices do not wander over its paths as each one is revived).
  int ChoosePath(Peer& peer, bool revive);
  void PathFailed(Peer& peer, int path, const Status& why);
  /// Checks the epoch (a lease, or a read on some path that items expecting the same value share), then
  /// spreads the items over the paths; each item's operations must be posted within the lease (post_by).
  void Start(const std::shared_ptr<Peer>& peer, std::shared_ptr<std::vector<Item>> items, uint64_t expected,
             bool revive);
  void Distribute(const std::shared_ptr<Peer>& peer, std::vector<Item> items, bool revive);
  void PostGroup(const std::shared_ptr<Group>& g);
  void RunDone(const std::shared_ptr<Group>& g, const std::shared_ptr<Run>& run);
  void GroupItemDone(const std::shared_ptr<Group>& g);
  /// Moves a failed item to another path (through Start: the epoch is checked again unless a lease covers
  /// it), or completes it with `why`. `count`: the move counts against MC_RETRY_CNT (not for an item that
  /// only missed its lease).
  void Retry(const std::shared_ptr<Peer>& peer, Item item, const Status& why, bool count = true);
  /// Reads the peer's epoch on `path`; with `drive`, its rail is driven by that SubmitAndDrive caller.
  void ReadEpoch(const std::shared_ptr<Peer>& peer, int path, const std::shared_ptr<DriveCount>& drive,
                 std::function<void(const Status&, uint64_t)> then);
  /// Has the SubmitAndDrive caller of `drive` (if any, and still driving) reap `rail` too.
  void DriveRail(const std::shared_ptr<DriveCount>& drive, int rail);
  void Finish(Peer& peer, Slice* s, const Status& st);
  void Finish(Peer& peer, const Item& item, const Status& st);

  EfaConfig cfg_;
  TransportContext ctx_;
  const FabricApi* api_ = nullptr;
  const FabricApi* injected_api_ = nullptr;  // used instead of LoadFabricApi when set
  std::unique_ptr<EpochPage> epoch_;           // outlives the rails, which register it
  std::vector<std::unique_ptr<Rail>> rails_;
  size_t slice_size_ = 1 << 20;
  bool software_provider_ = true;
  bool same_host_only_ = false;
  bool hmem_asked_ = false;  // Start asked for FI_HMEM (efa.hmem and a usable device platform)
  bool hmem_ = false;        // every domain was opened with FI_HMEM: device memory is registered
  bool mooncake_names_ = false;  // the engine publishes "efa": Mooncake's field names
  int retry_count_ = 9;
  std::atomic<bool> stopping_{false};  // Stop began: failed slices are not moved to another path

  mutable std::mutex mu_;                               // guards peers_
  std::map<std::string, std::shared_ptr<Peer>> peers_;  // by the peer's instance id
};

/// Whether libfabric loads and finds a provider: FI_PROVIDER's, else efa or verbs. Software providers are
/// used only when FI_PROVIDER (or the efa.provider option) names them, so the plugin never joins engines
/// of hosts without an EFA or verbs device unless asked to.
/// When usable, its reason says whether the provider offers FI_HMEM (HmemSummary).
TransportProbe ProbeEfa();

/// One line on device memory: registered with fi_mr_regattr where `offered`, else declined.
std::string HmemSummary(const std::string& provider, bool offered);

/// The libfabric interface of a device memory kind (cuda: FI_HMEM_CUDA with the ordinal, rocm: FI_HMEM_ROCR),
/// or nullopt for kinds libfabric 1.17 names none for (npu, musa) and non-device kinds.
std::optional<HmemTarget> HmemTargetFor(const MemoryKind& kind);

}  // namespace mooncake::te::efa

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_TRANSPORT_H_
