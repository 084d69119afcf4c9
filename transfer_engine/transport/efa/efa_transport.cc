#include "transfer_engine/transport/efa/efa_transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/transport/efa/efa_internal.h"

namespace mooncake::te::efa {

namespace {

/// How many bits of two IPv4 addresses agree from the top.
int CommonPrefix(uint32_t a, uint32_t b) {
  int n = 0;
  for (uint32_t x = a ^ b; n < 32 && !(x & 0x80000000u); x <<= 1) ++n;
  return n;
}

bool IsSoftwareProvider(const std::string& provider) {
  return provider.rfind("efa", 0) != 0 && provider.rfind("verbs", 0) != 0 && provider.rfind("cxi", 0) != 0;
}

bool IsSameHostProvider(const std::string& provider) { return provider.rfind("shm", 0) == 0; }

// Whether libfabric finds an RDM endpoint with RMA for `provider` (with `hmem`: one that also takes device
// memory, FI_HMEM).
Status FindProvider(const FabricApi* api, const std::string& provider, bool hmem = false) {
  struct fi_info* hints = api->dupinfo(nullptr);
  if (hints == nullptr) return Status(ErrorCode::kMemory, "fi_allocinfo failed");
  hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT |
                                (hmem ? FI_MR_HMEM : 0);
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  struct fi_info* list = nullptr;
  int rc = api->getinfo(api->RequestVersion(), nullptr, nullptr, 0, hints, &list);
  api->freeinfo(hints);
  if (list) api->freeinfo(list);
  if (rc != 0) return Status(ErrorCode::kDeviceNotFound, "provider '" + provider + "': " + api->Error("fi_getinfo", rc));
  return Status::Ok();
}

// Whether the kernel lists an RDMA device (EFA devices are verbs devices too). Without one, libfabric's efa
// and verbs providers cannot find anything, and initialising libfabric (a few hundred ms) is skipped.
bool HasRdmaDevice() {
  DIR* d = opendir("/sys/class/infiniband");
  if (d == nullptr) return false;
  bool any = false;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') {
      any = true;
      break;
    }
  }
  closedir(d);
  return any;
}

// Whether a usable platform of device memory libfabric can register (cuda, rocm) is installed.
bool HasDevicePlatform(PlatformRegistry* platforms) {
  return platforms != nullptr && (platforms->ForType(MemoryType::kCuda) || platforms->ForType(MemoryType::kRocm));
}

constexpr const char* kSetProvider = "set FI_PROVIDER (e.g. 'tcp;ofi_rxm' or 'shm') to use a software provider";

// The provider to use: the configured one, else the first of efa, verbs;ofi_rxm that libfabric finds.
StatusOr<std::string> ChooseProvider(const FabricApi* api, const std::string& configured) {
  if (!configured.empty()) {
    MC_RETURN_IF_ERROR(FindProvider(api, configured));
    return configured;
  }
  if (!HasRdmaDevice()) {
    return Status(ErrorCode::kDeviceNotFound,
                  std::string("no EFA or verbs device (/sys/class/infiniband is empty); ") + kSetProvider);
  }
  std::string tried;
  for (const char* p : {"efa", "verbs;ofi_rxm"}) {
    Status st = FindProvider(api, p);
    if (st.ok()) return std::string(p);
    tried += (tried.empty() ? "" : "; ") + st.message();
  }
  return Status(ErrorCode::kDeviceNotFound, "no EFA or verbs device (" + tried + "); " + kSetProvider);
}

}  // namespace

TransportProbe ProbeEfa() {
  TransportProbe p;
  auto api = LoadFabricApi();
  if (!api.ok()) {
    p.usable = false;
    p.reason = api.status().message();
    return p;
  }
  auto provider = ChooseProvider(*api, ProviderFromEnv());
  if (!provider.ok()) {
    p.usable = false;
    p.reason = provider.status().message();
    return p;
  }
  p.reason = HmemSummary(*provider, FindProvider(*api, *provider, /*hmem=*/true).ok());
  return p;
}

std::string HmemSummary(const std::string& provider, bool offered) {
  return offered ? "provider '" + provider + "' offers FI_HMEM: device memory (cuda, rocm) is registered with "
                                             "fi_mr_regattr"
                 : "provider '" + provider + "' does not offer FI_HMEM: device memory is declined (the engine "
                                             "stages it through another transport)";
}

