#include "transfer_engine/transport/nvlink_intra/nvlink_intra_transport.h"

#include <unistd.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/transport/nvlink_intra/ipc_handle_hex.h"

namespace mooncake::te::nvlink_intra {
namespace {

constexpr const char kPlatformField[] = "nvlink_intra_platform";

// Usable where a CUDA platform can be: the driver library loads, or the host emulation is switched on. Whether the
// engine's platform registry really has a usable CUDA platform is known only at Start (an inert transport then).
TransportProbe ProbeNvlinkIntra() {
  TransportProbe p;
  const char* emulation = getenv("MC_PLATFORM_EMULATION");
  if (emulation != nullptr && std::string(emulation) == "1") {
    p.reason = "host emulation of CUDA devices (MC_PLATFORM_EMULATION=1; not a GPU)";
    return p;
  }
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = dlerror();
    p.usable = false;
    p.reason = std::string("no CUDA driver: ") + (err ? err : "libcuda.so.1 not found") +
               " (MC_PLATFORM_EMULATION=1 enables the test emulation)";
    return p;
  }
  dlclose(h);
  p.reason = "CUDA driver found (libcuda.so.1)";
  return p;
}

}  // namespace

NvlinkIntraTransport::~NvlinkIntraTransport() { Stop(); }

TransportCapabilities NvlinkIntraTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = false;
  c.same_host = true;
  c.memory = {{MemoryType::kCuda, MemoryType::kCuda}};
  c.priority = 10;  // among same-host transports: device memory has no other same-host path (shm declines it)
  return c;
}

Status NvlinkIntraTransport::Configure(const TransportOptions& options) {
  config_ = NvlinkIntraConfig::From(options);
  return Status::Ok();
}

Status NvlinkIntraTransport::Start(const TransportContext& ctx) {
  ctx_ = ctx;
  platform_ = ctx.platforms ? ctx.platforms->ForType(MemoryType::kCuda) : nullptr;
  if (!platform_) {
    inert_why_ = "no usable CUDA platform in this process";
    MC_LOG(kInfo) << "nvlink_intra: " << inert_why_ << "; it moves nothing";
    return Status::Ok();
  }
  cache_ = std::make_unique<IpcCache>(platform_, config_.max_mappings);
  streams_ = std::make_unique<StreamPool>(platform_, config_.streams);
  epochs_ = std::make_unique<LocalEpochs>();
  if (epochs_->fd() < 0) {
    MC_LOG(kWarning) << "nvlink_intra: no epoch table (memfd_create failed); peers will refuse copies";
  }
  MC_LOG(kInfo) << "nvlink_intra: IPC through platform '" << platform_->name() << "'";
  return Status::Ok();
}

void NvlinkIntraTransport::Stop() {
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

/// nvlink_intra's part of one registration: its epoch slot, given up once (UnregisterRegion).
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

StatusOr<RegionRegistration> NvlinkIntraTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  if (region.kind.type != MemoryType::kCuda) {
    r.declined = true;
    r.why_declined = "nvlink_intra moves CUDA device memory only";
    return r;
  }
  if (!platform_) {
    r.declined = true;
    r.why_declined = inert_why_;
    return r;
  }
  auto handle = platform_->ExportIpc(reinterpret_cast<void*>(region.start), region.length);
  if (!handle.ok()) {  // e.g. a range spanning allocations: other transports (tcp staging) may still move it
    r.declined = true;
    r.why_declined = "cannot export an IPC handle: " + handle.status().message();
    MC_LOG(kInfo) << "nvlink_intra: " << Range(region.start, region.length) << " declined: " << r.why_declined;
    return r;
  }
  auto slot = epochs_->Assign();
  if (!slot.ok()) {
    r.declined = true;
    r.why_declined = slot.status().message();
    return r;
  }
  r.state = std::make_shared<EpochSlotState>(slot->first);
  // The device's copy streams, here on the registering thread rather than by the first copy (a failure is logged
  // once: copies then use the platform's own stream).
  if (region.kind.device >= 0) (void)streams_->Prepare(region.kind.device);
  r.descriptor_fields["shm_name"] = HandleToHex(*handle);
  r.descriptor_fields[kEpochSlotField] = slot->first;
  r.descriptor_fields[kEpochField] = slot->second;
  return r;
}

void NvlinkIntraTransport::WithdrawRegion(const MemoryRegion& region) {
  EpochSlotState* s = SlotOf(region, name());
  if (s != nullptr && !s->released.load(std::memory_order_acquire)) epochs_->Advance(s->slot);
}

void NvlinkIntraTransport::UnregisterRegion(const MemoryRegion& region) {
  EpochSlotState* s = SlotOf(region, name());
  if (s != nullptr && !s->released.exchange(true, std::memory_order_acq_rel)) epochs_->Release(s->slot);
}

void NvlinkIntraTransport::Describe(nlohmann::json& descriptor) const {
  if (!platform_) return;
  descriptor[kPlatformField] = platform_->name();
  descriptor[kEpochFdField] = epochs_->fd();
}

bool NvlinkIntraTransport::CanReach(const SegmentDescriptor& peer) const {
  if (!platform_ || ctx_.host_id.empty()) return false;
  return JsonString(peer.json, "host_id").value_or("") == ctx_.host_id &&
         JsonString(peer.json, kPlatformField).value_or("") == platform_->name();
}

