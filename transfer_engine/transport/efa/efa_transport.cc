#include "transfer_engine/transport/efa/efa_transport.h"

#include <dirent.h>
#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te::efa {

namespace {

/// A peer marked down (an operation timed out) is tried again after this long; meanwhile its slices fail at
/// once (kOtherPath), so they go to another transport instead of waiting for the timeout again.
constexpr std::chrono::seconds kRetryDownPeerAfter(5);

/// What the transport keeps per registered region: its registration with the domain.
struct EfaRegionState : TransportRegionState {
  std::unique_ptr<FabricMr> mr;
};

bool IsSoftwareProvider(const std::string& provider) {
  return provider.rfind("efa", 0) != 0 && provider.rfind("verbs", 0) != 0 && provider.rfind("cxi", 0) != 0;
}

bool IsSameHostProvider(const std::string& provider) { return provider.rfind("shm", 0) == 0; }

std::optional<bool> JsonBool(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

// The first entry of the peer's efa_devices, when it is an object with a string gid and provider.
const nlohmann::json* FirstDevice(const SegmentDescriptor& d) {
  auto it = d.json.find("efa_devices");
  if (it == d.json.end() || !it->is_array() || it->empty()) return nullptr;
  const nlohmann::json& dev = (*it)[0];
  if (!JsonString(dev, "gid") || !JsonString(dev, "provider")) return nullptr;
  return &dev;
}

// Whether libfabric finds an RDM endpoint with RMA for `provider`.
Status FindProvider(const FabricApi* api, const std::string& provider) {
  struct fi_info* hints = api->dupinfo(nullptr);
  if (hints == nullptr) return Status(ErrorCode::kMemory, "fi_allocinfo failed");
  hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
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
  }
  return p;
}

/// A peer as this transport knows it: its address in the address vector and where its epoch is.
struct EfaTransport::Peer {
  std::string name;
  std::string gid;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  bool virt_addr = true;
  uint64_t epoch_addr = 0;
  uint64_t epoch_rkey = 0;
  std::atomic<bool> down{false};
  mutable std::mutex mu;  // guards the counters, why_down and down_until
  std::string why_down;
  std::chrono::steady_clock::time_point down_until{};  // when a down peer may be tried again
  uint64_t bytes = 0, slices = 0, errors = 0, stale = 0;
};

/// The slices of one Submit to one peer.
struct EfaTransport::Group {
  std::shared_ptr<Peer> peer;
  uint64_t expected_epoch = 0;
  bool fence_writes = false;  // writes complete only after a trailing epoch read (no delivery-complete)
  struct Item {
    Slice* slice;
    std::unique_ptr<FabricOp> op;
    RegionPin local_pin;
  };
  std::vector<Item> items;
  std::atomic<size_t> remaining{0};
  std::mutex mu;  // guards held
  std::vector<std::pair<Slice*, Status>> held;  // finished writes waiting for the fence
};

/// The registration epoch (remotely readable, 8 bytes) and a pool of registered 8-byte slots that epoch
/// reads land in. Thread-safe.
class EfaTransport::EpochArea {
 public:
  static StatusOr<std::unique_ptr<EpochArea>> Create(const std::shared_ptr<FabricDomain>& d) {
    std::unique_ptr<EpochArea> a(new EpochArea(d));
    a->value_ = static_cast<std::atomic<uint64_t>*>(aligned_alloc(4096, 4096));
    if (!a->value_) return Status(ErrorCode::kMemory, "cannot allocate the epoch page");
    memset(static_cast<void*>(a->value_), 0, 4096);
    new (a->value_) std::atomic<uint64_t>(0);
    auto mr = d->Register(a->value_, 4096, FabricDomain::RemoteAccess::kRead);
    if (!mr.ok()) return mr.status();
    a->mr_ = std::move(mr.value());
    return a;
  }
  ~EpochArea() {
    mr_.reset();
    chunks_.clear();
    free(value_);
  }
  uint64_t value() const { return value_->load(std::memory_order_acquire); }
  void Advance() { value_->fetch_add(1, std::memory_order_acq_rel); }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(value_); }
  uint64_t key() const { return mr_->key(); }