std::optional<HmemTarget> HmemTargetFor(const MemoryKind& kind) {
  HmemTarget t;
  t.device = kind.device < 0 ? 0 : static_cast<uint64_t>(kind.device);
  switch (kind.type) {
    case MemoryType::kCuda:
      t.iface = FI_HMEM_CUDA;
      return t;
    case MemoryType::kRocm:
      t.iface = FI_HMEM_ROCR;
      return t;
    default:
      return std::nullopt;  // npu, musa: libfabric 1.17 names no interface for them
  }
}

EfaTransport::EfaTransport() {
  cfg_.provider = ProviderFromEnv();
  software_provider_ = cfg_.provider.empty() ? false : IsSoftwareProvider(cfg_.provider);
  same_host_only_ = IsSameHostProvider(cfg_.provider);
}

EfaTransport::~EfaTransport() { Stop(); }

TransportCapabilities EfaTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = !same_host_only_;
  c.same_host = true;
  c.memory = {{MemoryType::kHost, MemoryType::kHost}};
  if (hmem_) {
    // Device memory moves where every domain took FI_HMEM; a region whose registration the provider refused
    // is declined, and the engine picks another transport for it.
    for (MemoryType device : {MemoryType::kCuda, MemoryType::kRocm}) {
      c.memory.push_back({device, MemoryType::kHost});
      c.memory.push_back({MemoryType::kHost, device});
      c.memory.push_back({device, device});
    }
  }
  // Hardware providers before tcp; a software provider only where asked for (the preferred protocol).
  c.priority = software_provider_ ? -10 : 20;
  return c;
}

Status EfaTransport::Configure(const TransportOptions& options) {
  cfg_ = EfaConfig::From(options);
  software_provider_ = cfg_.provider.empty() ? false : IsSoftwareProvider(cfg_.provider);
  same_host_only_ = IsSameHostProvider(cfg_.provider);
  return Status::Ok();
}

Status EfaTransport::Start(const TransportContext& ctx) {
  ctx_ = ctx;
  mooncake_names_ = ctx.protocol == "efa";
  retry_count_ = ctx.config ? ctx.config->retry_count : 9;
  if (injected_api_ != nullptr) {
    api_ = injected_api_;
  } else {
    auto api = LoadFabricApi();
    if (!api.ok()) return api.status();
    api_ = *api;
  }
  auto provider = ChooseProvider(api_, cfg_.provider);
  if (!provider.ok()) return provider.status();
  FabricDomain::Options o;
  o.provider = *provider;
  o.domain_filter = ctx.device_filter;
  o.prefer_ip = ctx.advertised_ip;
  o.max_outstanding = cfg_.max_outstanding;
  o.op_timeout = cfg_.op_timeout;
  o.cq_wait = cfg_.cq_wait;
  o.idle_poll_us = cfg_.idle_poll_us;
  o.delivery_complete = cfg_.delivery_complete;
  // FI_HMEM only where this process has device memory to register: the shm provider opened with it moves
  // host memory differently (measured here: 1 MiB writes faster, batches of 64 KiB writes 4x slower).
  o.hmem = cfg_.hmem && HasDevicePlatform(ctx.platforms);
  hmem_asked_ = o.hmem;
  auto domains = FabricDomain::OpenAll(api_, o);
  if (!domains.ok()) return domains.status();
  auto epoch = EpochPage::Create();
  if (!epoch.ok()) return epoch.status();
  epoch_ = std::move(epoch.value());
  slice_size_ = cfg_.slice_size;
  std::string names;
  for (auto& d : *domains) {
    auto rail = std::make_unique<Rail>();
    rail->domain = d;
    auto mr = d->Register(epoch_->page(), EpochPage::kPageSize, FabricDomain::RemoteAccess::kRead);
    if (!mr.ok()) return Status(mr.status().code(), "efa: registering the epoch page: " + mr.status().message());
    rail->epoch_mr = std::move(mr.value());
    rail->slots = std::make_unique<EpochSlots>(d);
    const DomainInfo& info = d->info();
    if (info.max_msg_size > 0 && slice_size_ > info.max_msg_size / 5 * 4) slice_size_ = info.max_msg_size / 5 * 4;
    names += (names.empty() ? "" : ", ") + info.domain;
    rails_.push_back(std::move(rail));
  }
  const DomainInfo& first = rails_.front()->domain->info();
  software_provider_ = IsSoftwareProvider(first.provider);
  same_host_only_ = IsSameHostProvider(first.provider);
  hmem_ = std::all_of(rails_.begin(), rails_.end(), [](const auto& r) { return r->domain->info().hmem; });
  MC_LOG(kInfo) << "efa: " << rails_.size() << " NIC(s) over " << first.provider << ": " << names << "; "
                << (hmem_asked_ ? HmemSummary(first.provider, hmem_)
                                : std::string("FI_HMEM not asked for (") +
                                      (cfg_.hmem ? "no usable cuda or rocm platform" : "efa.hmem is off") +
                                      "): device memory is declined");
  return Status::Ok();
}

