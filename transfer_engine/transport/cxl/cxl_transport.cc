#include "transfer_engine/transport/cxl/cxl_transport.h"

#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/transport/cxl/cxl_cache.h"

namespace mooncake::te::cxl {

namespace {

std::string PeerKey(const SegmentDescriptor& d) { return JsonString(d.json, "instance").value_or(d.name); }

// Whether the peer's descriptor names a device with `id` (uuid and size; dev/ino too when it is of this kernel).
bool SameDevice(const SegmentDescriptor& d, const DeviceIdentity& id) {
  if (JsonString(d.json, "cxl_uuid").value_or("") != id.uuid) return false;
  if (JsonUint(d.json, "cxl_size").value_or(0) != id.size) return false;
  if (JsonString(d.json, "cxl_kernel").value_or("") != KernelId()) return true;
  return JsonUint(d.json, "cxl_dev").value_or(0) == id.dev && JsonUint(d.json, "cxl_ino").value_or(0) == id.ino;
}

}  // namespace

CxlTransport::CxlTransport() = default;
CxlTransport::~CxlTransport() { Stop(); }

TransportCapabilities CxlTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = true;  // every host that maps the device
  c.same_host = true;
  c.memory = {{MemoryType::kHost, MemoryType::kHost}};
  c.priority = 20;  // above tcp among network transports: no network hop
  c.addressing = AddressMode::kVirtual;
  return c;
}

Status CxlTransport::Configure(const TransportOptions& options) {
  config_ = CxlConfig::From(options);
  if (config_.dev_path.empty()) {
    return InvalidArgument("no CXL device configured (MC_CXL_DEV_PATH or option cxl.dev_path)");
  }
  return Status::Ok();
}

Status CxlTransport::Start(const TransportContext& ctx) {
  ctx_ = ctx;
  auto device = CxlDevice::Open(config_.dev_path, config_.dev_size);
  if (!device.ok()) return device.status();
  device_ = std::move(device.value());
  auto slot = device_->ClaimSlot(ctx_.instance);
  if (!slot.ok()) return slot.status();
  slot_ = *slot;
  pid_start_ = ProcessStartTime(getpid());
  workers_ = std::make_unique<WorkQueue>(config_.threads);
  MC_LOG(kInfo) << "cxl: mapped " << device_->path() << " (" << device_->size() << " bytes, device "
                << device_->identity().uuid << ") at " << Hex(reinterpret_cast<uint64_t>(device_->base()))
                << ", slot " << slot_ << ", cache flushes "
                << (config_.flush ? FlushKindName(CpuFlushKind()) : "off");
  return Status::Ok();
}

void CxlTransport::Stop() {
  if (workers_) workers_->Stop();  // the queue drains first: every slice completes
  // The slot is released (its epoch advanced) before the allocations are freed: once a freed range can be
  // handed out again, no peer may still take this engine's descriptors for live.
  if (device_ && slot_ >= 0) {
    device_->ReleaseSlot(slot_);
    slot_ = -1;
  }
  if (device_) {
    std::lock_guard lock(alloc_mu_);
    for (uint64_t offset : allocations_) {
      Status st = device_->Free(offset);
      (void)st;
    }
    allocations_.clear();
  }
  std::lock_guard lock(mu_);
  peers_.clear();
}

StatusOr<uint64_t> CxlTransport::DeviceOffsetOf(const CxlDevice& device, uint64_t addr, uint64_t len) {
  auto base = reinterpret_cast<uint64_t>(device.base());
  if (len <= device.size() && addr >= base && addr - base <= device.size() - len) return addr - base;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    unsigned long long start = 0, end = 0, offset = 0, inode = 0;
    unsigned int maj = 0, min = 0;
    char perms[8] = {0};
    if (sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu", &start, &end, perms, &offset, &maj, &min, &inode) != 7) {
      continue;
    }
    if (addr < start || addr >= end) continue;
    if (perms[3] != 's' || inode != device.identity().ino || makedev(maj, min) != device.identity().dev ||
        len > end - addr) {
      break;
    }
    return offset + (addr - start);
  }
  return NotFound("range " + Range(addr, len) + " is not in one shared mapping of " + device.path());
}

