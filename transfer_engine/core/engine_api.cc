// The public TransferEngine methods: argument checks and hand-off to TransferEngine::Impl (engine_impl.h).
#include <unistd.h>

#include <atomic>

#include <nlohmann/json.hpp>

#include "transfer_engine/common/log.h"
#include "transfer_engine/core/engine_impl.h"

namespace mooncake::te {

// ---------------------------------------------------------------------------------------------------------
// Public API

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(EngineOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Status st = impl->Init();
  if (!st.ok()) {
    impl->Shutdown();
    return st;
  }
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

const std::string& TransferEngine::segment_name() const { return impl_->segment_name_; }
uint16_t TransferEngine::rpc_port() const { return impl_->rpc_.port(); }
const EngineConfig& TransferEngine::config() const { return impl_->config_; }

Status TransferEngine::Impl::RegisterRegion(MemoryRegion region) {
  MC_RETURN_IF_ERROR(memory_.CheckRange(region.start, region.length));
  // The location names the kind when it is a device ("cuda:0"); else the platform layer knows the pointer.
  auto named = MemoryKind::Parse(region.location.empty() ? "*" : region.location);
  if (!named.ok()) {
    return InvalidArgument("location '" + region.location + "' names no memory kind (" + named.status().message() + ")");
  }
  region.kind = named->is_device() ? *named : PlatformRegistry::Get().Classify(reinterpret_cast<void*>(region.start));
  int exported_fd = region.kind.is_device() && region.backing_fd < 0 ? AttachDeviceBacking(region) : -1;
  Status registered = transports_.Register(region);
  if (exported_fd >= 0) {
    // Every transport has registered (or none kept it): a transport that needs the dma-buf holds its own
    // reference by now, so the engine's fd goes and the stored region no longer names it.
    close(exported_fd);
    region.backing_fd = -1;
    region.backing_offset = 0;
  }
  MC_RETURN_IF_ERROR(registered);
  Status st = memory_.Register(region);
  if (!st.ok()) transports_.Unregister(region);
  return st;
}

int TransferEngine::Impl::AttachDeviceBacking(MemoryRegion& region) {
  auto& platforms = PlatformRegistry::Get();
  auto locality = platforms.Locality(region.kind);
  if (locality.ok()) region.locality = *locality;
  const void* ptr = reinterpret_cast<const void*>(region.start);
  std::shared_ptr<Platform> owner = platforms.OwnerOf(ptr, region.kind.type);
  std::string why;
  if (owner) {
    auto exported = owner->ExportDmabuf(ptr, region.length);
    if (exported.ok() && exported->fd >= 0) {
      region.backing_fd = exported->fd;
      region.backing_offset = exported->offset;
      return exported->fd;
    }
    why = exported.ok() ? "the platform returned no fd" : exported.status().ToString();
  } else {
    why = "no usable " + region.kind.ToString() + " platform claims the pointer";
  }
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    MC_LOG(kDebug) << "no dma-buf for " << region.kind.ToString() << " memory at 0x" << std::hex << region.start
                   << std::dec << " (" << why << "); transports register it without one (logged once)";
  }
  return -1;
}

Status TransferEngine::Impl::UnregisterRegion(uint64_t addr) {
  MemoryRegion removed;
  Status st = memory_.Unregister(
      addr, config_.transfer_timeout,
      [this](const MemoryRegion& r) { transports_.Withdraw(r); }, &removed);
  if (!st.ok()) return st;
  transports_.Unregister(removed);
  return Status::Ok();
}

Status TransferEngine::RegisterMemory(void* addr, size_t length, const std::string& location, bool remote_accessible) {
  auto a = reinterpret_cast<uint64_t>(addr);
  MemoryRegion region;
  region.start = a;
  region.length = length;
  region.location = location.empty() ? "*" : location;
  region.remote_accessible = remote_accessible;
  MC_RETURN_IF_ERROR(impl_->RegisterRegion(std::move(region)));
  if (!remote_accessible) return Status::Ok();
  Status st = impl_->PublishLocal();
  if (!st.ok()) {
    Status undo = impl_->UnregisterRegion(a);
    (void)undo;
  }
  return st;
}

Status TransferEngine::UnregisterMemory(void* addr) {
  MC_RETURN_IF_ERROR(impl_->UnregisterRegion(reinterpret_cast<uint64_t>(addr)));
  return impl_->PublishLocal();
}

std::vector<std::string> TransferEngine::InstalledTransports() const {
  return impl_->transports_.List();
}

bool TransferEngine::IsRegistered(const void* addr, size_t length) const {
  return impl_->memory_.Find(reinterpret_cast<uint64_t>(addr), length == 0 ? 1 : length, /*remote=*/false) != nullptr;
}

std::vector<BufferInfo> TransferEngine::LocalBuffers() const {
  std::vector<BufferInfo> out;
  for (const auto& r : impl_->memory_.List()) out.push_back({r.location, r.start, r.length});
  return out;
}

StatusOr<void*> TransferEngine::AllocateManaged(size_t length, int device) {
  if (device < -1) {
    return InvalidArgument("allocate_managed_buffer: device " + std::to_string(device) + ": expected -1 or >= 0");
  }
  // The preferred transport may want its own memory (cxl: a range of the shared device); else the engine's.
  Transport* t = length > 0 ? impl_->transports_.preferred() : nullptr;
  if (t != nullptr) {
    auto own = t->AllocateManaged(length, device);
    if (own.ok()) {
      Status st = RegisterMemory(*own, length);
      if (!st.ok()) {
        Status undo = t->FreeManaged(*own, length);
        (void)undo;
        return st;
      }
      std::lock_guard lock(impl_->transport_managed_mu_);
      impl_->transport_managed_[reinterpret_cast<uint64_t>(*own)] = length;
      return own;
    }
    if (own.status().code() != ErrorCode::kNotImplemented) return own.status();
  }
  if (device >= 0) {
    return InvalidArgument("allocate_managed_buffer: device " + std::to_string(device) + " asked, but the " +
                           (t != nullptr ? "preferred transport '" + t->name() + "'" : std::string("engine")) +
                           " allocates host memory; pass no device, or initialize with a device transport "
                           "(e.g. nvlink_intra, hip) for device memory");
  }
  auto p = impl_->managed_->Allocate(length);
  if (!p.ok()) return p;
  Status st = impl_->PublishLocal();
  if (!st.ok()) {
    Status undo = impl_->managed_->Free(*p, length);
    (void)undo;
    return st;
  }
  return p;
}

Status TransferEngine::FreeManaged(void* addr, size_t length) {
  {
    std::unique_lock lock(impl_->transport_managed_mu_);
    auto it = impl_->transport_managed_.find(reinterpret_cast<uint64_t>(addr));
    if (it != impl_->transport_managed_.end()) {
      if (it->second != length) {
        return InvalidArgument("free_managed_buffer: length " + std::to_string(length) + " is not the " +
                               std::to_string(it->second) + " bytes allocated");
      }
      lock.unlock();
      MC_RETURN_IF_ERROR(impl_->UnregisterRegion(reinterpret_cast<uint64_t>(addr)));
      lock.lock();
      impl_->transport_managed_.erase(reinterpret_cast<uint64_t>(addr));
      lock.unlock();
      Status freed = impl_->transports_.preferred()->FreeManaged(addr, length);
      Status published = impl_->PublishLocal();  // the memory is gone either way: say so to peers
      return freed.ok() ? published : freed;
    }
  }
  MC_RETURN_IF_ERROR(impl_->managed_->Free(addr, length));
  return impl_->PublishLocal();
}

StatusOr<SegmentHandle> TransferEngine::OpenSegment(const std::string& raw_name) {
  std::string name = raw_name;
  while (!name.empty() && name.front() == '/') name.erase(0, 1);
  if (name.empty()) return InvalidArgument("empty segment name");
  if (name == impl_->segment_name_) return kLocalSegment;
  {
    std::lock_guard lock(impl_->seg_mu_);
    auto it = impl_->handles_.find(name);
    if (it != impl_->handles_.end()) return it->second;
  }
  auto desc = impl_->Descriptor(name, /*refresh=*/true);
  if (!desc.ok()) return desc.status();
  std::lock_guard lock(impl_->seg_mu_);
  auto [it, inserted] = impl_->handles_.emplace(name, impl_->handle_names_.size() + 1);
  if (inserted) impl_->handle_names_.push_back(name);
  return it->second;
}

Status TransferEngine::CloseSegment(SegmentHandle handle) {
  auto name = impl_->SegmentNameOf(handle);
  if (!name.ok()) return name.status();
  return Status::Ok();  // handles stay valid (cheap); the cache entry is refreshed on demand
}

StatusOr<std::vector<BufferInfo>> TransferEngine::GetSegmentBuffers(const std::string& name) {
  if (name.empty()) return InvalidArgument("empty segment name");
  auto desc = impl_->Descriptor(name, /*refresh=*/true);
  if (!desc.ok()) return desc.status();
  std::vector<BufferInfo> out;
  for (const auto& b : (*desc)->buffers) out.push_back({b.name, b.addr, b.length});
  return out;
}

void TransferEngine::InvalidateSegment(const std::string& name) { impl_->Forget(name); }

Status TransferEngine::DefineSegment(const std::string& raw_name, const std::string& descriptor_json) {
  std::string name = raw_name;
  while (!name.empty() && name.front() == '/') name.erase(0, 1);
  if (name.empty()) return InvalidArgument("empty segment name");
  if (name == impl_->segment_name_) return InvalidArgument("'" + name + "' is this engine's own segment");
  auto desc = impl_->ParseDescriptor(name, descriptor_json);
  if (!desc.ok()) return desc.status();
  desc->defined_locally = true;
  auto shared = std::make_shared<const SegmentDescriptor>(std::move(desc.value()));
  {
    std::lock_guard lock(impl_->seg_mu_);
    impl_->defined_[name] = std::move(shared);
  }
  impl_->Forget(name);  // connections and open files of an earlier definition or a fetched descriptor
  return Status::Ok();
}

Status TransferEngine::UndefineSegment(const std::string& raw_name) {
  std::string name = raw_name;
  while (!name.empty() && name.front() == '/') name.erase(0, 1);
  {
    std::lock_guard lock(impl_->seg_mu_);
    if (impl_->defined_.erase(name) == 0) return Status(ErrorCode::kNotFound, "segment '" + name + "' is not defined");
  }
  impl_->Forget(name);
  return Status::Ok();
}

StatusOr<BatchId> TransferEngine::AllocateBatch(size_t capacity) {
  if (capacity == 0) return InvalidArgument("batch capacity must be positive");
  if (capacity > (1u << 24)) return InvalidArgument("batch capacity " + std::to_string(capacity) + " is too large");
  auto batch = std::make_shared<Batch>(capacity);
  std::lock_guard lock(impl_->batch_mu_);
  BatchId id = impl_->next_batch_++;
  impl_->batches_.emplace(id, std::move(batch));
  return id;
}

Status TransferEngine::Submit(BatchId batch, const std::vector<TransferRequest>& requests) {
  auto b = impl_->FindBatch(batch);
  if (!b.ok()) return b.status();
  return impl_->SubmitImpl(**b, requests, nullptr, /*drive=*/false);
}

Status TransferEngine::SubmitWithNotify(BatchId batch, const std::vector<TransferRequest>& requests,
                                        Notification notification) {
  auto b = impl_->FindBatch(batch);
  if (!b.ok()) return b.status();
  return impl_->SubmitImpl(**b, requests, &notification, /*drive=*/false);
}

Status TransferEngine::TransferSync(const std::vector<TransferRequest>& requests, std::chrono::nanoseconds timeout,
                                    const Notification* notification) {
  auto batch = std::make_shared<Batch>(requests.empty() ? 1 : requests.size());
  MC_RETURN_IF_ERROR(impl_->SubmitImpl(*batch, requests, notification, /*drive=*/true));
  if (!batch->WaitUntil(std::chrono::steady_clock::now() + timeout)) {
    return Status(ErrorCode::kTimeout, "transfer not finished after " +
                                           std::to_string(std::chrono::duration<double>(timeout).count()) + " s");
  }
  for (size_t i = 0; i < batch->size(); ++i) {
    Status e = batch->task(i).error();
    if (!e.ok()) return e;
  }
  return Status::Ok();
}

StatusOr<TransferStatus> TransferEngine::GetTaskStatus(BatchId batch, size_t task) const {
  auto b = impl_->FindBatch(batch);
  if (!b.ok()) return b.status();
  if (task >= (*b)->size()) return InvalidArgument("task index " + std::to_string(task) + " out of range");
  return (*b)->task(task).status();
}

Status TransferEngine::GetTaskError(BatchId batch, size_t task) const {
  auto b = impl_->FindBatch(batch);
  if (!b.ok()) return b.status();
  if (task >= (*b)->size()) return InvalidArgument("task index " + std::to_string(task) + " out of range");
  return (*b)->task(task).error();
}

StatusOr<TransferStatus> TransferEngine::GetBatchStatus(BatchId batch) const {
  auto b = impl_->FindBatch(batch);
  if (!b.ok()) return b.status();
  return (*b)->status();
}

StatusOr<TransferStatus> TransferEngine::WaitBatch(BatchId batch, std::chrono::nanoseconds timeout) const {
  auto b = impl_->FindBatch(batch);
  if (!b.ok()) return b.status();
  (*b)->WaitUntil(std::chrono::steady_clock::now() + timeout);
  return (*b)->status();
}

Status TransferEngine::FreeBatch(BatchId batch) {
  std::lock_guard lock(impl_->batch_mu_);
  auto it = impl_->batches_.find(batch);
  if (it == impl_->batches_.end()) return InvalidArgument("unknown batch id " + std::to_string(batch));
  if (!it->second->finished()) return Status(ErrorCode::kBatchBusy, "batch " + std::to_string(batch) + " is busy");
  impl_->batches_.erase(it);
  return Status::Ok();
}

Status TransferEngine::ReleaseBatch(BatchId batch) {
  std::lock_guard lock(impl_->batch_mu_);
  if (impl_->batches_.erase(batch) == 0) return InvalidArgument("unknown batch id " + std::to_string(batch));
  return Status::Ok();
}

Status TransferEngine::SendNotify(const std::string& segment, const Notification& notification) {
  return impl_->SendNotifyImpl(segment, notification);
}

std::vector<Notification> TransferEngine::TakeNotifications() { return impl_->notifications_.TakeAll(); }

Status TransferEngine::Probe(const std::string& segment, std::chrono::milliseconds timeout) {
  if (segment.empty()) return InvalidArgument("empty segment name");
  auto rpc = impl_->metadata_->ResolveRpcAddress(segment);
  if (!rpc.ok()) return rpc.status();
  RpcFrame f;
  f.type = RpcType::kProbe;
  f.body = "{}";
  if (timeout.count() <= 0) timeout = impl_->config_.handshake_connect_timeout;
  auto reply = RpcCall(rpc->host, rpc->port, f, timeout, impl_->config_.handshake_max_length);
  if (!reply.ok()) return reply.status();
  auto j = nlohmann::json::parse(reply->body, nullptr, false);
  if (!j.is_object() || j.value("status", "") != "success") {
    return Status(ErrorCode::kRejectHandshake, "unexpected probe reply from '" + segment + "': " + reply->body);
  }
  return Status::Ok();
}

std::string TransferEngine::StatsJson() const {
  nlohmann::json j = nlohmann::json::object();
  impl_->transports_.AddStats(j);
  j["latency"] = impl_->latency_.ToJson();
  auto n = impl_->notifications_.counters();
  j["notifications"] = {{"queued", n.queued},   {"queued_bytes", n.queued_bytes},
                        {"dropped", n.dropped}, {"dropped_bytes", n.dropped_bytes},
                        {"max_count", impl_->notifications_.max_count()},
                        {"max_bytes", impl_->notifications_.max_bytes()}};
  auto r = impl_->rpc_.counters();
  j["listeners"]["rpc"] = {{"port", impl_->rpc_.port()}, {"open", r.open},           {"accepted", r.accepted},
                           {"served", r.served},         {"timed_out", r.timed_out}, {"evicted", r.evicted},
                           {"malformed", r.malformed}};
  return j.dump();
}

namespace {
// device_filter, else MC_TE_FILTERS, else the NICs of MC_CUSTOM_TOPO_JSON, else "" (all).
std::string EffectiveNicFilter(const std::string& device_filter) {
  EngineConfig config = EngineConfig::FromEnv();
  std::string filter = device_filter.empty() ? config.nic_filter : device_filter;
  if (filter.empty() && !config.custom_topology_path.empty()) {
    auto nics = SelectNics("", config.custom_topology_path);
    if (!nics.ok()) {
      MC_LOG(kWarning) << nics.status().message();
      return "-";  // matches no NIC
    }
    for (const auto& n : *nics) filter += (filter.empty() ? "" : ",") + n.name;
  }
  return filter;
}
}  // namespace

std::string TransferEngine::LocalTopologyJson(const std::string& device_filter) {
  return DiscoverTopologyJson(EffectiveNicFilter(device_filter));
}

std::string TransferEngine::LocalHostJson(const std::string& device_filter) {
  return DescribeHostJson(EffectiveNicFilter(device_filter));
}

}  // namespace mooncake::te