  struct SlotRef {
    uint64_t* ptr = nullptr;
    void* desc = nullptr;
  };
  StatusOr<SlotRef> Take() {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      Chunk c;
      c.mem.reset(static_cast<uint64_t*>(aligned_alloc(4096, kChunkSlots * 8)));
      if (!c.mem) return Status(ErrorCode::kMemory, "cannot allocate epoch read slots");
      auto mr = domain_->Register(c.mem.get(), kChunkSlots * 8, FabricDomain::RemoteAccess::kNone);
      if (!mr.ok()) return mr.status();
      c.mr = std::move(mr.value());
      for (size_t i = 0; i < kChunkSlots; ++i) free_.push_back({c.mem.get() + i, c.mr->desc()});
      chunks_.push_back(std::move(c));
    }
    SlotRef s = free_.back();
    free_.pop_back();
    return s;
  }
  void Give(SlotRef s) {
    std::lock_guard lock(mu_);
    free_.push_back(s);
  }

 private:
  static constexpr size_t kChunkSlots = 512;
  struct Chunk {
    struct Free {
      void operator()(uint64_t* p) const { free(p); }
    };
    std::unique_ptr<uint64_t, Free> mem;
    std::unique_ptr<FabricMr> mr;  // declared after mem: closed first
    Chunk() = default;
    Chunk(Chunk&&) = default;
    ~Chunk() { mr.reset(); }
  };
  explicit EpochArea(std::shared_ptr<FabricDomain> d) : domain_(std::move(d)) {}

  std::shared_ptr<FabricDomain> domain_;
  std::atomic<uint64_t>* value_ = nullptr;
  std::unique_ptr<FabricMr> mr_;
  std::mutex mu_;
  std::vector<Chunk> chunks_;
  std::vector<SlotRef> free_;
};

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
  auto api = LoadFabricApi();
  if (!api.ok()) return api.status();
  api_ = *api;
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
  auto domain = FabricDomain::Open(api_, o);
  if (!domain.ok()) return domain.status();
  domain_ = std::move(domain.value());
  const DomainInfo& info = domain_->info();
  software_provider_ = IsSoftwareProvider(info.provider);
  same_host_only_ = IsSameHostProvider(info.provider);
  slice_size_ = cfg_.slice_size;
  if (info.max_msg_size > 0 && slice_size_ > info.max_msg_size / 5 * 4) slice_size_ = info.max_msg_size / 5 * 4;
  domain_->set_on_timeout([this](fi_addr_t a) { OnTimeout(a); });
  auto epoch = EpochArea::Create(domain_);
  if (!epoch.ok()) return epoch.status();
  epoch_ = std::move(epoch.value());
  return Status::Ok();
}

void EfaTransport::Stop() {
  if (domain_) domain_->Stop();
  std::lock_guard lock(mu_);
  peers_.clear();
}

DomainInfo EfaTransport::domain_info() const { return domain_ ? domain_->info() : DomainInfo{}; }

StatusOr<RegionRegistration> EfaTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  if (region.kind.type != MemoryType::kHost) {
    r.declined = true;
    r.why_declined = "the efa transport registers host memory only";
    return r;
  }
  if (!domain_) return Status(ErrorCode::kContext, "the efa transport is not started");
  // A region not registered for remote access gets a key peers cannot use (keys of tcp and shm are small
  // counters a peer could guess).
  auto mr = domain_->Register(reinterpret_cast<void*>(region.start), region.length,
                              region.remote_accessible ? FabricDomain::RemoteAccess::kReadWrite
                                                       : FabricDomain::RemoteAccess::kNone);
  if (!mr.ok()) {
    return Status(mr.status().code(), "efa: registering " + Range(region.start, region.length) + ": " +
                                          mr.status().message());
  }
  auto state = std::make_shared<EfaRegionState>();
  const uint64_t key = mr.value()->key();
  state->mr = std::move(mr.value());
  if (region.remote_accessible) r.descriptor_fields["efa_rkey"] = nlohmann::json::array({key});
  r.descriptor_fields["efa_lkey"] = nlohmann::json::array({key});
  r.state = std::move(state);
  return r;
}

