// The rdma transport's memory registration: host memory with ibv_reg_mr; device memory with ibv_reg_dmabuf_mr
// when the platform exported a dma-buf fd for it, else with ibv_reg_mr on the device pointer when a
// peer-memory client is loaded, else declined; and each region's preferred (nearest) local NICs.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/transport/rdma/rdma_internal.h"

namespace mooncake::te::rdma {

const char* RegPathName(RegPath p) {
  switch (p) {
    case RegPath::kHost: return "host";
    case RegPath::kDmabuf: return "dma-buf";
    case RegPath::kPeerMemory: return "peer memory";
  }
  return "?";
}

namespace {

// The NUMA node holding the page at `addr` (get_mempolicy with MPOL_F_NODE | MPOL_F_ADDR); -1 when unknown.
int NumaNodeOf(uint64_t addr) {
  int node = -1;
  constexpr unsigned long kNodeOfAddress = 1 | 2;  // MPOL_F_NODE | MPOL_F_ADDR
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0UL, reinterpret_cast<void*>(addr), kNodeOfAddress) != 0) {
    return -1;
  }
  return node;
}

}  // namespace

Status RdmaTransport::LoadTopology(const std::string& path) {
  topology_.clear();
  if (path.empty()) return Status::Ok();
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kInvalidArgument, "cannot read the topology matrix " + path);
  std::stringstream text;
  text << in.rdbuf();
  // Mooncake's priority matrix: {"<location>": [[preferred NICs], [other NICs]], ...}.
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status(ErrorCode::kMalformedJson, "the topology matrix " + path + " is not an object");
  for (const auto& [location, lists] : j.items()) {
    if (!lists.is_array() || lists.empty() || !lists[0].is_array()) continue;
    std::vector<std::string> names;
    for (const auto& n : lists[0]) {
      if (n.is_string()) names.push_back(n.get<std::string>());
    }
    topology_[location] = std::move(names);
  }
  return Status::Ok();
}

