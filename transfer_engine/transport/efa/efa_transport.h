#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/transport/efa/efa_config.h"
#include "transfer_engine/transport/efa/fabric_api.h"
#include "transfer_engine/transport/efa/fabric_domain.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::efa {

/// RMA over libfabric (any provider with FI_EP_RDM and FI_RMA: efa on AWS, verbs;ofi_rxm, and the software
/// providers tcp;ofi_rxm and shm). libfabric is dlopen'ed (fabric_api.h); one domain with one RDM endpoint,
/// address vector and completion queue (fabric_domain.h).
///
/// Peers: the descriptor's `efa_devices[0].gid` is the hex of the peer's endpoint address, inserted into the
/// address vector on first use. Memory: every host registration is registered with the domain (a unique
/// requested key where the provider does not assign keys); its 64-bit key is published as `efa_rkey[0]`.
/// Remote addresses are virtual addresses or offsets into the registration, as the target's `efa_virt_addr`
/// says.
///
/// Trust: providers do not protect memory (a wrong key on tcp kills the connection without an error; shm
/// writes past the end of a region), so nothing is posted outside what the peer's descriptor lists, and each
/// submission first reads the peer's registration epoch (a remotely readable counter, `efa_epoch_*`): when it
/// moved on since the descriptor was fetched (memory was withdrawn), the slices fail with kStaleMetadata and
/// kRefreshPeer, before any byte is moved. Where the provider's write completion does not mean delivery
/// (tcp;ofi_rxm), a write batch ends with another epoch read on the same connection, so a write completes
/// only once its data is at the target.
///
/// Errors complete slices with SliceRetry::kOtherPath (another transport may reach the peer); an operation
/// not completed in `op_timeout` fails and the peer is marked down: its slices fail at once for 5 s, then
/// it is tried again.
/// Threading: Submit from any thread; completions on the domain's progress thread.
class EfaTransport : public Transport {
 public:
  EfaTransport();
  ~EfaTransport() override;

  std::string name() const override { return "efa"; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  /// Host memory: registered with the domain. Device memory is declined.
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  /// Moves the registration epoch on (peers see it before their next submission).
  void WithdrawRegion(const MemoryRegion& region) override;
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  size_t slice_size() const override { return slice_size_; }
  nlohmann::json Stats() const override;

  /// The provider and domain in use (for logs and tests): empty before Start.
  DomainInfo domain_info() const;

 private:
  struct Peer;
  struct Group;
  class EpochArea;

  std::shared_ptr<Peer> PeerFor(const SegmentDescriptor& desc, Status* error);
  void StartGroup(const std::shared_ptr<Group>& g);
  void PostData(const std::shared_ptr<Group>& g);
  void OneDone(const std::shared_ptr<Group>& g);
  void EndGroup(const std::shared_ptr<Group>& g);
  void Fence(const std::shared_ptr<Group>& g);
  void ReadEpoch(const std::shared_ptr<Group>& g, std::function<void(const Status&, uint64_t)> then);
  void OnTimeout(fi_addr_t addr);

  EfaConfig cfg_;
  TransportContext ctx_;
  const FabricApi* api_ = nullptr;
  std::shared_ptr<FabricDomain> domain_;
  std::unique_ptr<EpochArea> epoch_;
  size_t slice_size_ = 1 << 20;
  bool software_provider_ = true;
  bool same_host_only_ = false;

  mutable std::mutex mu_;                             // guards peers_
  std::map<std::string, std::shared_ptr<Peer>> peers_;  // by the peer's instance id
};

/// Whether libfabric loads and finds a provider: FI_PROVIDER's, else efa or verbs. Software providers are
/// used only when FI_PROVIDER (or the efa.provider option) names them, so the plugin never joins engines
/// of hosts without an EFA or verbs device unless asked to.
TransportProbe ProbeEfa();

}  // namespace mooncake::te::efa

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_TRANSPORT_H_
