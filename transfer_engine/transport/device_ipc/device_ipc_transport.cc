#include "transfer_engine/transport/device_ipc/device_ipc_transport.h"

#include <unistd.h>

#include <atomic>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/transport/device_ipc/handle_hex.h"

namespace mooncake::te::device_ipc {

DeviceIpcTransport::DeviceIpcTransport(DeviceIpcSpec spec)
    : spec_(std::move(spec)), fields_(EpochFields::For(spec_.name)) {}

DeviceIpcTransport::~DeviceIpcTransport() {
  Stop();
  // Managed buffers the engine did not free: no copy of ours runs any more, and the engine stopped every
  // transport (so none serves them) before it destroys them.
  std::map<uintptr_t, size_t> left;
  {
    std::lock_guard lock(mu_);
    left.swap(managed_);
  }
  for (const auto& [addr, length] : left) {
    Status st = platform_ ? platform_->Free(reinterpret_cast<void*>(addr), length, spec_.managed_kind) : Status::Ok();
    if (!st.ok()) MC_LOG(kWarning) << Prefixed("freeing a managed buffer at close: " + st.message());
  }
}

TransportCapabilities DeviceIpcTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = spec_.remote_hosts;
  c.same_host = true;
  c.memory = {{spec_.memory, spec_.memory}};
  c.priority = 10;  // among same-host transports: device memory has no other same-host path (shm declines it)
  return c;
}

Status DeviceIpcTransport::Configure(const TransportOptions& options) {
  config_ = DeviceIpcConfig::From(options, spec_.env_prefix);
  return Status::Ok();
}

Status DeviceIpcTransport::Start(const TransportContext& ctx) {
  ctx_ = ctx;
  platform_ = ctx.platforms ? ctx.platforms->ForType(spec_.memory) : nullptr;
  if (!platform_) {
    inert_why_ = "no usable " + spec_.memory_name + " platform in this process";
    MC_LOG(kInfo) << Prefixed(inert_why_) << "; it moves nothing";
    return Status::Ok();
  }
  std::string refused = StartHooks();
  if (!refused.empty()) {
    inert_why_ = refused;
    platform_.reset();
    MC_LOG(kInfo) << Prefixed(inert_why_) << "; it moves nothing";
    return Status::Ok();
  }
  cache_ = std::make_unique<IpcCache>(MakeMappingOps(), config_.max_mappings);
  streams_ = std::make_unique<StreamPool>(platform_, config_.streams);
  epochs_ = MakeLocalEpochs();
  peer_epochs_ = MakePeerEpochs();
  MC_LOG(kInfo) << Prefixed("handles of platform '" + platform_->name() + "'");
  return Status::Ok();
}

void DeviceIpcTransport::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (waiter_.joinable()) waiter_.join();  // completes every copy started
  if (cache_) cache_->Clear();
}

namespace {

/// The transport's part of one registration: its epoch slot, given up once (UnregisterRegion).
struct EpochSlotState : TransportRegionState {
  explicit EpochSlotState(uint32_t s) : slot(s) {}
  const uint32_t slot;
  std::atomic<bool> released{false};
};

/// The slot state of `region`'s registration with transport `name`; null when it has none (declined).
EpochSlotState* SlotOf(const MemoryRegion& region, const std::string& name) {
  const MemoryRegion::TransportEntry* e = region.transport(name);
  return e != nullptr ? dynamic_cast<EpochSlotState*>(e->state.get()) : nullptr;
}

}  // namespace