void EfaTransport::WithdrawRegion(const MemoryRegion&) {
  if (epoch_) epoch_->Advance();
}

void EfaTransport::Describe(nlohmann::json& d) const {
  if (!domain_ || !epoch_) return;
  const DomainInfo& info = domain_->info();
  d["efa_devices"] = nlohmann::json::array(
      {{{"name", info.domain}, {"lid", 0}, {"gid", info.address}, {"provider", info.provider}}});
  d["efa_virt_addr"] = info.virt_addr;
  d["efa_epoch"] = epoch_->value();
  d["efa_epoch_addr"] = epoch_->addr();
  d["efa_epoch_rkey"] = epoch_->key();
}

bool EfaTransport::CanReach(const SegmentDescriptor& peer) const {
  if (!domain_) return false;
  const nlohmann::json* dev = FirstDevice(peer);
  if (!dev || *JsonString(*dev, "provider") != domain_->info().provider) return false;
  if (!JsonUint(peer.json, "efa_epoch") || !JsonUint(peer.json, "efa_epoch_addr") ||
      !JsonUint(peer.json, "efa_epoch_rkey") || !JsonBool(peer.json, "efa_virt_addr")) {
    return false;
  }
  if (same_host_only_ && (ctx_.host_id.empty() || peer.json.value("host_id", "") != ctx_.host_id)) return false;
  return true;
}

std::shared_ptr<EfaTransport::Peer> EfaTransport::PeerFor(const SegmentDescriptor& desc, Status* error) {
  const nlohmann::json* dev = FirstDevice(desc);
  auto epoch_addr = JsonUint(desc.json, "efa_epoch_addr");
  auto epoch_rkey = JsonUint(desc.json, "efa_epoch_rkey");
  auto virt = JsonBool(desc.json, "efa_virt_addr");
  if (!dev || !epoch_addr || !epoch_rkey || !virt) {
    *error = Status(ErrorCode::kMalformedJson, "segment '" + desc.name + "' has no usable efa fields");
    return nullptr;
  }
  const std::string gid = *JsonString(*dev, "gid");
  const std::string key = JsonString(desc.json, "instance").value_or(desc.name);
  std::lock_guard lock(mu_);
  auto it = peers_.find(key);
  if (it != peers_.end() && it->second->gid == gid) {
    Peer& old = *it->second;
    if (!old.down.load()) return it->second;
    std::lock_guard plock(old.mu);
    if (std::chrono::steady_clock::now() < old.down_until) return it->second;
    // Down long enough: try again with a fresh address-vector entry (its old one was removed).
    MC_LOG(kInfo) << "efa: trying peer '" << desc.name << "' again";
  }
  auto addr = domain_->Insert(gid);
  if (!addr.ok()) {
    *error = Status(addr.status().code(), "segment '" + desc.name + "': " + addr.status().message());
    return nullptr;
  }
  auto p = std::make_shared<Peer>();
  p->name = desc.name;
  p->gid = gid;
  p->addr = *addr;
  p->virt_addr = *virt;
  p->epoch_addr = *epoch_addr;
  p->epoch_rkey = *epoch_rkey;
  if (it != peers_.end()) {
    if (!it->second->down.load()) domain_->Remove(it->second->addr);
    std::lock_guard plock(it->second->mu);  // the counters carry over
    p->bytes = it->second->bytes;
    p->slices = it->second->slices;
    p->errors = it->second->errors;
    p->stale = it->second->stale;
  }
  peers_[key] = p;
  return p;
}

