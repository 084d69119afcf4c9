#include "transfer_engine/platform/gpu/gpu_platform.h"

#include <unistd.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"

#include "transfer_engine/platform/util/parse.h"

namespace mooncake::te::gpu {
namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string Addr(const void* p) { return Hex(reinterpret_cast<uintptr_t>(p)); }

std::string ToHex(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

bool FromHex(std::string_view hex, std::string* out) {
  if (hex.empty() || hex.size() % 2 != 0) return false;
  auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi << 4 | lo));
  }
  return true;
}


// A decoded "mc-<name>-ipc:v1:<pid>:<device>:<offset>:<length>:<hex>".
struct Handle {
  uint64_t pid = 0, device = 0, offset = 0, length = 0;
  std::string bytes;
};

StatusOr<Handle> DecodeHandle(const std::string& prefix, std::string_view text) {
  auto bad = [&](const char* why) {
    return InvalidArgument("not a " + prefix.substr(0, prefix.size() - 4) + " handle (" + why + "): \"" +
                           std::string(text.substr(0, 200)) + "\"");
  };
  if (text.substr(0, prefix.size()) != prefix) return bad("wrong prefix");
  std::string_view rest = text.substr(prefix.size());
  std::string_view f[5];
  for (int i = 0; i < 5; ++i) {
    size_t colon = rest.find(':');
    if (i < 4 && colon == std::string_view::npos) return bad("expected pid:device:offset:length:handle");
    f[i] = rest.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    if (i == 4 && colon != std::string_view::npos) return bad("expected pid:device:offset:length:handle");
  }
  Handle h;
  if (!platform_util::ParseDecimal(f[0], UINT64_MAX, &h.pid) || h.pid == 0 || h.pid > std::numeric_limits<int>::max()) return bad("bad pid");
  if (!platform_util::ParseDecimal(f[1], UINT64_MAX, &h.device) || h.device > 1 << 16) return bad("bad device");
  if (!platform_util::ParseDecimal(f[2], UINT64_MAX, &h.offset)) return bad("bad offset");
  if (!platform_util::ParseDecimal(f[3], UINT64_MAX, &h.length) || h.length == 0 || h.offset + h.length < h.offset) return bad("bad length");
  if (!FromHex(f[4], &h.bytes)) return bad("the runtime handle must be lower-case hex");
  return h;
}

class EventCompletion final : public CopyCompletion {
 public:
  EventCompletion(std::shared_ptr<Runtime> runtime, void* event, int device, std::string what)
      : runtime_(std::move(runtime)), event_(event), device_(device), what_(std::move(what)) {}
  ~EventCompletion() override {
    (void)runtime_->SetDevice(device_);
    runtime_->DestroyEvent(event_);
  }

  bool Done() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return true;
    (void)runtime_->SetDevice(device_);
    StatusOr<bool> r = runtime_->QueryEvent(event_);
    if (r.ok() && !*r) return false;
    Finish(r.ok() ? Status::Ok() : r.status());
    return true;
  }

  Status Wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      (void)runtime_->SetDevice(device_);
      Finish(runtime_->SynchronizeEvent(event_));
    }
    return status_;
  }

 private:
  void Finish(const Status& st) {
    done_ = true;
    if (!st.ok()) status_ = Status(st.code(), what_ + ": " + st.message());
  }

  std::shared_ptr<Runtime> runtime_;
  void* event_;
  int device_;
  std::string what_;
  std::mutex mu_;
  bool done_ = false;
  Status status_;
};

}  // namespace

GpuPlatform::GpuPlatform(std::string name, MemoryType type, std::unique_ptr<Runtime> runtime)
    : name_(std::move(name)), type_(type), runtime_(std::move(runtime)) {}

GpuPlatform::~GpuPlatform() = default;

Status GpuPlatform::Init() {
  std::call_once(init_once_, [this] {
    StatusOr<RuntimeInfo> info = runtime_->Load();
    if (!info.ok()) {
      probe_.reason = info.status().message();
      return;
    }
    if (info->device_count <= 0) {
      probe_.reason = "no " + name_ + " device (" + info->summary + ")";
      return;
    }
    streams_.assign(static_cast<size_t>(info->device_count), nullptr);
    probe_.usable = true;
    probe_.device_count = info->device_count;
    probe_.reason = info->summary + ", " + std::to_string(info->device_count) + " device(s)";
  });
  if (probe_.usable) return Status::Ok();
  return Status(ErrorCode::kDeviceNotFound, name_ + " platform unusable: " + probe_.reason);
}