StatusOr<RegionRegistration> DeviceIpcTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  if (region.kind.type != spec_.memory) {
    r.declined = true;
    r.why_declined = spec_.name + " moves " + spec_.memory_name + " device memory only";
    return r;
  }
  if (!platform_) {
    r.declined = true;
    r.why_declined = inert_why_;
    return r;
  }
  auto handle = ExportRegion(reinterpret_cast<void*>(region.start), region.length);
  if (!handle.ok()) {  // e.g. a range spanning allocations: other transports (tcp staging) may still move it
    r.declined = true;
    r.why_declined = "cannot export a handle: " + handle.status().message();
    MC_LOG(kInfo) << spec_.name << ": " << Range(region.start, region.length) << " declined: " << r.why_declined;
    return r;
  }
  auto slot = epochs_->Assign();
  if (!slot.ok()) {
    r.declined = true;
    r.why_declined = Prefixed(slot.status().message());
    return r;
  }
  r.state = std::make_shared<EpochSlotState>(slot->first);
  // The device's copy streams, here on the registering thread rather than by the first copy (a failure is logged
  // once: copies then use the platform's own stream).
  if (region.kind.device >= 0) (void)streams_->Prepare(region.kind.device);
  r.descriptor_fields["shm_name"] = HandleToHex(*handle);
  r.descriptor_fields[fields_.slot] = slot->first;
  r.descriptor_fields[fields_.value] = slot->second;
  return r;
}

void DeviceIpcTransport::WithdrawRegion(const MemoryRegion& region) {
  EpochSlotState* s = SlotOf(region, name());
  if (s != nullptr && !s->released.load(std::memory_order_acquire)) epochs_->Advance(s->slot);
}

void DeviceIpcTransport::UnregisterRegion(const MemoryRegion& region) {
  EpochSlotState* s = SlotOf(region, name());
  if (s != nullptr && !s->released.exchange(true, std::memory_order_acq_rel)) epochs_->Release(s->slot);
}

void DeviceIpcTransport::Describe(nlohmann::json& descriptor) const {
  if (!platform_) return;
  descriptor[spec_.name + "_platform"] = platform_->name();
  DescribeEpochs(descriptor);
}

StatusOr<std::string> DeviceIpcTransport::ExportRegion(void* ptr, size_t length) {
  return platform_->ExportIpc(ptr, length);
}

MappingOps DeviceIpcTransport::MakeMappingOps() { return IpcMappingOps(platform_, spec_.name); }

std::unique_ptr<LocalEpochs> DeviceIpcTransport::MakeLocalEpochs() {
  auto epochs = std::make_unique<LocalEpochs>("mc-" + spec_.name + "-epochs");
  if (epochs->fd() < 0) MC_LOG(kWarning) << Prefixed("no epoch table (memfd_create failed); peers will refuse copies");
  return epochs;
}

std::unique_ptr<PeerEpochs> DeviceIpcTransport::MakePeerEpochs() {
  return std::make_unique<ProcPeerEpochs>(spec_.name, fields_);
}

void DeviceIpcTransport::DescribeEpochs(nlohmann::json& descriptor) const { descriptor[fields_.table] = epochs_->fd(); }

bool DeviceIpcTransport::PeerInReach(const SegmentDescriptor& peer) const {
  return !ctx_.host_id.empty() && JsonString(peer.json, "host_id").value_or("") == ctx_.host_id;
}

bool DeviceIpcTransport::CanReach(const SegmentDescriptor& peer) const {
  if (!platform_) return false;
  return JsonString(peer.json, (spec_.name + "_platform").c_str()).value_or("") == platform_->name() && PeerInReach(peer);
}