void EfaTransport::OnTimeout(fi_addr_t addr) {
  std::lock_guard lock(mu_);
  for (auto& [key, p] : peers_) {
    if (p->addr != addr || p->down.exchange(true)) continue;
    {
      std::lock_guard plock(p->mu);
      p->why_down = "an operation timed out";
      p->down_until = std::chrono::steady_clock::now() + kRetryDownPeerAfter;
    }
    MC_LOG(kWarning) << "efa: peer '" << p->name << "' marked down: an operation did not complete in "
                     << cfg_.op_timeout.count() << " ms";
    domain_->Remove(addr);
  }
}

namespace {

// Reports a slice's outcome and counts it for the peer. Errors may be retried on another path.
template <typename PeerT>
void Finish(PeerT& peer, Slice* s, const Status& st) {
  {
    std::lock_guard lock(peer.mu);
    if (st.ok()) {
      peer.bytes += s->length;
      peer.slices++;
    } else {
      peer.errors++;
    }
  }
  if (st.ok()) {
    s->Complete(st);
  } else if (st.code() == ErrorCode::kStaleMetadata) {
    s->Fail(st, SliceRetry::kRefreshPeer);
  } else {
    s->Fail(st, SliceRetry::kOtherPath);
  }
}

}  // namespace

void EfaTransport::Submit(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  if (slices.empty()) return;
  Status error;
  std::shared_ptr<Peer> peer = domain_ ? PeerFor(desc, &error) : nullptr;
  if (!domain_) error = Status(ErrorCode::kContext, "the efa transport is not started");
  if (!peer || peer->down.load()) {
    if (peer) {
      std::lock_guard lock(peer->mu);
      error = Status(ErrorCode::kPeerUnreachable, "efa peer '" + desc.name + "' is down: " + peer->why_down);
    }
    for (Slice* s : slices) s->Fail(error, SliceRetry::kOtherPath);
    return;
  }
  auto g = std::make_shared<Group>();
  g->peer = peer;
  g->expected_epoch = JsonUint(desc.json, "efa_epoch").value_or(0);
  g->fence_writes = !domain_->info().delivery_complete;
  for (Slice* s : slices) {
    const BufferDescriptor* buf = desc.FindBuffer(s->remote, s->length);
    if (!buf) {
      Finish(*peer, s, Status(ErrorCode::kAddressNotRegistered,
                              "range " + Range(s->remote, s->length) + " is not inside a buffer of '" + desc.name + "'"));
      continue;
    }
    std::optional<uint64_t> rkey;
    if (auto k = buf->json.find("efa_rkey"); k != buf->json.end() && k->is_array() && !k->empty() &&
                                              (*k)[0].is_number_unsigned()) {
      rkey = (*k)[0].get<uint64_t>();
    }
    if (!rkey) {
      Finish(*peer, s, Status(ErrorCode::kRemoteRejected, "buffer " + Range(buf->addr, buf->length) + " of '" +
                                                              desc.name + "' is not registered with efa"));
      continue;
    }
    RegionPin pin = ctx_.memory->Find(reinterpret_cast<uint64_t>(s->local), s->length, /*remote=*/false);
    const MemoryRegion::TransportEntry* entry = pin ? pin->transport("efa") : nullptr;
    auto* state = entry && entry->state ? static_cast<EfaRegionState*>(entry->state.get()) : nullptr;
    if (!state || !state->mr) {
      Finish(*peer, s, Status(ErrorCode::kAddressNotRegistered,
                              "local range " + Range(reinterpret_cast<uint64_t>(s->local), s->length) +
                                  " is not registered with efa"));
      continue;
    }
    auto op = std::make_unique<FabricOp>();
    op->kind = s->opcode == OpCode::kWrite ? FabricOp::Kind::kWrite : FabricOp::Kind::kRead;
    op->local = s->local;
    op->length = s->length;
    op->local_desc = state->mr->desc();
    op->dest = peer->addr;
    op->remote_addr = peer->virt_addr ? s->remote : s->remote - buf->addr;
    op->remote_key = *rkey;
    g->items.push_back({s, std::move(op), std::move(pin)});
  }
  if (g->items.empty()) return;
  StartGroup(g);
}

