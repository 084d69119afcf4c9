#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_NIC_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_NIC_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/rdma/rdma_config.h"
#include "transfer_engine/transport/rdma/verbs_api.h"

namespace mooncake::te::rdma {

/// What a usable HCA port offers (from InspectDevice). Plain value type.
struct NicInfo {
  std::string name;
  uint16_t lid = 0;
  ibv_gid gid{};
  int gid_index = 0;
  int gid_type = -1;  ///< IBV_GID_TYPE_*, -1 when libibverbs cannot tell
  int active_mtu = 0;  ///< IBV_MTU_*
  bool ethernet = true;  ///< link layer Ethernet (RoCE: GRH required) or InfiniBand
  uint64_t max_mr_size = 0;
  int max_qp_wr = 0;
  int max_rd_atom = 16;       ///< max_qp_rd_atom: RDMA READs a responder QP serves at once
  int max_init_rd_atom = 16;  ///< max_qp_init_rd_atom: RDMA READs a requester QP has outstanding
  int numa_node = -1;         ///< <ibdev_path>/device/numa_node; -1 when unknown
  /// The PCIe root it is under: the "pci<domain>:<bus>" directory its sysfs device (<ibdev_path>/device,
  /// resolved) lies below, and the directory holding that root and its siblings; empty when unknown.
  std::string pcie_root, pcie_roots_dir;
};

/// "fe80:0000:0000:0000:0202:c9ff:fe00:0001" (Mooncake's GID text).
std::string GidText(const ibv_gid& gid);
/// Parses GidText's form or 32 hex digits; nullopt otherwise (peer input).
std::optional<ibv_gid> ParseGid(const std::string& text);

/// The PCIe root ("pci0000:3a") a sysfs path lies below and the directory that holds it ("/sys/devices"), or
/// false when no component of the path is one.
bool PcieRootOfPath(const std::string& path, std::string* root, std::string* roots_dir);

/// The PCIe root of the PCI function `bus_id` ("0000:3b:00.0"): the one its sysfs entry
/// (/sys/bus/pci/devices/<bus_id>) lies below where that exists; else, among the roots in `roots_dirs` (e.g.
/// "/sys/devices", as NICs' paths name them), the one of the same PCI domain with the highest bus number not
/// above the function's (a root's buses run up to the next root's). Empty when neither tells.
std::string PcieRootOf(const std::string& bus_id, const std::vector<std::string>& roots_dirs);

/// Whether `device` can serve: node type CA, port `cfg.ib_port` ACTIVE with an InfiniBand or Ethernet link
/// layer, a usable GID (cfg.gid_index, else chosen: RoCEv2 IPv4-mapped, RoCEv2, RoCEv1/IB, never an empty
/// entry). Opens and closes the device. kDeviceNotFound with the reason when it cannot.
StatusOr<NicInfo> InspectDevice(const VerbsApi* api, ibv_device* device, const RdmaConfig& cfg);

/// One HCA in use: its context, protection domain, completion channels and CQs, and one polling thread per CQ
/// that sleeps on the completion channel while nothing completes (re-checking a stop flag every 100 ms).
/// Create with Open; Start the threads; Stop joins them (idempotent). The destructor frees the verbs objects: every
/// QP and MR made on it must be gone by then (owners hold a shared_ptr to the NIC).
class RdmaNic {
 public:
  /// Called on a polling thread for every work completion of any CQ of this NIC.
  using CompletionFn = std::function<void(const ibv_wc& wc)>;

  static StatusOr<std::shared_ptr<RdmaNic>> Open(const VerbsApi* api, ibv_device* device, const NicInfo& info,
                                                 const RdmaConfig& cfg);
  ~RdmaNic();

  void Start(CompletionFn fn);
  void Stop();

  const VerbsApi* api() const { return api_; }
  const NicInfo& info() const { return info_; }
  ibv_pd* pd() const { return pd_; }
  size_t num_cqs() const { return cqs_.size(); }
  ibv_cq* cq(size_t i) const { return cqs_[i].cq; }
  /// The CQ the next QP should use (round robin).
  size_t NextCq() { return next_cq_.fetch_add(1) % cqs_.size(); }

 private:
  struct Cq {
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
    std::thread thread;
  };
  RdmaNic(const VerbsApi* api, NicInfo info) : api_(api), info_(std::move(info)) {}
  void Poll(size_t index);

  const VerbsApi* api_;
  NicInfo info_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::vector<Cq> cqs_;
  std::atomic<size_t> next_cq_{0};
  CompletionFn on_wc_;
  std::atomic<bool> stop_{false};
  bool started_ = false;
};

}  // namespace mooncake::te::rdma

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_NIC_H_