bool DeviceIpcTransport::StartCopy(const SegmentDescriptor& peer, Slice* s, Copy* out, EpochReads* reads) {
  auto fail = [&](const Status& st, SliceRetry retry = SliceRetry::kOtherPath) {  // kOtherPath: tcp staging may
    {
      std::lock_guard lock(stats_mu_);
      ++stats_[peer.name].errors;
    }
    s->Fail(st, retry);
    return false;
  };
  if (!cache_) return fail(Status(ErrorCode::kNotImplemented, Prefixed(inert_why_)));
  const BufferDescriptor* buf = peer.FindBuffer(s->remote, s->length);
  if (buf == nullptr) {
    return fail(Status(ErrorCode::kAddressNotRegistered,
                       Prefixed(Range(s->remote, s->length) + " is not inside a buffer of '" + peer.name + "'")));
  }
  // The peer did not withdraw this buffer since `peer` was fetched (read once per buffer and submission).
  Status current = peer_epochs_->Check(peer, *buf, reads);
  if (current.code() == ErrorCode::kStaleMetadata) {
    cache_->ForgetBuffer(JsonString(peer.json, "instance").value_or(""), buf->addr);
    return fail(current, SliceRetry::kRefreshPeer);
  }
  if (!current.ok()) return fail(current);
  // A peer in this very process (same host id, hence PID namespace, and same pid) has device pointers that are
  // ours. CUDA refuses to import an IPC handle in the process that exported it: then copy directly (remembered
  // per peer, so the import is tried once). The emulation imports its own handles, so tests map as across
  // processes. A descriptor only says so: before a direct copy the range must be device memory of ours
  // (DirectRangeIsOurs), so a descriptor that lies about its pid cannot aim us at any other memory.
  const bool same_process = !ctx_.host_id.empty() &&
                            JsonString(peer.json, "host_id").value_or("") == ctx_.host_id &&
                            JsonInt(peer.json, "pid").value_or(0) == getpid();
  std::shared_ptr<PeerMapping> mapped;
  char* remote = reinterpret_cast<char*>(s->remote);
  bool direct = false;
  if (same_process) {
    std::lock_guard lock(stats_mu_);
    direct = same_process_direct_.count(peer.name) != 0;
  }
  if (!direct) {
    auto mapping = cache_->Get(peer, *buf);
    if (mapping.ok()) {
      mapped = std::move(mapping.value());
      remote = mapped->base() + (s->remote - buf->addr);
    } else if (same_process) {
      MC_LOG(kInfo) << spec_.name << ": '" << peer.name << "' is in this process and its handles do not import ("
                    << mapping.status().message() << "); copying directly";
      std::lock_guard lock(stats_mu_);
      same_process_direct_.insert(peer.name);
    } else {
      return fail(mapping.status());
    }
  }
  if (mapped == nullptr && !DirectRangeIsOurs(s->remote, s->length)) {
    return fail(Status(ErrorCode::kAddressNotRegistered,
                       Prefixed(Range(s->remote, s->length) + " of '" + peer.name + "' (said to be in this process) "
                                "is not " + spec_.memory_name + " memory of this process")));
  }
  void* dst = s->opcode == OpCode::kWrite ? static_cast<void*>(remote) : static_cast<void*>(s->local);
  const void* src = s->opcode == OpCode::kWrite ? static_cast<const void*>(s->local) : remote;
  // On the local buffer's device (its context and stream), not the one the destination pointer names.
  const int device = s->task ? s->task->route.local_kind.device : -1;
  auto started = streams_->CopyAsync(dst, src, s->length, device);
  if (!started.ok()) {
    return fail(Status(started.status().code(), Prefixed("copy did not start: ") + started.status().message()));
  }
  *out = Copy{std::move(started.value()), s, std::move(mapped), peer.name};
  return true;
}

void DeviceIpcTransport::Finish(Copy& c, const Status& st) {
  {
    std::lock_guard lock(stats_mu_);
    Counters& k = stats_[c.segment];
    if (st.ok()) {
      k.bytes += c.slice->length;
      ++k.slices;
    } else {
      ++k.errors;
    }
  }
  Slice* s = c.slice;
  c.mapping.reset();
  if (st.ok()) s->Complete(st);
  else s->Fail(Status(st.code(), Prefixed(st.message())), SliceRetry::kOtherPath);
}

std::vector<DeviceIpcTransport::Copy> DeviceIpcTransport::StartAll(const SegmentDescriptor& peer,
                                                                   const std::vector<Slice*>& slices) {
  std::vector<Copy> started;
  started.reserve(slices.size());
  EpochReads reads;  // this submission's: read after it started, shared by its slices
  for (Slice* s : slices) {
    Copy c;
    if (StartCopy(peer, s, &c, &reads)) started.push_back(std::move(c));
  }
  return started;
}