bool NvlinkIntraTransport::StartCopy(const SegmentDescriptor& peer, Slice* s, Copy* out) {
  auto fail = [&](const Status& st, SliceRetry retry = SliceRetry::kOtherPath) {  // kOtherPath: tcp staging may
    {
      std::lock_guard lock(stats_mu_);
      ++stats_[peer.name].errors;
    }
    s->Fail(st, retry);
    return false;
  };
  if (!cache_) return fail(Status(ErrorCode::kNotImplemented, "nvlink_intra: " + inert_why_));
  const BufferDescriptor* buf = peer.FindBuffer(s->remote, s->length);
  if (buf == nullptr) {
    return fail(Status(ErrorCode::kAddressNotRegistered, "nvlink_intra: " + Range(s->remote, s->length) +
                                                             " is not inside a buffer of '" + peer.name + "'"));
  }
  Status current = peer_epochs_.Check(peer, *buf);  // the peer did not withdraw this buffer since `peer` was fetched
  if (current.code() == ErrorCode::kStaleMetadata) {
    cache_->ForgetBuffer(JsonString(peer.json, "instance").value_or(""), buf->addr);
    return fail(current, SliceRetry::kRefreshPeer);
  }
  if (!current.ok()) return fail(current);
  // A peer in this very process (same host id, hence PID namespace, and same pid) has device pointers that are
  // ours. CUDA refuses to import an IPC handle in the process that exported it: then copy directly (remembered
  // per peer, so the import is tried once). The emulation imports its own handles, so tests map as across
  // processes.
  const bool same_process = JsonInt(peer.json, "pid").value_or(0) == getpid();
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
      MC_LOG(kInfo) << "nvlink_intra: '" << peer.name << "' is in this process and its handles do not import ("
                    << mapping.status().message() << "); copying directly";
      std::lock_guard lock(stats_mu_);
      same_process_direct_.insert(peer.name);
    } else {
      return fail(mapping.status());
    }
  }
  void* dst = s->opcode == OpCode::kWrite ? static_cast<void*>(remote) : static_cast<void*>(s->local);
  const void* src = s->opcode == OpCode::kWrite ? static_cast<const void*>(s->local) : remote;
  // On the local buffer's device (its context and stream), not the one the destination pointer names.
  const int device = s->task ? s->task->route.local_kind.device : -1;
  auto started = streams_->CopyAsync(dst, src, s->length, device);
  if (!started.ok()) {
    return fail(Status(started.status().code(), "nvlink_intra: copy did not start: " + started.status().message()));
  }
  *out = Copy{std::move(started.value()), s, std::move(mapped), peer.name};
  return true;
}

void NvlinkIntraTransport::Finish(Copy& c, const Status& st) {
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
  else s->Fail(Status(st.code(), "nvlink_intra: " + st.message()), SliceRetry::kOtherPath);
}

void NvlinkIntraTransport::Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  std::vector<Copy> started;
  started.reserve(slices.size());
  for (Slice* s : slices) {
    Copy c;
    if (StartCopy(peer, s, &c)) started.push_back(std::move(c));
  }
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

void NvlinkIntraTransport::SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  std::vector<Copy> started;
  started.reserve(slices.size());
  for (Slice* s : slices) {
    Copy c;
    if (StartCopy(peer, s, &c)) started.push_back(std::move(c));
  }
  for (Copy& c : started) Finish(c, c.completion->Wait());
}

void NvlinkIntraTransport::WaitLoop() {
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

void NvlinkIntraTransport::ForgetPeer(const std::string& segment_name) {
  if (cache_) cache_->Forget(segment_name);
  peer_epochs_.Forget(segment_name);
}

StatusOr<void*> NvlinkIntraTransport::AllocateManaged(size_t length) {
  if (!platform_) return Status(ErrorCode::kDeviceNotFound, "nvlink_intra: " + inert_why_);
  auto p = platform_->Allocate(length, AllocationKind::kShareable, 0);
  if (!p.ok()) return p.status();
  std::lock_guard lock(mu_);
  managed_[reinterpret_cast<uintptr_t>(*p)] = length;
  return *p;
}

Status NvlinkIntraTransport::FreeManaged(void* addr, size_t length) {
  {
    std::lock_guard lock(mu_);
    auto it = managed_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == managed_.end() || it->second != length) {
      return InvalidArgument("nvlink_intra: " + Range(reinterpret_cast<uint64_t>(addr), length) +
                             " was not allocated by this transport");
    }
    managed_.erase(it);
  }
  return platform_->Free(addr, length, AllocationKind::kShareable);
}

nlohmann::json NvlinkIntraTransport::Stats() const {
  nlohmann::json out = nlohmann::json::object();
  auto mapped = cache_ ? cache_->CountBySegment() : std::map<std::string, std::pair<size_t, uint64_t>>{};
  std::lock_guard lock(stats_mu_);
  for (const auto& [segment, k] : stats_) {
    auto m = mapped.find(segment);
    out[segment] = {{"bytes", k.bytes},
                    {"slices", k.slices},
                    {"errors", k.errors},
                    {"mapped", m == mapped.end() ? 0 : m->second.first},
                    {"imports", m == mapped.end() ? 0 : m->second.second}};
  }
  return out;
}

MC_TRANSPORT_PLUGIN("nvlink_intra", NvlinkIntraTransport, {"nvlink_intra"}, /*exclusive_env=*/"", ProbeNvlinkIntra);

}  // namespace mooncake::te::nvlink_intra
