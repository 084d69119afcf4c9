#include "transfer_engine/transport/rdma/rdma_transport.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/transport/rdma/rdma_internal.h"

namespace mooncake::te::rdma {

namespace {

std::string DeviceMemoryText(const VerbsApi* api) {
  std::string dmabuf = api && api->reg_dmabuf_mr
                           ? "dma-buf: available (ibv_reg_dmabuf_mr, for device memory whose platform exports a "
                             "dma-buf fd)"
                           : "dma-buf: unavailable (no ibv_reg_dmabuf_mr in this libibverbs)";
  std::string peer = api && api->peer_memory && api->peer_memory()
                         ? "peer memory: available (a peer-memory client is loaded: ibv_reg_mr on device pointers)"
                         : "peer memory: unavailable (no nvidia_peermem / memory_peers in this kernel)";
  return dmabuf + "; " + peer + "; other device memory is declined";
}

}  // namespace

// ---------------------------------------------------------------------------------------------- probe

TransportProbe ProbeRdma() {
  TransportProbe p;
  std::string why;
  const VerbsApi* api = LoadVerbsApi(&why);
  if (!api) {
    p.usable = false;
    p.reason = "cannot load libibverbs: " + why;
    return p;
  }
  int n = 0;
  errno = 0;
  ibv_device** list = api->get_device_list(&n);
  if (!list || n == 0) {
    p.usable = false;
    p.reason = "no RDMA device";
    if (!list) p.reason += std::string(" (ibv_get_device_list: ") + strerror(errno) + ")";
    if (list) api->free_device_list(list);
    p.reason += "; " + DeviceMemoryText(api);
    return p;
  }
  RdmaConfig cfg = RdmaConfig::From(TransportOptions());
  std::string usable, skipped;
  for (int i = 0; i < n; ++i) {
    auto info = InspectDevice(api, list[i], cfg);
    if (info.ok()) {
      usable += (usable.empty() ? "" : ",") + info->name;
    } else {
      skipped += (skipped.empty() ? "" : "; ") + info.status().message();
    }
  }
  api->free_device_list(list);
  if (usable.empty()) {
    p.usable = false;
    p.reason = "no usable RDMA device: " + skipped;
  } else {
    p.reason = std::string(api->is_fake() ? "FAKE verbs provider: " : "") + "HCAs " + usable +
               (skipped.empty() ? "" : " (" + skipped + ")");
  }
  p.reason += "; " + DeviceMemoryText(api);
  return p;
}

namespace {
// Retry threads: each peer's retries run on one at a time (its strand), so a peer whose handshakes hang holds
// up only its own retries while fewer than this many peers hang at once.
constexpr int kRetryThreads = 4;
}  // namespace

RdmaTransport::RdmaTransport() = default;
RdmaTransport::RdmaTransport(const VerbsApi* api) : api_(api), api_given_(api != nullptr) {}
RdmaTransport::~RdmaTransport() { Stop(); }

TransportCapabilities RdmaTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = true;
  c.same_host = true;
  // Device memory too, registered per region through dma-buf or peer memory, or declined (RegisterRegion).
  const MemoryType kinds[] = {MemoryType::kHost, MemoryType::kCuda, MemoryType::kRocm};
  for (MemoryType l : kinds) {
    for (MemoryType r : kinds) c.memory.emplace_back(l, r);
  }
  c.priority = 20;  // before tcp
  return c;
}

Status RdmaTransport::Configure(const TransportOptions& options) {
  cfg_ = RdmaConfig::From(options);
  return Status::Ok();
}