void EfaTransport::ReadEpoch(const std::shared_ptr<Group>& g, std::function<void(const Status&, uint64_t)> then) {
  auto slot = epoch_->Take();
  if (!slot.ok()) {
    then(slot.status(), 0);
    return;
  }
  auto op = std::make_unique<FabricOp>();
  op->kind = FabricOp::Kind::kRead;
  op->local = slot->ptr;
  op->length = sizeof(uint64_t);
  op->local_desc = slot->desc;
  op->dest = g->peer->addr;
  op->remote_addr = g->peer->virt_addr ? g->peer->epoch_addr : 0;
  op->remote_key = g->peer->epoch_rkey;
  EpochArea* area = epoch_.get();
  EpochArea::SlotRef ref = *slot;
  op->done = [area, ref, then = std::move(then)](const Status& st) {
    uint64_t value = *reinterpret_cast<volatile uint64_t*>(ref.ptr);
    area->Give(ref);
    then(st, value);
  };
  domain_->Post(std::move(op));
}

void EfaTransport::StartGroup(const std::shared_ptr<Group>& g) {
  // Nothing is posted until the peer's epoch says its descriptor is current.
  ReadEpoch(g, [this, g](const Status& st, uint64_t value) {
    Status error = st;
    if (st.ok() && value != g->expected_epoch) {
      std::lock_guard lock(g->peer->mu);
      g->peer->stale++;
      error = Status(ErrorCode::kStaleMetadata, "'" + g->peer->name +
                                                    "' withdrew memory since its descriptor was fetched (epoch " +
                                                    std::to_string(value) + ", descriptor " +
                                                    std::to_string(g->expected_epoch) + ")");
    }
    if (!error.ok()) {
      for (auto& item : g->items) Finish(*g->peer, item.slice, error);
      g->items.clear();
      return;
    }
    PostData(g);
  });
}

void EfaTransport::PostData(const std::shared_ptr<Group>& g) {
  g->remaining.store(g->items.size());
  std::vector<std::unique_ptr<FabricOp>> ops;
  for (auto& item : g->items) {
    Slice* s = item.slice;
    const bool hold = g->fence_writes && s->opcode == OpCode::kWrite;
    item.op->done = [this, g, s, hold, pin = item.local_pin](const Status& st) {
      if (hold) {
        std::lock_guard lock(g->mu);
        g->held.emplace_back(s, st);
      } else {
        Finish(*g->peer, s, st);
      }
      OneDone(g);
    };
    ops.push_back(std::move(item.op));
  }
  for (auto& op : ops) domain_->Post(std::move(op));
}

void EfaTransport::OneDone(const std::shared_ptr<Group>& g) {
  if (g->remaining.fetch_sub(1) != 1) return;
  std::vector<std::pair<Slice*, Status>> held;
  {
    std::lock_guard lock(g->mu);
    held.swap(g->held);
  }
  if (held.empty()) return;
  bool any_ok = false;
  for (const auto& [s, st] : held) any_ok = any_ok || st.ok();
  if (!any_ok) {
    for (const auto& [s, st] : held) Finish(*g->peer, s, st);
    return;
  }
  // A read on the same connection is answered after the writes before it were applied.
  ReadEpoch(g, [g, held = std::move(held)](const Status& fence, uint64_t) {
    for (const auto& [s, st] : held) {
      Finish(*g->peer, s, !st.ok() ? st : fence.ok() ? st
                                                     : Status(fence.code(), "efa write not confirmed: " + fence.message()));
    }
  });
}

void EfaTransport::ForgetPeer(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    // The address stays in the address vector: operations of groups still running may use it, and a
    // re-insert of the same address yields it again.
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
    out[p->name] = {{"bytes", p->bytes},
                    {"slices", p->slices},
                    {"errors", p->errors},
                    {"stale_epoch", p->stale},
                    {"state", p->down ? "down: " + p->why_down : "up"}};
  }
  return out;
}

MC_TRANSPORT_PLUGIN("efa", EfaTransport, {"efa"}, "", ProbeEfa);

}  // namespace mooncake::te::efa