void EfaTransport::Stop() {
  stopping_.store(true);
  for (auto& r : rails_) r->domain->Stop();
  std::lock_guard lock(mu_);
  peers_.clear();
}

std::vector<DomainInfo> EfaTransport::domains() const {
  std::vector<DomainInfo> out;
  for (const auto& r : rails_) out.push_back(r->domain->info());
  return out;
}

DomainInfo EfaTransport::domain_info() const { return rails_.empty() ? DomainInfo{} : rails_[0]->domain->info(); }

StatusOr<RegionRegistration> EfaTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  HmemTarget target;  // host memory: FI_HMEM_SYSTEM
  if (region.kind.type != MemoryType::kHost) {
    auto decline = [&](std::string why) {
      r.declined = true;
      r.why_declined = std::move(why);
      MC_LOG(kInfo) << r.why_declined;
      return r;
    };
    if (!region.kind.is_device()) return decline("efa registers host and device memory only (not " +
                                                 region.kind.ToString() + ")");
    auto hmem = HmemTargetFor(region.kind);
    if (!hmem) {
      return decline("efa: device memory (" + region.kind.ToString() + ") has no libfabric FI_HMEM interface");
    }
    std::string without;
    for (const auto& rail : rails_) {
      if (!rail->domain->info().hmem) without += (without.empty() ? "" : ", ") + rail->domain->info().domain;
    }
    const std::string provider = rails_.empty() ? cfg_.provider : rails_[0]->domain->info().provider;
    if (rails_.empty() || !without.empty()) {
      const std::string head = "efa: device memory (" + region.kind.ToString() + ") needs FI_HMEM, ";
      if (!hmem_asked_) {
        return decline(head + "which was not asked of provider '" + provider + "' (" +
                       (cfg_.hmem ? "no usable cuda or rocm platform at start" : "efa.hmem is off") + ")");
      }
      return decline(head + "which provider '" + provider + "' does not offer" +
                     (without.empty() ? std::string() : " on " + without));
    }
    target = *hmem;
  }
  if (rails_.empty()) return Status(ErrorCode::kContext, "the efa transport is not started");
  auto state = std::make_shared<EfaRegionState>();
  state->chunk = cfg_.max_mr_size != 0 && cfg_.max_mr_size < region.length ? cfg_.max_mr_size : region.length;
  const uint64_t chunks = region.length / state->chunk + (region.length % state->chunk != 0);
  // A region not registered for remote access gets a key peers cannot use (keys of tcp and shm are small
  // counters a peer could guess).
  const auto access = region.remote_accessible ? FabricDomain::RemoteAccess::kReadWrite
                                               : FabricDomain::RemoteAccess::kNone;
  std::vector<std::vector<uint64_t>> keys;
  for (const auto& rail : rails_) {
    state->mrs.emplace_back();
    keys.emplace_back();
    for (uint64_t c = 0; c < chunks; ++c) {
      const uint64_t at = c * state->chunk;
      const uint64_t len = std::min<uint64_t>(state->chunk, region.length - at);
      auto mr = rail->domain->Register(reinterpret_cast<void*>(region.start + at), len, access, target);
      if (!mr.ok()) {
        const std::string why = "efa: registering " + Range(region.start + at, len) + " (" +
                                region.kind.ToString() + ") with " + rail->domain->info().domain + ": " +
                                mr.status().message();
        if (target.iface == FI_HMEM_SYSTEM) return Status(mr.status().code(), why);
        // The provider offers FI_HMEM but refused this device memory (e.g. no driver for the interface):
        // declined, so the engine moves it through another transport. The registrations made are closed.
        r.declined = true;
        r.why_declined = why;
        MC_LOG(kInfo) << why;
        return r;
      }
      keys.back().push_back(mr.value()->key());
      state->mrs.back().push_back(std::move(mr.value()));
    }
  }
  r.descriptor_fields = BufferFields(mooncake_names_, state->chunk, keys, region.remote_accessible);
  r.state = std::move(state);
  return r;
}