Status RdmaTransport::Start(const TransportContext& ctx) {
  ctx_ = ctx;
  if (ctx.config && !ctx.options.entries().count("retry_cnt")) cfg_.retry_count = ctx.config->retry_count;
  std::string why;
  if (!api_) api_ = LoadVerbsApi(&why);
  if (!api_) return Status(ErrorCode::kNotImplemented, "cannot load libibverbs: " + why);
  if (api_->is_fake()) MC_LOG(kWarning) << "rdma: using the FAKE verbs provider (MC_RDMA_FAKE_LIBRARY; tests only)";
  int n = 0;
  errno = 0;
  ibv_device** list = api_->get_device_list(&n);
  if (!list || n == 0) {
    std::string text = list ? "" : std::string(" (ibv_get_device_list: ") + strerror(errno) + ")";
    if (list) api_->free_device_list(list);
    return Status(ErrorCode::kDeviceNotFound, "no RDMA device" + text);
  }
  std::vector<std::string> allow = SplitList(ctx.device_filter);
  std::string skipped;
  std::set<std::string> seen;
  for (int i = 0; i < n; ++i) {
    std::string name = api_->get_device_name(list[i]);
    seen.insert(name);
    if (!allow.empty() && std::find(allow.begin(), allow.end(), name) == allow.end()) {
      MC_LOG(kInfo) << "rdma: HCA " << name << " skipped: not in the allow-list '" << ctx.device_filter << "'";
      continue;
    }
    auto info = InspectDevice(api_, list[i], cfg_);
    if (!info.ok()) {
      MC_LOG(kWarning) << "rdma: " << info.status().message();
      skipped += (skipped.empty() ? "" : "; ") + info.status().message();
      continue;
    }
    auto nic = RdmaNic::Open(api_, list[i], *info, cfg_);
    if (!nic.ok()) {
      MC_LOG(kWarning) << "rdma: " << nic.status().message();
      skipped += (skipped.empty() ? "" : "; ") + nic.status().message();
      continue;
    }
    MC_LOG(kInfo) << "rdma: using HCA " << info->name << " (GID index " << info->gid_index << " "
                  << GidText(info->gid) << ", LID " << info->lid << ", " << (info->ethernet ? "RoCE" : "InfiniBand")
                  << ")";
    nics_.push_back(std::move(nic.value()));
  }
  api_->free_device_list(list);
  for (const auto& a : allow) {
    if (!seen.count(a)) MC_LOG(kWarning) << "rdma: the allow-list names '" << a << "', which is not an HCA here";
  }
  if (nics_.empty()) {
    return Status(ErrorCode::kDeviceNotFound,
                  "no usable RDMA device" + (skipped.empty() ? std::string(" (none admitted by the allow-list)")
                                                             : ": " + skipped));
  }
  if (ctx.config) {
    Status topo = LoadTopology(ctx.config->custom_topology_path);
    if (!topo.ok()) MC_LOG(kWarning) << "rdma: " << topo.message() << "; NICs are chosen by NUMA node only";
  }
  MC_LOG(kInfo) << "rdma: device memory: " << DeviceMemoryText(api_);
  chunk_size_ = cfg_.max_mr_size;
  for (const auto& nic : nics_) {
    uint64_t m = nic->info().max_mr_size;
    if (m > 0 && (chunk_size_ == 0 || m < chunk_size_)) chunk_size_ = m;
  }
  if (chunk_size_ != 0) chunk_size_ = std::max<uint64_t>(chunk_size_ & ~uint64_t{4095}, 4096);
  worker_ = std::make_unique<WorkQueue>(kRetryThreads);
  delayed_ = std::make_unique<DelayQueue>();
  closer_ = std::make_unique<WorkQueue>(1);
  for (size_t i = 0; i < nics_.size(); ++i) {
    std::vector<std::shared_ptr<CqBudget>> b;
    for (size_t c = 0; c < nics_[i]->num_cqs(); ++c) b.push_back(std::make_shared<CqBudget>(cfg_.max_cqe));
    budgets_.push_back(std::move(b));
    nics_[i]->Start([this, i](const ibv_wc& wc) { OnCompletion(i, wc); });
  }
  responder_ = std::make_unique<Responder>(nics_, cfg_, ctx.instance, cfg_.responder_capacity);
  if (ctx.host) {
    MC_RETURN_IF_ERROR(ctx.host->RegisterMethod("rdma.connect", [this](const std::string& p) -> StatusOr<std::string> {
      if (stopping_.load()) return Status(ErrorCode::kContext, "the rdma transport is stopping");
      return responder_->Connect(p);
    }));
    MC_RETURN_IF_ERROR(ctx.host->RegisterMethod("rdma.ready", [this](const std::string& p) -> StatusOr<std::string> {
      if (stopping_.load()) return Status(ErrorCode::kContext, "the rdma transport is stopping");
      return responder_->Ready(p);
    }));
    MC_RETURN_IF_ERROR(ctx.host->RegisterMethod("rdma.close", [this](const std::string& p) -> StatusOr<std::string> {
      if (stopping_.load()) return Status(ErrorCode::kContext, "the rdma transport is stopping");
      return responder_->Close(p);
    }));
  }
  return Status::Ok();
}