StatusOr<RegionRegistration> CxlTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  if (region.kind.type != MemoryType::kHost && region.kind.type != MemoryType::kCxl) {
    r.declined = true;
    r.why_declined = "the CXL transport copies host memory only";
    return r;
  }
  if (!device_) return r;
  auto offset = DeviceOffsetOf(*device_, region.start, region.length);
  if (!offset.ok()) return r;  // a local source only: no device offset to publish
  if (*offset < CxlDevice::kReservedBytes) {
    return InvalidArgument("range " + Range(region.start, region.length) + " covers the table at the start of CXL "
                           "device " + device_->path() + " (its first " +
                           std::to_string(CxlDevice::kReservedBytes) + " bytes)");
  }
  Allocation other;
  if (device_->OverlapsForeign(*offset, region.length, &other)) {
    return Status(ErrorCode::kAddressOverlapped,
                  "device range [" + std::to_string(*offset) + ", +" + std::to_string(region.length) +
                      ") overlaps the allocation '" + other.tag + "' [" + std::to_string(other.offset) + ", +" +
                      std::to_string(other.length) + ") of process " + std::to_string(other.owner.pid));
  }
  r.descriptor_fields["offset"] = *offset;
  return r;
}

void CxlTransport::WithdrawRegion(const MemoryRegion&) {
  if (device_ && slot_ >= 0) device_->AdvanceEpoch(slot_);
}

void CxlTransport::Describe(nlohmann::json& d) const {
  if (!device_) return;
  const DeviceIdentity& id = device_->identity();
  d["cxl_name"] = device_->path();
  d["cxl_base_addr"] = reinterpret_cast<uint64_t>(device_->base());
  d["cxl_size"] = id.size;
  d["cxl_uuid"] = id.uuid;
  d["cxl_dev"] = id.dev;
  d["cxl_ino"] = id.ino;
  d["cxl_kernel"] = KernelId();
  d["cxl_slot"] = slot_;
  d["cxl_epoch"] = slot_ >= 0 ? device_->ReadSlot(slot_).epoch : 0;
  d["cxl_pid_start"] = pid_start_;
}

bool CxlTransport::CanReach(const SegmentDescriptor& peer) const {
  return device_ && SameDevice(peer, device_->identity());
}

Status CxlTransport::CheckPeer(const SegmentDescriptor& desc) {
  const std::string instance = PeerKey(desc);
  if (instance == ctx_.instance) return Status::Ok();
  auto slot = JsonInt(desc.json, "cxl_slot");
  if (!slot || *slot < 0 || *slot >= CxlDevice::kMaxEngines) {
    return Status(ErrorCode::kRemoteRejected, "segment '" + desc.name + "' publishes no valid cxl_slot");
  }
  CxlDevice::SlotState s = device_->ReadSlot(static_cast<int>(*slot));
  if (!s.live || s.instance != instance) {
    return Status(ErrorCode::kPeerUnreachable, "the engine of segment '" + desc.name +
                                                   "' has closed its slot on the CXL device (it stopped)");
  }
  if (s.epoch != JsonUint(desc.json, "cxl_epoch").value_or(UINT64_MAX)) {
    return Status(ErrorCode::kStaleMetadata, "'" + desc.name + "' withdrew memory since its descriptor was fetched");
  }
  if (JsonString(desc.json, "cxl_kernel").value_or("") != KernelId()) return Status::Ok();
  int pid = static_cast<int>(JsonInt(desc.json, "pid").value_or(0));
  if (pid == getpid()) return Status::Ok();
  std::lock_guard lock(mu_);
  Peer& p = peers_[instance];
  p.name = desc.name;
  if (!p.process) {
    auto w = ProcessWatch::Open(pid, JsonUint(desc.json, "cxl_pid_start").value_or(0));
    if (!w.ok()) return Status(ErrorCode::kPeerUnreachable, "segment '" + desc.name + "': " + w.status().message());
    p.process = std::move(w.value());
  }
  if (p.process->Exited()) {
    return Status(ErrorCode::kPeerUnreachable,
                  "the process " + std::to_string(pid) + " of segment '" + desc.name + "' has exited");
  }
  return Status::Ok();
}

StatusOr<uint64_t> CxlTransport::TargetOffset(const SegmentDescriptor& desc, const Slice& s) const {
  const BufferDescriptor* buf = desc.FindBuffer(s.remote, s.length == 0 ? 1 : s.length);
  if (!buf) {
    return Status(ErrorCode::kAddressNotRegistered,
                  "range " + Range(s.remote, s.length) + " is not inside a buffer of '" + desc.name + "'");
  }
  auto offset = JsonUint(buf->json, "offset");
  if (!offset) {
    return Status(ErrorCode::kNotImplemented, "the buffer " + Range(buf->addr, buf->length) + " of '" + desc.name +
                                                  "' is not on the CXL device");
  }
  const uint64_t size = device_->size(), delta = s.remote - buf->addr;
  if (*offset < CxlDevice::kReservedBytes || buf->length > size || *offset > size - buf->length) {
    return Status(ErrorCode::kRemoteRejected, "segment '" + desc.name + "' publishes the buffer at device offset " +
                                                  std::to_string(*offset) + " +" + std::to_string(buf->length) +
                                                  ", outside the payload of a " + std::to_string(size) +
                                                  "-byte device");
  }
  return *offset + delta;  // inside [offset, offset + buf->length - s.length]: FindBuffer checked the slice
}