void EfaTransport::WithdrawRegion(const MemoryRegion& region) {
  // Peers hold no key of a region registered without remote access: nothing to fence.
  if (!epoch_ || !region.remote_accessible) return;
  epoch_->Advance();
  // Every lease a peer took on the old value ends within efa.epoch_lease_us / 2 of the read that gave it
  // (served before the Advance): after this wait none is left (see EfaTransport::Start in efa_submit.cc).
  if (cfg_.epoch_lease_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(cfg_.epoch_lease_us));
}

void EfaTransport::Describe(nlohmann::json& d) const {
  if (rails_.empty() || !epoch_) return;
  std::vector<FabricDevice> devices;
  std::vector<uint64_t> epoch_keys;
  for (const auto& r : rails_) {
    const DomainInfo& info = r->domain->info();
    devices.push_back({info.domain, info.address, info.provider});
    epoch_keys.push_back(r->epoch_mr->key());
  }
  WriteFabric(d, mooncake_names_, devices, rails_[0]->domain->info().virt_addr, epoch_->value(), epoch_->addr(),
              epoch_keys, static_cast<uint64_t>(cfg_.epoch_lease_us));
}

bool EfaTransport::CanReach(const SegmentDescriptor& peer) const {
  if (rails_.empty()) return false;
  auto fabric = ReadPeerFabric(peer);
  if (!fabric.ok()) return false;
  const std::string& provider = rails_[0]->domain->info().provider;
  bool any = false;
  for (const auto& dev : fabric->devices) any = any || dev.provider == provider;
  if (!any) return false;
  if (same_host_only_ && (ctx_.host_id.empty() || peer.json.value("host_id", "") != ctx_.host_id)) return false;
  return true;
}

std::shared_ptr<EfaTransport::Peer> EfaTransport::PeerFor(const SegmentDescriptor& desc, Status* error) {
  auto fabric = ReadPeerFabric(desc);
  if (!fabric.ok()) {
    *error = fabric.status();
    return nullptr;
  }
  std::string gids;
  for (const auto& dev : fabric->devices) gids += dev.gid + ",";
  const std::string key = JsonString(desc.json, "instance").value_or(desc.name);
  std::lock_guard lock(mu_);
  auto it = peers_.find(key);
  if (it != peers_.end() && it->second->gids == gids) return it->second;
  auto p = std::make_shared<Peer>();
  p->name = desc.name;
  p->gids = gids;
  p->fabric = std::move(fabric.value());
  p->host_id = JsonString(desc.json, "host_id").value_or("");
  // host_id is "<boot id>/<network namespace>/<pid namespace>": a peer of the same network stack may be
  // reached over loopback addresses; another host's loopback addresses would reach this one.
  auto network = [](const std::string& id) { return id.substr(0, id.rfind('/')); };
  const bool same_network = !ctx_.host_id.empty() && network(p->host_id) == network(ctx_.host_id);
  // Pair each local NIC with a peer NIC of the same provider: the longest common IPv4 prefix (the same
  // subnet), else the one at the same index.
  std::set<uint32_t> local_ips;
  for (const auto& rail : rails_) {
    in_addr a{};
    const std::string& ip = rail->domain->info().source_ip;
    if (!ip.empty() && inet_pton(AF_INET, ip.c_str(), &a) == 1) local_ips.insert(ntohl(a.s_addr));
  }
  for (size_t r = 0; r < rails_.size(); ++r) {
    const DomainInfo& info = rails_[r]->domain->info();
    std::optional<uint32_t> mine;
    if (in_addr a{}; !info.source_ip.empty() && inet_pton(AF_INET, info.source_ip.c_str(), &a) == 1) {
      mine = ntohl(a.s_addr);
    }
    int best = -1, best_score = -1;
    const size_t n = p->fabric.devices.size();
    for (size_t k = 0; k < n; ++k) {
      const size_t d = (r + k) % n;  // index order starting at the same index: ties go to it
      const FabricDevice& dev = p->fabric.devices[d];
      if (dev.provider != info.provider || (!same_network && GidIsLoopback(dev.gid))) continue;
      auto theirs = GidIpv4(dev.gid);
      // An address of another network stack that is also one of ours (e.g. docker0's 172.17.0.1 on every
      // host) would reach this host, not the peer.
      if (!same_network && theirs && local_ips.count(*theirs) != 0) continue;
      const int score = mine && theirs ? CommonPrefix(*mine, *theirs) : 0;
      if (score > best_score) {
        best = static_cast<int>(d);
        best_score = score;
      }
    }
    if (best < 0) continue;
    auto addr = rails_[r]->domain->Insert(p->fabric.devices[best].gid);
    if (!addr.ok()) {
      *error = Status(addr.status().code(), "segment '" + desc.name + "': " + addr.status().message());
      continue;
    }
    Path path;
    path.rail = static_cast<int>(r);
    path.device = static_cast<size_t>(best);
    path.addr = *addr;
    path.in_av = true;
    p->paths.push_back(std::move(path));
  }
  if (p->paths.empty()) {
    if (error->ok()) {
      *error = Status(ErrorCode::kPeerUnreachable,
                      "segment '" + desc.name + "': none of its efa NICs pairs with a local one");
    }
    return nullptr;
  }
  if (it != peers_.end()) {
    std::lock_guard plock(it->second->mu);  // the counters carry over
    p->bytes = it->second->bytes;
    p->slices = it->second->slices;
    p->errors = it->second->errors;
    p->stale = it->second->stale;
  }
  peers_[key] = p;
  return p;
}