void RdmaTransport::Stop() {
  if (stopping_.exchange(true)) return;
  // Items waiting for a paused endpoint go to their strands now; the worker finishes what it has (its
  // dispatches see stopping_ and fail their items).
  if (delayed_) delayed_->Stop();
  if (worker_) worker_->Stop();
  if (closer_) closer_->Stop();  // the closes still queued see stopping_ and return
  std::map<std::string, std::shared_ptr<Peer>> peers;
  {
    std::lock_guard lock(mu_);
    peers.swap(peers_);
  }
  std::vector<std::unique_ptr<WorkItem>> orphans;
  auto close_ep = [&](const std::shared_ptr<Endpoint>& ep) {
    uint32_t qpn = 0;
    for (auto& item : ep->Close(&qpn)) orphans.push_back(std::move(item));
  };
  for (auto& [key, peer] : peers) {
    for (auto& ep : peer->eps) close_ep(ep);
  }
  {
    std::lock_guard lock(mu_);
    for (auto& [k, ep] : routes_) close_ep(ep);  // endpoints of forgotten peers still draining
    routes_.clear();
  }
  if (responder_) responder_->Clear();
  for (auto& nic : nics_) nic->Stop();
  for (auto& item : orphans) {
    auto job = std::static_pointer_cast<SliceJob>(item->job);
    FinishPiece(job, Status(ErrorCode::kContext, "the rdma transport stopped"), SliceRetry::kOtherPath);
  }
}

std::vector<NicInfo> RdmaTransport::nics() const {
  std::vector<NicInfo> out;
  for (const auto& n : nics_) out.push_back(n->info());
  return out;
}

// ---------------------------------------------------------------------------------------------- memory

void RdmaTransport::Describe(nlohmann::json& d) const {
  if (!Publishes()) return;
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& nic : nics_) {
    devices.push_back({{"name", nic->info().name}, {"lid", nic->info().lid}, {"gid", GidText(nic->info().gid)}});
  }
  if (!devices.empty()) d["devices"] = devices;
}

// ---------------------------------------------------------------------------------------------- peers

namespace {

// The peer's `devices`, when every entry is an object with a string name, a GID and a 16-bit LID.
std::optional<std::vector<std::tuple<std::string, ibv_gid, uint16_t>>> PeerDevices(const SegmentDescriptor& d) {
  auto it = d.json.find("devices");
  if (it == d.json.end() || !it->is_array() || it->empty() || it->size() > 64) return std::nullopt;
  std::vector<std::tuple<std::string, ibv_gid, uint16_t>> out;
  for (const auto& dev : *it) {
    auto name = JsonString(dev, "name");
    auto gid = JsonString(dev, "gid");
    auto lid = BoundedUint(dev, "lid", 0xffff);
    if (!name || name->empty() || name->size() > 64 || !gid || !lid) return std::nullopt;
    auto g = ParseGid(*gid);
    if (!g) return std::nullopt;
    out.emplace_back(*name, *g, static_cast<uint16_t>(*lid));
  }
  return out;
}

}  // namespace

bool RdmaTransport::CanReach(const SegmentDescriptor& peer) const {
  return !nics_.empty() && !stopping_.load() && PeerDevices(peer).has_value();
}

std::shared_ptr<RdmaTransport::Peer> RdmaTransport::MakePeerLocked(const std::string& key,
                                                                   const std::string& segment,
                                                                   const std::vector<PeerNic>& nics) {
  auto p = std::make_shared<Peer>();
  p->key = key;
  p->segment = segment;
  p->nics = nics;
  p->local_count = nics_.size();
  auto& counters = counters_[segment];
  if (!counters) counters = std::make_shared<PeerCounters>();
  p->counters = counters;
  for (size_t i = 0; i < nics_.size(); ++i) {
    for (size_t j = 0; j < p->nics.size(); ++j) {
      size_t cq = nics_[i]->NextCq();
      p->eps.push_back(std::make_shared<Endpoint>(nics_[i], i, budgets_[i][cq], cq, cfg_,
                                                  nics_[i]->info().name + "->" + segment + "@" + p->nics[j].name,
                                                  segment, p->nics[j].name));
    }
  }
  return p;
}