Status CxlTransport::CopySlice(const SegmentDescriptor& desc, Slice* s) {
  if (!device_) return Status(ErrorCode::kSocket, "the CXL transport is not started");
  auto offset = TargetOffset(desc, *s);
  if (!offset.ok()) return offset.status();
  RegionPin pin;
  if (PeerKey(desc) == ctx_.instance) {
    // This engine's own segment: its registry is the authority, the pin blocks unregistering meanwhile.
    pin = ctx_.memory->Find(s->remote, s->length == 0 ? 1 : s->length, /*remote=*/true);
    if (!pin) {
      return Status(ErrorCode::kRemoteRejected,
                    "range " + Range(s->remote, s->length) + " is not registered for remote access");
    }
  }
  MC_RETURN_IF_ERROR(CheckPeer(desc));
  char* dev = device_->base() + *offset;
  if (s->opcode == OpCode::kWrite) CopyToDevice(dev, s->local, s->length, config_.flush);
  else CopyFromDevice(s->local, dev, s->length, config_.flush);
  return CheckPeer(desc);  // a target that went away meanwhile may not have received it
}

void CxlTransport::Copy(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  for (Slice* s : slices) {
    Status st = CopySlice(desc, s);
    {
      std::lock_guard lock(mu_);
      Peer& p = peers_[PeerKey(desc)];
      p.name = desc.name;
      if (st.ok()) {
        p.bytes += s->length;
        p.slices++;
      } else {
        p.errors++;
      }
    }
    if (st.ok()) {
      s->Complete(st);
    } else if (st.code() == ErrorCode::kStaleMetadata || st.code() == ErrorCode::kPeerUnreachable) {
      s->Fail(st, SliceRetry::kRefreshPeer);
    } else if (st.code() == ErrorCode::kNotImplemented) {
      s->Fail(st, SliceRetry::kOtherPath);  // not on the device: another transport may reach the buffer
    } else {
      s->Fail(st, SliceRetry::kFinal);
    }
  }
}

void CxlTransport::Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  if (slices.empty()) return;
  auto desc = std::make_shared<SegmentDescriptor>(peer);
  if (workers_ && workers_->Post([this, desc, slices] { Copy(*desc, slices); })) return;
  for (Slice* s : slices) s->Complete(Status(ErrorCode::kSocket, "transfer engine is shutting down"));
}

void CxlTransport::SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  Copy(peer, slices);
}

void CxlTransport::ForgetPeer(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    it = it->second.name == segment_name ? peers_.erase(it) : std::next(it);
  }
}

StatusOr<void*> CxlTransport::AllocateManaged(size_t length, int device) {
  if (device >= 0) {
    return InvalidArgument("allocate_managed_buffer: device " + std::to_string(device) +
                           " asked of the cxl transport, whose memory is the shared CXL device (pass no device)");
  }
  if (!device_) return Status(ErrorCode::kNotImplemented, "the CXL transport is not started");
  auto a = device_->Allocate(length, ctx_.local_segment_name);
  if (!a.ok()) return a.status();
  std::lock_guard lock(alloc_mu_);
  allocations_.push_back(a->offset);
  return static_cast<void*>(device_->base() + a->offset);
}

Status CxlTransport::FreeManaged(void* addr, size_t length) {
  auto offset = device_ ? DeviceOffsetOf(*device_, reinterpret_cast<uint64_t>(addr), length)
                        : StatusOr<uint64_t>(Status(ErrorCode::kNotImplemented, "not started"));
  if (!offset.ok()) return InvalidArgument("free_managed_buffer: the address is not on the CXL device");
  std::lock_guard lock(alloc_mu_);
  auto it = std::find(allocations_.begin(), allocations_.end(), *offset);
  if (it == allocations_.end()) return InvalidArgument("free_managed_buffer: not an allocation of this engine");
  allocations_.erase(it);
  return device_->Free(*offset);
}

nlohmann::json CxlTransport::Stats() const {
  std::lock_guard lock(mu_);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, p] : peers_) {
    out[p.name] = {{"bytes", p.bytes}, {"slices", p.slices}, {"errors", p.errors}};
  }
  return out;
}

MC_TRANSPORT_PLUGIN("cxl", CxlTransport, {"cxl"}, "", ProbeCxl);

}  // namespace mooncake::te::cxl