std::vector<bool> RdmaTransport::PreferredNics(const MemoryRegion& region, std::string* why) const {
  std::vector<bool> pref(nics_.size(), false);
  size_t count = 0;
  // Device memory: the NUMA node the engine core found for its device (MemoryRegion::locality; -1 unknown).
  const int node = region.kind.is_device() ? region.locality.numa_node : NumaNodeOf(region.start);
  const std::string location = region.kind.is_device() ? region.kind.ToString()
                                                        : (node >= 0 ? "cpu:" + std::to_string(node) : "");
  auto it = location.empty() ? topology_.end() : topology_.find(location);
  // Device memory without a matrix entry: the NICs under its device's PCIe root first (where the platform
  // told its PCI address and sysfs places both), else those on its NUMA node.
  std::string root;
  if (it == topology_.end() && region.kind.is_device() && !region.locality.pci_bus_id.empty()) {
    std::vector<std::string> dirs;
    for (const auto& nic : nics_) {
      const std::string& d = nic->info().pcie_roots_dir;
      if (!d.empty() && std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
    }
    root = PcieRootOf(region.locality.pci_bus_id, dirs);
    size_t under = 0;
    for (const auto& nic : nics_) under += !root.empty() && nic->info().pcie_root == root;
    if (under == 0 || under == nics_.size()) root.clear();  // tells nothing apart: NUMA decides
  }
  if (!root.empty()) {
    for (size_t i = 0; i < nics_.size(); ++i) {
      if (nics_[i]->info().pcie_root == root) {
        pref[i] = true;
        count++;
      }
    }
    *why = "the NICs under PCIe root " + root + " (that of " + location + " at " + region.locality.pci_bus_id + ")";
  } else if (it != topology_.end()) {
    for (size_t i = 0; i < nics_.size(); ++i) {
      if (std::find(it->second.begin(), it->second.end(), nics_[i]->info().name) != it->second.end()) {
        pref[i] = true;
        count++;
      }
    }
    *why = "the topology matrix's NICs for " + location;
  } else if (node >= 0) {
    for (size_t i = 0; i < nics_.size(); ++i) {
      if (nics_[i]->info().numa_node == node) {
        pref[i] = true;
        count++;
      }
    }
    *why = "the NICs on NUMA node " + std::to_string(node) +
           (region.kind.is_device() ? " (that of " + location + ")" : std::string());
  } else {
    // Device memory without a matrix entry whose platform tells no NUMA node of the device.
    *why = region.kind.is_device() ? "no locality known for " + location : "NUMA node unknown";
  }
  if (count == 0 || count == nics_.size()) {
    if (count == 0 && it == topology_.end() && node >= 0) *why = "no NIC on NUMA node " + std::to_string(node);
    return {};
  }
  return pref;
}

StatusOr<std::shared_ptr<RdmaRegionState>> RdmaTransport::RegisterWith(const MemoryRegion& region, RegPath path,
                                                                       nlohmann::json* fields) const {
  const int local_access = IBV_ACCESS_LOCAL_WRITE;
  const int remote_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const uint64_t chunk = chunk_size_ && region.length > chunk_size_ ? chunk_size_ : 0;
  const size_t chunks = chunk ? static_cast<size_t>((region.length + chunk - 1) / chunk) : 1;
  auto state = std::make_shared<RdmaRegionState>(api_, region.start, chunk, path);
  nlohmann::json lkeys = nlohmann::json::array(), rkeys = nlohmann::json::array();
  nlohmann::json chunk_rkeys = nlohmann::json::array();
  for (const auto& nic : nics_) {
    std::vector<ibv_mr*> local, remote;
    nlohmann::json per_chunk = nlohmann::json::array();
    auto reg = [&](uint64_t off, uint64_t len, int access) -> ibv_mr* {
      if (path == RegPath::kDmabuf) {
        return api_->reg_dmabuf_mr(nic->pd(), region.backing_offset + off, len, region.start + off, region.backing_fd,
                                   access);
      }
      return api_->reg_mr(nic->pd(), reinterpret_cast<void*>(region.start + off), len, access);
    };
    for (size_t k = 0; k < chunks; ++k) {
      const uint64_t off = chunk * k;
      const uint64_t len = chunk ? std::min(chunk, region.length - off) : region.length;
      ibv_mr* l = reg(off, len, local_access);
      ibv_mr* r = l && region.remote_accessible ? reg(off, len, remote_access) : nullptr;
      if (!l || (region.remote_accessible && !r)) {
        int err = errno;
        if (l) local.push_back(l);
        state->Add(nic, std::move(local), std::move(remote));  // released with the state
        return Status(err == EOPNOTSUPP || err == ENOSYS ? ErrorCode::kNotImplemented : ErrorCode::kMemory,
                      std::string(path == RegPath::kDmabuf ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr") + " of " +
                          Range(region.start + off, len) + " on " + nic->info().name + ": " + strerror(err));
      }
      local.push_back(l);
      if (r) {
        remote.push_back(r);
        per_chunk.push_back(r->rkey);
      }
    }
    lkeys.push_back(local[0]->lkey);
    if (!remote.empty()) rkeys.push_back(remote[0]->rkey);
    chunk_rkeys.push_back(std::move(per_chunk));
    state->Add(nic, std::move(local), std::move(remote));
  }
  (*fields)["lkey"] = lkeys;
  if (region.remote_accessible) {
    (*fields)["rkey"] = rkeys;
    if (chunk) {
      (*fields)["rdma_chunk_size"] = chunk;
      (*fields)["rdma_chunk_rkeys"] = chunk_rkeys;
    }
  }
  return state;
}

StatusOr<RegionRegistration> RdmaTransport::RegisterRegion(const MemoryRegion& region) {
  if (nics_.empty()) return Status(ErrorCode::kContext, "the rdma transport is not started");
  RegionRegistration r;
  nlohmann::json fields = nlohmann::json::object();
  StatusOr<std::shared_ptr<RdmaRegionState>> state = Status(ErrorCode::kNotImplemented, "");
  if (!region.kind.is_device()) {
    state = RegisterWith(region, RegPath::kHost, &fields);
    if (!state.ok()) return Status(state.status().code(), "rdma: " + state.status().message());
  } else {
    // Device memory: dma-buf first, then peer memory, else decline (the engine stages it or another transport
    // moves it).
    std::string why;
    if (region.backing_fd < 0) {
      why = "dma-buf: the platform exported no dma-buf fd for it";
    } else if (!api_->reg_dmabuf_mr) {
      why = "dma-buf: no ibv_reg_dmabuf_mr in this libibverbs";
    } else {
      fields = nlohmann::json::object();
      state = RegisterWith(region, RegPath::kDmabuf, &fields);
      if (!state.ok()) why = "dma-buf: " + state.status().message();
    }
    if (!state.ok()) {
      if (!api_->peer_memory || !api_->peer_memory()) {
        why += "; peer memory: no peer-memory client (nvidia_peermem) is loaded";
      } else {
        fields = nlohmann::json::object();
        state = RegisterWith(region, RegPath::kPeerMemory, &fields);
        if (!state.ok()) why += "; peer memory: " + state.status().message();
      }
    }
    if (!state.ok()) {
      r.declined = true;
      r.why_declined = "rdma cannot register " + region.kind.ToString() + " memory (" + why + ")";
      MC_LOG(kInfo) << "rdma: declines " << Range(region.start, region.length) << ": " << r.why_declined;
      return r;
    }
    MC_LOG(kInfo) << "rdma: " << region.kind.ToString() << " memory " << Range(region.start, region.length)
                  << " registered through " << RegPathName((*state)->path());
  }
  std::string why_pref;
  (*state)->preferred = PreferredNics(region, &why_pref);
  if (!(*state)->preferred.empty()) {
    std::string names;
    for (size_t i = 0; i < nics_.size(); ++i) {
      if ((*state)->preferred[i]) names += (names.empty() ? "" : ",") + nics_[i]->info().name;
    }
    MC_LOG(kDebug) << "rdma: " << Range(region.start, region.length) << " prefers " << names << " (" << why_pref
                   << ")";
  }
  if (Publishes()) r.descriptor_fields = std::move(fields);  // else efa owns Mooncake's devices/lkey/rkey names
  r.state = std::move(state.value());
  return r;
}

std::string RdmaTransport::RegistrationPath(const MemoryRegion& region) {
  const MemoryRegion::TransportEntry* e = region.transport("rdma");
  if (!e || !e->state || e->declined) return "";
  return RegPathName(static_cast<const RdmaRegionState*>(e->state.get())->path());
}

void RdmaTransport::WithdrawRegion(const MemoryRegion& region) {
  // Peers must stop at once: their keys go now, before the engine waits for our own transfers (which keep the
  // local MRs until UnregisterRegion).
  const MemoryRegion::TransportEntry* e = region.transport("rdma");
  if (e && e->state) static_cast<const RdmaRegionState*>(e->state.get())->WithdrawRemote();
}

void RdmaTransport::UnregisterRegion(const MemoryRegion& region) {
  const MemoryRegion::TransportEntry* e = region.transport("rdma");
  if (e && e->state) static_cast<const RdmaRegionState*>(e->state.get())->Release();
}

}  // namespace mooncake::te::rdma