std::shared_ptr<RdmaTransport::Peer> RdmaTransport::PeerFor(const SegmentDescriptor& desc, Status* error) {
  auto devices = PeerDevices(desc);
  if (!devices) {
    *error = Status(ErrorCode::kMalformedJson, "segment '" + desc.name + "' has no usable rdma devices");
    return nullptr;
  }
  const std::string key = JsonString(desc.json, "instance").value_or(desc.name);
  std::vector<PeerNic> nics;
  for (const auto& [name, gid, lid] : *devices) nics.push_back({name, gid, lid});
  std::vector<std::shared_ptr<Peer>> stale;
  std::shared_ptr<Peer> p;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(key);
    if (it != peers_.end()) {
      const Peer& old = *it->second;
      bool same = old.nics.size() == nics.size();
      for (size_t j = 0; same && j < old.nics.size(); ++j) {
        same = old.nics[j].name == nics[j].name && memcmp(old.nics[j].gid.raw, nics[j].gid.raw, 16) == 0 &&
               old.nics[j].lid == nics[j].lid;
      }
      if (same) return it->second;
      // The peer's NICs changed (new GIDs: its HCAs were replaced or re-addressed): its old QPs are dead.
      MC_LOG(kInfo) << "rdma: the NICs of '" << desc.name << "' changed; its endpoints are rebuilt";
      stale.push_back(it->second);
      peers_.erase(it);
    }
    // Another instance under the same segment name: the peer restarted; the old one's QPs are gone with it.
    for (auto i = peers_.begin(); i != peers_.end();) {
      if (i->second->segment == desc.name) {
        MC_LOG(kInfo) << "rdma: '" << desc.name << "' restarted (instance " << key << "); old endpoints retired";
        stale.push_back(i->second);
        i = peers_.erase(i);
      } else {
        ++i;
      }
    }
    p = MakePeerLocked(key, desc.name, nics);
    peers_[key] = p;
  }
  for (const auto& old : stale) RetireEndpoints(*old);
  return p;
}

void RdmaTransport::RetireEndpoints(const Peer& p) {
  for (size_t pair = 0; pair < p.eps.size(); ++pair) {
    if (uint32_t qpn = p.eps[pair]->Retire()) QpDestroyed(p.eps[pair], qpn);
  }
}