PlatformProbe GpuPlatform::Probe() {
  (void)Init();
  return probe_;
}

Status GpuPlatform::EnterDevice(int device) {
  if (device < 0 || device >= probe_.device_count) {
    return Status(ErrorCode::kDeviceNotFound, name_ + ": no device " + std::to_string(device) +
                                                  " (this process has " + std::to_string(probe_.device_count) + ")");
  }
  Status st = runtime_->SetDevice(device);
  if (!st.ok()) return Status(st.code(), name_ + ": " + st.message());
  return st;
}

StatusOr<void*> GpuPlatform::Stream(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  void*& s = streams_[static_cast<size_t>(device)];
  if (s == nullptr) {
    StatusOr<void*> created = runtime_->CreateStream();
    if (!created.ok()) return Status(created.status().code(), name_ + ": " + created.status().message());
    s = *created;
  }
  return s;
}

std::optional<MemoryKind> GpuPlatform::OwnKind(uintptr_t addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.upper_bound(addr);
  if (it != allocations_.begin()) {
    --it;
    if (addr - it->first < it->second.length) {
      if (it->second.kind == AllocationKind::kPinnedHost) return MemoryKind{MemoryType::kHost, -1};
      return MemoryKind{type_, it->second.device};
    }
  }
  for (const auto& [key, m] : mappings_) {
    const auto base = reinterpret_cast<uintptr_t>(m.base);
    if (addr >= base && addr - base < m.size) return MemoryKind{type_, m.device};
  }
  return std::nullopt;
}

std::optional<MemoryKind> GpuPlatform::Classify(const void* ptr) {
  if (ptr == nullptr || !Init().ok()) return std::nullopt;
  if (std::optional<MemoryKind> k = runtime_->PointerKind(ptr)) {
    if (k->is_device()) k->type = type_;
    return k;
  }
  return OwnKind(reinterpret_cast<uintptr_t>(ptr));
}

StatusOr<void*> GpuPlatform::Allocate(size_t length, AllocationKind kind, int device) {
  MC_RETURN_IF_ERROR(Init());
  if (length == 0) return InvalidArgument(name_ + ": cannot allocate 0 bytes");
  if (kind == AllocationKind::kShareable) {
    return Status(ErrorCode::kNotImplemented, name_ + ": shareable (VMM) allocations are not implemented; "
                                                      "kDevice memory is exportable through IPC handles");
  }
  if (kind == AllocationKind::kFabric) {
    return Status(ErrorCode::kNotImplemented, "fabric handles unsupported: " + name_ + " platform has none");
  }
  if (kind == AllocationKind::kPinnedHost && device < 0) device = 0;
  MC_RETURN_IF_ERROR(EnterDevice(device));
  StatusOr<void*> p = kind == AllocationKind::kDevice ? runtime_->Malloc(length) : runtime_->HostMalloc(length);
  if (!p.ok()) return Status(p.status().code(), name_ + ": " + p.status().message());
  std::lock_guard<std::mutex> lock(mu_);
  allocations_[reinterpret_cast<uintptr_t>(*p)] = Allocation{kind, length, device};
  return *p;
}

Status GpuPlatform::Free(void* ptr, size_t length, AllocationKind kind) {
  MC_RETURN_IF_ERROR(Init());
  Allocation a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations_.end()) {
      return InvalidArgument(name_ + ": " + Addr(ptr) + " was not allocated by this platform");
    }
    if (it->second.kind != kind || it->second.length != length) {
      return InvalidArgument(name_ + ": free of " + Addr(ptr) + " (" + std::to_string(length) + " bytes, kind " +
                             std::to_string(static_cast<int>(kind)) + ") does not match its allocation (" +
                             std::to_string(it->second.length) + " bytes, kind " +
                             std::to_string(static_cast<int>(it->second.kind)) + ")");
    }
    a = it->second;
    allocations_.erase(it);
  }
  MC_RETURN_IF_ERROR(EnterDevice(a.device));
  Status st = kind == AllocationKind::kDevice ? runtime_->Free(ptr) : runtime_->HostFree(ptr);
  return st.ok() ? st : Status(st.code(), name_ + ": " + st.message());
}