void DeviceIpcTransport::Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  std::vector<Copy> started = StartAll(peer, slices);
  if (started.empty()) return;
  std::unique_lock lock(mu_);
  if (stopping_) {  // nobody would wait for them: wait here
    lock.unlock();
    for (Copy& c : started) Finish(c, c.completion->Wait());
    return;
  }
  for (Copy& c : started) waiting_.push_back(std::move(c));
  if (!waiter_.joinable()) waiter_ = std::thread([this] { WaitLoop(); });
  lock.unlock();
  cv_.notify_one();
}

void DeviceIpcTransport::SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  for (Copy& c : StartAll(peer, slices)) Finish(c, c.completion->Wait());
}

void DeviceIpcTransport::WaitLoop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
    if (waiting_.empty()) return;  // stopping, every copy completed
    Copy c = std::move(waiting_.front());
    waiting_.pop_front();
    lock.unlock();
    Status st = c.completion->Wait();
    Finish(c, st);
    lock.lock();
  }
}

void DeviceIpcTransport::ForgetPeer(const std::string& segment_name) {
  if (cache_) cache_->Forget(segment_name);
  if (peer_epochs_) peer_epochs_->Forget(segment_name);
  std::lock_guard lock(stats_mu_);
  same_process_direct_.erase(segment_name);
}

bool DeviceIpcTransport::DirectRangeIsOurs(uint64_t addr, uint64_t length) const {
  // Both ends in device memory of our platform's type, as the platform knows its own allocations.
  if (length == 0 || addr + length < addr) return false;
  auto first = platform_->Classify(reinterpret_cast<const void*>(addr));
  auto last = platform_->Classify(reinterpret_cast<const void*>(addr + length - 1));
  return first && last && first->type == spec_.memory && last->type == spec_.memory && first->device == last->device;
}

StatusOr<void*> DeviceIpcTransport::AllocateManaged(size_t length, int device) {
  if (!platform_) return Status(ErrorCode::kDeviceNotFound, Prefixed(inert_why_));
  auto p = platform_->Allocate(length, spec_.managed_kind, device < 0 ? ManagedDevice() : device);
  if (!p.ok()) return p.status();
  std::lock_guard lock(mu_);
  managed_[reinterpret_cast<uintptr_t>(*p)] = length;
  return *p;
}

Status DeviceIpcTransport::FreeManaged(void* addr, size_t length) {
  {
    std::lock_guard lock(mu_);
    auto it = managed_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == managed_.end() || it->second != length) {
      return InvalidArgument(Prefixed(Range(reinterpret_cast<uint64_t>(addr), length) +
                                      " was not allocated by this transport"));
    }
    managed_.erase(it);
  }
  return platform_->Free(addr, length, spec_.managed_kind);
}

nlohmann::json DeviceIpcTransport::Stats() const {
  nlohmann::json out = nlohmann::json::object();
  auto mapped = cache_ ? cache_->CountBySegment() : std::map<std::string, std::pair<size_t, uint64_t>>{};
  auto reads = peer_epochs_ ? peer_epochs_->ReadCounts() : std::map<std::string, uint64_t>{};
  std::lock_guard lock(stats_mu_);
  for (const auto& [segment, k] : stats_) {
    auto m = mapped.find(segment);
    out[segment] = {{"bytes", k.bytes},
                    {"slices", k.slices},
                    {"errors", k.errors},
                    {"mapped", m == mapped.end() ? 0 : m->second.first},
                    {"imports", m == mapped.end() ? 0 : m->second.second},
                    {"epoch_reads", reads.count(segment) != 0 ? reads[segment] : 0}};
  }
  return out;
}

}  // namespace mooncake::te::device_ipc