void RdmaTransport::ForgetPeer(const std::string& segment_name) {
  std::vector<std::shared_ptr<Peer>> gone;
  {
    std::lock_guard lock(mu_);
    for (auto it = peers_.begin(); it != peers_.end();) {
      if (it->second->segment == segment_name) {
        gone.push_back(it->second);
        it = peers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Idle endpoints close now; those with work in flight stay routed, finish it, then close. New work gets
  // fresh connections.
  for (const auto& p : gone) RetireEndpoints(*p);
}

void RdmaTransport::Route(size_t nic, uint32_t qpn, const std::shared_ptr<Endpoint>& ep) {
  std::lock_guard lock(mu_);
  routes_[(uint64_t{nic} << 32) | qpn] = ep;
}

void RdmaTransport::Unroute(size_t nic, uint32_t qpn, const Endpoint* ep) {
  std::lock_guard lock(mu_);
  auto it = routes_.find((uint64_t{nic} << 32) | qpn);
  // Only the endpoint's own route: the HCA may have given the QPN to a new QP meanwhile.
  if (it != routes_.end() && it->second.get() == ep) routes_.erase(it);
}

void RdmaTransport::QpDestroyed(const std::shared_ptr<Endpoint>& ep, uint32_t qpn) {
  if (qpn == 0) return;
  Unroute(ep->nic_index(), qpn, ep.get());
  auto closed = ep->TakeClosedQps();
  if (!ctx_.host || !closer_ || ep->peer_segment().empty()) return;
  for (const auto& q : closed) {
    nlohmann::json req = {{"instance", ctx_.instance},
                          {"local_nic", nics_[ep->nic_index()]->info().name},
                          {"peer_nic", ep->peer_nic()},
                          {"qpn", q.qpn},
                          {"psn", q.psn}};
    // Not on the caller's thread (a polling thread, or one holding a slice up): CallPeer may wait for the
    // peer. Once stopping, no close is sent: the peer's table makes room on its own (rdma_responder.h).
    closer_->Post([this, segment = ep->peer_segment(), body = req.dump()] {
      if (stopping_.load()) return;
      auto r = ctx_.host->CallPeer(segment, "rdma.close", body);
      if (!r.ok()) MC_LOG(kDebug) << "rdma: rdma.close to '" << segment << "': " << r.status().message();
    });
  }
}

StatusOr<QpAddress> RdmaTransport::Handshake(const Peer& peer, size_t peer_nic, const QpAddress& ours) {
  if (!ctx_.host) return Status(ErrorCode::kContext, "no handshake service");
  nlohmann::json req = {{"instance", ctx_.instance},   {"segment", ctx_.local_segment_name},
                        {"local_nic", ours.nic},       {"peer_nic", peer.nics[peer_nic].name},
                        {"qpn", ours.qpn},             {"psn", ours.psn},
                        {"gid", GidText(ours.gid)},    {"lid", ours.lid},
                        {"mtu", ours.mtu},             {"rd_atom", ours.rd_atom}};
  auto reply = ctx_.host->CallPeer(peer.segment, "rdma.connect", req.dump());
  if (!reply.ok()) return reply.status();
  nlohmann::json j = nlohmann::json::parse(*reply, nullptr, /*allow_exceptions=*/false);
  auto qpn = BoundedUint(j, "qpn", 0xffffff);
  auto psn = BoundedUint(j, "psn", 0xffffff);
  auto lid = BoundedUint(j, "lid", 0xffff);
  auto mtu = BoundedUint(j, "mtu", IBV_MTU_4096);
  auto gid = JsonString(j, "gid");
  std::optional<ibv_gid> g = gid ? ParseGid(*gid) : std::nullopt;
  if (!j.is_object() || !qpn || *qpn == 0 || !psn || !lid || !mtu || *mtu < IBV_MTU_256 || !g) {
    return Status(ErrorCode::kRejectHandshake, "malformed rdma.connect reply from '" + peer.segment + "'");
  }
  // The engine answering at the peer's address is another instance than the descriptor we hold: the peer
  // restarted, and the descriptor (GIDs, keys) is stale.
  auto instance = JsonString(j, "instance");
  if (instance && *instance != peer.key && peer.key != peer.segment) {
    return Status(ErrorCode::kStaleMetadata, "'" + peer.segment + "' restarted (instance " + *instance +
                                                 ", the descriptor's is " + peer.key + ")");
  }
  QpAddress out;
  out.nic = peer.nics[peer_nic].name;
  out.qpn = static_cast<uint32_t>(*qpn);
  out.psn = static_cast<uint32_t>(*psn);
  out.lid = static_cast<uint16_t>(*lid);
  out.mtu = static_cast<int>(*mtu);
  auto rd_atom = BoundedUint(j, "rd_atom", 255);
  out.rd_atom = rd_atom ? static_cast<int>(*rd_atom) : 0;
  out.gid = *g;
  return out;
}

nlohmann::json RdmaTransport::Stats() const {
  nlohmann::json out = nlohmann::json::object();
  std::lock_guard lock(mu_);
  for (const auto& [key, p] : peers_) {
    nlohmann::json paths = nlohmann::json::object();
    for (size_t pair = 0; pair < p->eps.size(); ++pair) {
      const Endpoint& e = *p->eps[pair];
      paths[e.label()] = {{"state", e.StateText()},
                          {"failures", e.failures()},
                          {"bytes", e.bytes()},
                          {"mbps", static_cast<uint64_t>(e.rate() / 1e6)}};
    }
    size_t qps = 0;  // QPs to this segment still routed (connected, or draining after a failure or retirement)
    for (const auto& [k, e] : routes_) qps += e->peer_segment() == p->segment;
    const PeerCounters& c = *p->counters;
    out[p->segment] = {{"qps", qps},
                       {"bytes", c.bytes.load()},
                       {"slices", c.slices.load()},
                       {"errors", c.errors.load()},
                       {"retries", c.retries.load()},
                       {"paths", paths}};
  }
  return out;
}

nlohmann::json RdmaTransport::ListenerStats() const {
  if (!responder_) return nullptr;
  return {{"responder_qps", responder_->size()}};
}

MC_TRANSPORT_PLUGIN("rdma", RdmaTransport, {"rdma"}, "", ProbeRdma);

}  // namespace mooncake::te::rdma