StatusOr<std::string> GpuPlatform::ExportIpc(void* ptr, size_t length) {
  MC_RETURN_IF_ERROR(Init());
  if (!runtime_->has_ipc()) return Status(ErrorCode::kNotImplemented, name_ + ": no IPC handles in this runtime");
  if (ptr == nullptr || length == 0) return InvalidArgument(name_ + ": ExportIpc needs a non-null address and length");
  std::optional<MemoryKind> kind = Classify(ptr);
  if (!kind || !kind->is_device()) {
    return InvalidArgument(name_ + ": " + Addr(ptr) + " is not " + name_ + " device memory");
  }
  MC_RETURN_IF_ERROR(EnterDevice(kind->device));
  StatusOr<std::pair<void*, size_t>> range = runtime_->AddressRange(ptr);
  if (!range.ok()) return Status(ErrorCode::kInvalidArgument, name_ + ": " + range.status().message());
  const auto addr = reinterpret_cast<uintptr_t>(ptr), base = reinterpret_cast<uintptr_t>(range->first);
  if (addr < base || length > range->second - (addr - base)) {
    return InvalidArgument(name_ + ": " + Range(addr, length) + " runs past its allocation " +
                           Range(base, range->second));
  }
  StatusOr<std::string> bytes = runtime_->IpcGetHandle(range->first);
  if (!bytes.ok()) return Status(bytes.status().code(), name_ + ": " + bytes.status().message());
  return Prefix() + std::to_string(getpid()) + ":" + std::to_string(kind->device) + ":" + std::to_string(addr - base) +
         ":" + std::to_string(length) + ":" + ToHex(*bytes);
}