int EfaTransport::ChoosePath(Peer& peer, bool revive) {
  std::lock_guard lock(peer.mu);
  const auto now = std::chrono::steady_clock::now();
  int best = -1;
  for (size_t i = 0; i < peer.paths.size(); ++i) {
    Path& p = peer.paths[i];
    if (revive && p.down && now >= p.down_until) {
      // Down long enough: try again, with a fresh address-vector entry.
      Rail& rail = *rails_[p.rail];
      if (p.in_av) rail.domain->Remove(p.addr);
      p.in_av = false;
      auto addr = rail.domain->Insert(peer.fabric.devices[p.device].gid);
      if (addr.ok()) {
        p.addr = *addr;
        p.in_av = true;
        p.down = false;
        MC_LOG(kInfo) << "efa: trying " << rail.domain->info().domain << " -> "
                      << peer.fabric.devices[p.device].name << " of '" << peer.name << "' again";
      } else {
        p.down_until = now + kRetryDownPeerAfter;
      }
    }
    if (p.down) continue;
    if (best < 0 || p.in_flight < peer.paths[best].in_flight) best = static_cast<int>(i);
  }
  return best;
}

void EfaTransport::PathFailed(Peer& peer, int path, const Status& why) {
  std::lock_guard lock(peer.mu);
  Path& p = peer.paths[path];
  p.errors++;
  if (p.down) return;
  p.down = true;
  p.why_down = why.message();
  p.down_until = std::chrono::steady_clock::now() + kRetryDownPeerAfter;
  Rail& rail = *rails_[p.rail];
  MC_LOG(kWarning) << "efa: path " << rail.domain->info().domain << " -> " << peer.fabric.devices[p.device].name
                   << " of '" << peer.name << "' down for " << kRetryDownPeerAfter.count() << " s: " << why.message();
  if (why.code() == ErrorCode::kTimeout && p.in_av) {
    // A peer that does not answer: later operations to this address fail at once instead of queueing.
    rail.domain->Remove(p.addr);
    p.in_av = false;
  }
}

void EfaTransport::ForgetPeer(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    // The addresses stay in the address vectors: operations still running may use them.
    if (it->second->name == segment_name) {
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
}

nlohmann::json EfaTransport::Stats() const {
  nlohmann::json out = nlohmann::json::object();
  std::lock_guard lock(mu_);
  for (const auto& [key, p] : peers_) {
    std::lock_guard plock(p->mu);
    nlohmann::json paths = nlohmann::json::array();
    std::string state;
    for (const auto& path : p->paths) {
      if (!path.down) state = "up";
      paths.push_back({{"local", rails_[path.rail]->domain->info().domain},
                       {"remote", p->fabric.devices[path.device].name},
                       {"state", path.down ? "down: " + path.why_down : "up"},
                       {"bytes", path.bytes},
                       {"slices", path.slices},
                       {"errors", path.errors},
                       {"local_drives", rails_[path.rail]->domain->drives()}});
    }
    if (state.empty()) state = "down: " + (p->paths.empty() ? std::string("no path") : p->paths[0].why_down);
    out[p->name] = {{"bytes", p->bytes},          {"slices", p->slices},         {"errors", p->errors},
                    {"stale_epoch", p->stale},      {"epoch_reads", p->epoch_reads}, {"epoch_lease_hits", p->lease_hits},
                    {"state", state},               {"paths", std::move(paths)}};
  }
  return out;
}

MC_TRANSPORT_PLUGIN("efa", EfaTransport, {"efa"}, "", ProbeEfa);

}  // namespace mooncake::te::efa