StatusOr<void*> GpuPlatform::ImportIpc(const std::string& handle, int owner_pid, size_t length) {
  MC_RETURN_IF_ERROR(Init());
  if (!runtime_->has_ipc()) return Status(ErrorCode::kNotImplemented, name_ + ": no IPC handles in this runtime");
  StatusOr<Handle> h = DecodeHandle(Prefix(), handle);
  if (!h.ok()) return h.status();
  if (h->pid != static_cast<uint64_t>(owner_pid)) {
    return InvalidArgument(name_ + ": the handle was exported by process " + std::to_string(h->pid) + ", not by " +
                           std::to_string(owner_pid));
  }
  if (h->pid == static_cast<uint64_t>(getpid())) {
    return InvalidArgument(name_ + ": the handle was exported by this process; use the memory directly");
  }
  if (length == 0 || length > h->length) {
    return InvalidArgument(name_ + ": cannot import " + std::to_string(length) + " bytes of a handle for " +
                           std::to_string(h->length));
  }
  const int device = static_cast<int>(h->device) < probe_.device_count ? static_cast<int>(h->device) : 0;
  const std::string key = std::to_string(h->pid) + ":" + ToHex(h->bytes);
  std::lock_guard<std::mutex> import_lock(import_mu_);
  Mapping* m = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mappings_.find(key);
    if (it != mappings_.end()) m = &it->second;
  }
  if (m == nullptr) {
    MC_RETURN_IF_ERROR(EnterDevice(device));
    StatusOr<void*> base = runtime_->IpcOpen(h->bytes);
    if (!base.ok()) return Status(ErrorCode::kInvalidArgument, name_ + ": " + base.status().message());
    // The handle's offset and length come from the peer: they must lie inside the allocation it maps.
    StatusOr<std::pair<void*, size_t>> range = runtime_->AddressRange(*base);
    if (!range.ok() || range->first != *base || h->offset + h->length < h->offset ||
        h->offset + h->length > range->second) {
      (void)runtime_->IpcClose(*base);
      return InvalidArgument(name_ + ": the handle names bytes " + std::to_string(h->offset) + ".." +
                             std::to_string(h->offset + h->length) + " of an allocation of " +
                             (range.ok() ? std::to_string(range->second) + " bytes" : range.status().message()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    m = &mappings_.emplace(key, Mapping{*base, static_cast<size_t>(h->offset + h->length), device, 0}).first->second;
  }
  std::lock_guard<std::mutex> lock(mu_);
  const uintptr_t local = reinterpret_cast<uintptr_t>(m->base) + h->offset;
  auto it = imports_.find(local);
  if (it != imports_.end()) {
    if (it->second.key != key || it->second.length != length) {
      return InvalidArgument(name_ + ": " + Hex(local) + " is already imported with another handle or length");
    }
    ++it->second.refs;
  } else {
    imports_[local] = Import{key, length, 1};
  }
  ++m->refs;
  if (m->size < h->offset + h->length) m->size = static_cast<size_t>(h->offset + h->length);
  return reinterpret_cast<void*>(local);
}

Status GpuPlatform::CloseIpc(void* mapped, size_t length) {
  MC_RETURN_IF_ERROR(Init());
  std::lock_guard<std::mutex> import_lock(import_mu_);
  Mapping gone{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = imports_.find(reinterpret_cast<uintptr_t>(mapped));
    if (it == imports_.end()) {
      return InvalidArgument(name_ + ": " + Addr(mapped) + " is not an address ImportIpc returned");
    }
    if (it->second.length != length) {
      return InvalidArgument(name_ + ": CloseIpc of " + Addr(mapped) + " with " + std::to_string(length) +
                             " bytes; it was imported with " + std::to_string(it->second.length));
    }
    auto m = mappings_.find(it->second.key);
    if (--it->second.refs == 0) imports_.erase(it);
    if (--m->second.refs > 0) return Status::Ok();
    gone = m->second;
    mappings_.erase(m);
  }
  MC_RETURN_IF_ERROR(EnterDevice(gone.device));
  Status st = runtime_->IpcClose(gone.base);
  return st.ok() ? st : Status(st.code(), name_ + ": " + st.message());
}

StatusOr<std::unique_ptr<CopyCompletion>> GpuPlatform::CopyAsync(void* dst, const void* src, size_t length,
                                                                  int device, void* user_stream) {
  MC_RETURN_IF_ERROR(Init());
  if (length > 0 && (dst == nullptr || src == nullptr)) {
    return InvalidArgument(name_ + ": copy of " + std::to_string(length) + " bytes with a null address");
  }
  std::optional<MemoryKind> d = Classify(dst), s = Classify(src);
  const bool dst_device = d && d->is_device(), src_device = s && s->is_device();
  if (device == -1) device = dst_device ? d->device : src_device ? s->device : 0;
  MC_RETURN_IF_ERROR(EnterDevice(device));
  StatusOr<void*> stream = user_stream != nullptr ? StatusOr<void*>(user_stream) : Stream(device);
  if (!stream.ok()) return stream.status();
  const std::string what =
      name_ + ": copy " + Addr(dst) + " <- " + Addr(src) + " (" + std::to_string(length) + " bytes)";
  if (length > 0) {
    Status st = runtime_->MemcpyAsync(dst, src, length, dst_device, src_device, *stream);
    if (!st.ok()) return Status(st.code(), what + ": " + st.message());
  }
  StatusOr<void*> event = runtime_->RecordEvent(*stream);
  if (!event.ok()) return Status(event.status().code(), what + ": " + event.status().message());
  return std::unique_ptr<CopyCompletion>(new EventCompletion(runtime_, *event, device, what));
}

StatusOr<void*> GpuPlatform::CreateStream(int device) {
  MC_RETURN_IF_ERROR(Init());
  MC_RETURN_IF_ERROR(EnterDevice(device));
  StatusOr<void*> created = runtime_->CreateStream();
  if (!created.ok()) return Status(created.status().code(), name_ + ": " + created.status().message());
  std::lock_guard<std::mutex> lock(mu_);
  created_streams_[*created] = device;
  return *created;
}

Status GpuPlatform::DestroyStream(void* stream) {
  MC_RETURN_IF_ERROR(Init());
  int device = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = created_streams_.find(stream);
    if (it == created_streams_.end()) {
      return InvalidArgument(name_ + ": " + Addr(stream) + " is not a stream CreateStream made (or it was destroyed)");
    }
    device = it->second;
    created_streams_.erase(it);
  }
  MC_RETURN_IF_ERROR(EnterDevice(device));
  // The work already enqueued finishes first (its completions keep their own events).
  StatusOr<void*> drained = runtime_->RecordEvent(stream);
  if (drained.ok()) {
    Status st = runtime_->SynchronizeEvent(*drained);
    runtime_->DestroyEvent(*drained);
    if (!st.ok()) MC_LOG(kWarning) << name_ << ": waiting for a stream's work before destroying it: " << st.message();
  }
  Status st = runtime_->DestroyStream(stream);
  return st.ok() ? st : Status(st.code(), name_ + ": " + st.message());
}

}  // namespace mooncake::te::gpu
