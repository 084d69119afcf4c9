#include "transfer_engine/platform/cuda/cuda_platform.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/common/format.h"
#include "transfer_engine/platform/cuda/cuda_completion.h"
#include "transfer_engine/platform/cuda/cuda_driver.h"
#include "transfer_engine/platform/cuda/cuda_ipc_handle.h"
#include "transfer_engine/platform/util/remote_fd.h"
#include "transfer_engine/platform/util/sysfs.h"
#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te {
namespace {

using cuda::ContextScope;
using cuda::CudaIpcHandle;
using cuda::EventCompletion;
using cuda::Driver;

std::string Addr(const void* p) { return Hex(reinterpret_cast<uintptr_t>(p)); }
CUdeviceptr Dptr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }
void* Ptr(CUdeviceptr d) { return reinterpret_cast<void*>(static_cast<uintptr_t>(d)); }

// An id no other allocation of this process has: a count from a random base drawn once per process, so a later
// process that reuses the pid (and fd numbers) is all but certain to hand out other ids.
uint64_t NextAllocationId() {
  static const uint64_t base = [] {
    std::random_device rd;
    return static_cast<uint64_t>(rd()) << 32 ^ static_cast<uint64_t>(rd());
  }();
  static std::atomic<uint64_t> count{0};
  return base + count.fetch_add(1, std::memory_order_relaxed) + 1;
}

// One Allocate.
struct Allocation {
  AllocationKind kind;
  size_t length;          // as asked for
  int device;
  size_t mapped = 0;      // kShareable: the granularity-aligned size reserved and mapped
  CUmemGenericAllocationHandle vmm = 0;  // kShareable
  int exported_fd = -1;   // kShareable: the fd ExportIpc handed out (kept until Free)
  uint64_t id = 0;        // kShareable: unique among this process's allocations (the handle's allocation_id)
};

// One ImportIpc mapping, shared by the imports of the same exported allocation.
struct Mapping {
  CudaIpcHandle::Kind kind;
  CUdeviceptr base = 0;   // the mapped allocation
  size_t size = 0;        // its bytes: kPosixFd reserved and mapped, kLegacy as cuMemGetAddressRange reports
  CUmemGenericAllocationHandle vmm = 0;  // kPosixFd
  int device = 0;
  int refs = 0;
};

struct Import {
  std::string key;  // of the Mapping
  size_t length;
  int refs;
};

class CudaPlatform final : public Platform {
 public:
  CudaPlatform() : CudaPlatform(cuda::DefaultDriverSonames()) {}
  explicit CudaPlatform(std::vector<std::string> sonames, std::string sysfs_root = "/sys")
      : sonames_(std::move(sonames)), sysfs_root_(std::move(sysfs_root)) {}

  std::string name() const override { return "cuda"; }
  MemoryType device_type() const override { return MemoryType::kCuda; }

  PlatformProbe Probe() override {
    // Init's verdict is the probe: an unusable platform says why (Init records the cause in probe_.reason).
    Status init = Init();
    PlatformProbe p = probe_;
    if (!init.ok()) {
      p.usable = false;
      if (p.reason.empty()) p.reason = init.message();
    }
    return p;
  }

  std::optional<MemoryKind> Classify(const void* ptr) override {
    if (!Init().ok() || ptr == nullptr) return std::nullopt;
    const auto& api = driver_->api();
    // No context is entered or created: under unified addressing the driver answers these two attributes
    // with none current. Where it wants one (CUDA_ERROR_INVALID_CONTEXT), the answer is nullopt.
    unsigned int memory_type = 0;
    int ordinal = -1;
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void* data[] = {&memory_type, &ordinal};
    if (api.cuPointerGetAttributes(2, attrs, data, Dptr(ptr)) != CUDA_SUCCESS) return std::nullopt;
    if (memory_type == CU_MEMORYTYPE_DEVICE) return MemoryKind{MemoryType::kCuda, ordinal < 0 ? 0 : ordinal};
    if (memory_type == CU_MEMORYTYPE_HOST) return MemoryKind{MemoryType::kHost, -1};
    return std::nullopt;
  }

  StatusOr<void*> Allocate(size_t length, AllocationKind kind, int device) override {
    MC_RETURN_IF_ERROR(Init());
    if (length == 0) return InvalidArgument("cuda: cannot allocate 0 bytes");
    if (kind == AllocationKind::kPinnedHost && device < 0) device = 0;
    ContextScope scope(driver_->api());
    MC_RETURN_IF_ERROR(EnterDevice(device));
    const auto& api = driver_->api();
    Allocation a{kind, length, device};
    if (kind == AllocationKind::kFabric) MC_RETURN_IF_ERROR(CheckFabricSupport(device));
    void* ptr = nullptr;
    if (kind == AllocationKind::kPinnedHost) {
      MC_RETURN_IF_ERROR(Check(api.cuMemHostAlloc(&ptr, length, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
                               "cuMemHostAlloc(" + std::to_string(length) + ")", ErrorCode::kMemory));
    } else if (kind == AllocationKind::kDevice) {
      CUdeviceptr d = 0;
      MC_RETURN_IF_ERROR(
          Check(api.cuMemAlloc(&d, length), "cuMemAlloc(" + std::to_string(length) + ")", ErrorCode::kMemory));
      ptr = Ptr(d);
    } else {
      StatusOr<void*> vmm = AllocateShareable(
          length, device, &a,
          kind == AllocationKind::kFabric ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (!vmm.ok()) return vmm.status();
      ptr = *vmm;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (kind == AllocationKind::kShareable) a.id = NextAllocationId();
    allocations_[reinterpret_cast<uintptr_t>(ptr)] = a;
    return ptr;
  }

  Status Free(void* ptr, size_t length, AllocationKind kind) override {
    MC_RETURN_IF_ERROR(Init());
    // The allocation at `ptr` matching `length` and `kind`, removed from the bookkeeping when `take`.
    auto find = [&](bool take, Allocation* out) -> Status {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it == allocations_.end()) {
        return InvalidArgument("cuda: " + Addr(ptr) + " was not allocated by this platform");
      }
      if (it->second.kind != kind || it->second.length != length) {
        return InvalidArgument("cuda: free of " + Addr(ptr) + " with " + std::to_string(length) +
                               " bytes / kind " + std::to_string(static_cast<int>(kind)) +
                               " does not match its allocation (" + std::to_string(it->second.length) +
                               " bytes / kind " + std::to_string(static_cast<int>(it->second.kind)) + ")");
      }
      *out = it->second;
      if (take) allocations_.erase(it);
      return Status::Ok();
    };
    Allocation a;
    MC_RETURN_IF_ERROR(find(false, &a));
    ContextScope scope(driver_->api());
    // The allocation leaves the bookkeeping only once its device is entered: a failure to enter it leaves the
    // allocation in place for a later Free.
    MC_RETURN_IF_ERROR(EnterDevice(a.device));
    MC_RETURN_IF_ERROR(find(true, &a));  // again: a concurrent Free or ExportIpc may have changed it
    const auto& api = driver_->api();
    if (a.exported_fd >= 0) close(a.exported_fd);
    if (kind == AllocationKind::kPinnedHost) return Check(api.cuMemFreeHost(ptr), "cuMemFreeHost");
    if (kind == AllocationKind::kDevice) return Check(api.cuMemFree(Dptr(ptr)), "cuMemFree");
    Status unmap = Check(api.cuMemUnmap(Dptr(ptr), a.mapped), "cuMemUnmap");
    Status release = Check(api.cuMemRelease(a.vmm), "cuMemRelease");
    Status address = Check(api.cuMemAddressFree(Dptr(ptr), a.mapped), "cuMemAddressFree");
    return !unmap.ok() ? unmap : !release.ok() ? release : address;
  }

  StatusOr<std::string> ExportIpc(void* ptr, size_t length) override {
    MC_RETURN_IF_ERROR(Init());
    if (ptr == nullptr || length == 0) return InvalidArgument("cuda: ExportIpc needs a non-null address and length");
    const auto& api = driver_->api();
    ContextScope scope(api);
    CudaIpcHandle h;
    h.pid = getpid();
    h.length = length;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(ptr);
    auto [base, ours] = Lookup(addr);
    if (ours && ours->kind == AllocationKind::kFabric) {
      return InvalidArgument("cuda: " + Addr(ptr) + " is a fabric allocation: export it with ExportFabric");
    }
    if (ours && ours->kind == AllocationKind::kPinnedHost) {
      return Status(ErrorCode::kNotImplemented, "cuda: " + Addr(ptr) + " is pinned host memory, which has no "
                                                "CUDA IPC handle (share it through the shm transport)");
    }
    if (ours && ours->kind == AllocationKind::kShareable) {
      MC_RETURN_IF_ERROR(CheckInside(addr, length, base, ours->length));
      StatusOr<int> fd = ExportedFd(base, *ours);
      if (!fd.ok()) return fd.status();
      h.kind = CudaIpcHandle::Kind::kPosixFd;
      h.device = ours->device;
      h.offset = addr - base;
      h.fd = *fd;
      h.allocation_size = ours->mapped;
      h.allocation_id = ours->id;
      return h.Encode();
    }
    // Any other device memory (ours from cuMemAlloc, or another library's): a legacy handle of its allocation.
    std::optional<MemoryKind> kind = Classify(ptr);
    if (!kind || kind->type != MemoryType::kCuda) {
      return InvalidArgument("cuda: " + Addr(ptr) + " is not CUDA device memory");
    }
    MC_RETURN_IF_ERROR(EnterDevice(kind->device));
    CUdeviceptr range_base = 0;
    size_t size = 0;
    MC_RETURN_IF_ERROR(Check(api.cuMemGetAddressRange(&range_base, &size, Dptr(ptr)), "cuMemGetAddressRange",
                             ErrorCode::kInvalidArgument));
    MC_RETURN_IF_ERROR(CheckInside(addr, length, static_cast<uintptr_t>(range_base), size));
    CUipcMemHandle ipc;
    MC_RETURN_IF_ERROR(Check(api.cuIpcGetMemHandle(&ipc, range_base), "cuIpcGetMemHandle"));
    static_assert(sizeof(ipc.reserved) == sizeof(h.legacy), "CUipcMemHandle is 64 bytes");
    memcpy(h.legacy.data(), ipc.reserved, sizeof(ipc.reserved));
    h.kind = CudaIpcHandle::Kind::kLegacy;
    h.device = kind->device;
    h.offset = addr - static_cast<uintptr_t>(range_base);
    return h.Encode();
  }

  StatusOr<DmabufExport> ExportDmabuf(const void* ptr, size_t length) override {
    MC_RETURN_IF_ERROR(Init());
    if (ptr == nullptr || length == 0) {
      return InvalidArgument("cuda: ExportDmabuf needs a non-null address and length");
    }
    const auto& api = driver_->api();
    if (api.cuMemGetHandleForAddressRange == nullptr) {
      return Status(ErrorCode::kNotImplemented, "cuda: " + driver_->soname() +
                                                    " has no cuMemGetHandleForAddressRange (dma-buf export needs a "
                                                    "CUDA 11.7 or newer driver)");
    }
    std::optional<MemoryKind> kind = Classify(ptr);
    if (!kind || kind->type != MemoryType::kCuda) {
      return InvalidArgument("cuda: " + Addr(ptr) + " is not CUDA device memory");
    }
    ContextScope scope(api);
    MC_RETURN_IF_ERROR(EnterDevice(kind->device));
    CUdevice dev = 0;
    MC_RETURN_IF_ERROR(Check(api.cuDeviceGet(&dev, kind->device), "cuDeviceGet"));
    int supported = 0;
    MC_RETURN_IF_ERROR(Check(api.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev),
                             "cuDeviceGetAttribute(DMA_BUF_SUPPORTED)"));
    if (supported == 0) {
      return Status(ErrorCode::kNotImplemented, "cuda: device " + std::to_string(kind->device) +
                                                    " does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED "
                                                    "is 0: it needs the open GPU kernel modules and Linux 5.12+)");
    }
    const uintptr_t addr = reinterpret_cast<uintptr_t>(ptr);
    CUdeviceptr range_base = 0;
    size_t size = 0;
    MC_RETURN_IF_ERROR(Check(api.cuMemGetAddressRange(&range_base, &size, Dptr(ptr)), "cuMemGetAddressRange",
                             ErrorCode::kInvalidArgument));
    MC_RETURN_IF_ERROR(CheckInside(addr, length, static_cast<uintptr_t>(range_base), size));
    // CUDA wants the range aligned to the host page size: the dma-buf covers the pages holding the range.
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = addr / page * page;
    const uintptr_t end = platform_util::RoundUp(addr + length, page);
    int fd = -1;
    CUresult r = api.cuMemGetHandleForAddressRange(&fd, static_cast<CUdeviceptr>(begin), end - begin,
                                                   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    MC_RETURN_IF_ERROR(Check(r, "cuMemGetHandleForAddressRange(" + Range(begin, end - begin) + ")",
                             r == CUDA_ERROR_NOT_SUPPORTED ? ErrorCode::kNotImplemented : ErrorCode::kMemory));
    if (fd < 0) return Status(ErrorCode::kMemory, "cuda: cuMemGetHandleForAddressRange returned no fd");
    return DmabufExport{fd, static_cast<uint64_t>(addr - begin)};
  }

  StatusOr<DeviceLocality> Locality(int device) override {
    MC_RETURN_IF_ERROR(Init());
    if (device < 0 || device >= device_count_) {
      return Status(ErrorCode::kDeviceNotFound, "cuda: no device " + std::to_string(device) + " (this process has " +
                                                    std::to_string(device_count_) + ")");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (const auto& known = localities_[static_cast<size_t>(device)]) return *known;
    }
    const auto& api = driver_->api();
    CUdevice dev = 0;
    MC_RETURN_IF_ERROR(Check(api.cuDeviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")"));
    int domain = 0, bus = 0, slot = 0;
    MC_RETURN_IF_ERROR(Check(api.cuDeviceGetAttribute(&domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev),
                             "cuDeviceGetAttribute(PCI_DOMAIN_ID)"));
    MC_RETURN_IF_ERROR(Check(api.cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev),
                             "cuDeviceGetAttribute(PCI_BUS_ID)"));
    MC_RETURN_IF_ERROR(Check(api.cuDeviceGetAttribute(&slot, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev),
                             "cuDeviceGetAttribute(PCI_DEVICE_ID)"));
    DeviceLocality loc;
    char id[32];
    snprintf(id, sizeof(id), "%04x:%02x:%02x.0", static_cast<unsigned>(domain), static_cast<unsigned>(bus),
             static_cast<unsigned>(slot));
    loc.pci_bus_id = id;
    loc.numa_node = platform_util::ReadNumaNode(sysfs_root_ + "/bus/pci/devices/" + loc.pci_bus_id + "/numa_node");
    std::lock_guard<std::mutex> lock(mu_);
    localities_[static_cast<size_t>(device)] = loc;
    return loc;
  }

  StatusOr<void*> ImportIpc(const std::string& handle, int owner_pid, size_t length) override {
    MC_RETURN_IF_ERROR(Init());
    StatusOr<CudaIpcHandle> h = CudaIpcHandle::Decode(handle);
    if (!h.ok()) return h.status();
    if (h->pid != owner_pid) {
      return InvalidArgument("cuda: the handle was exported by process " + std::to_string(h->pid) + ", not by " +
                             std::to_string(owner_pid));
    }
    if (length == 0 || length > h->length) {
      return InvalidArgument("cuda: cannot import " + std::to_string(length) + " bytes of a handle for " +
                             std::to_string(h->length));
    }
    if (h->pid == getpid()) {
      return InvalidArgument("cuda: the handle was exported by this process; use the memory directly");
    }
    if (h->kind == CudaIpcHandle::Kind::kFabric) return InvalidArgument("cuda: a fabric handle: use ImportFabric");
    return ImportDecoded(*h, length);
  }

  StatusOr<std::string> ExportFabric(void* ptr, size_t length) override {
    MC_RETURN_IF_ERROR(Init());
    if (ptr == nullptr || length == 0) return InvalidArgument("cuda: ExportFabric needs a non-null address and length");
    const uintptr_t addr = reinterpret_cast<uintptr_t>(ptr);
    auto [base, ours] = Lookup(addr);
    if (!ours || ours->kind != AllocationKind::kFabric) {
      return InvalidArgument("cuda: " + Addr(ptr) + " is not in a fabric allocation (AllocationKind::kFabric)");
    }
    MC_RETURN_IF_ERROR(CheckInside(addr, length, base, ours->length));
    ContextScope scope(driver_->api());
    MC_RETURN_IF_ERROR(EnterDevice(ours->device));
    CUmemFabricHandle fabric{};
    CUresult r = driver_->api().cuMemExportToShareableHandle(&fabric, ours->vmm, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    if (r != CUDA_SUCCESS) return FabricRefused(r, "cuMemExportToShareableHandle(FABRIC)");
    CudaIpcHandle h;
    h.kind = CudaIpcHandle::Kind::kFabric;
    h.pid = getpid();
    h.device = ours->device;
    h.offset = addr - base;
    h.length = length;
    h.allocation_size = ours->mapped;
    memcpy(h.legacy.data(), fabric.data, h.legacy.size());
    return h.Encode();
  }

  using Platform::ImportFabric;
  StatusOr<void*> ImportFabric(const std::string& handle, size_t length, FabricAccess access) override {
    MC_RETURN_IF_ERROR(Init());
    StatusOr<CudaIpcHandle> h = CudaIpcHandle::Decode(handle);
    if (!h.ok()) return h.status();
    if (h->kind != CudaIpcHandle::Kind::kFabric) return InvalidArgument("cuda: not a fabric handle: use ImportIpc");
    if (length == 0 || length > h->length) {
      return InvalidArgument("cuda: cannot import " + std::to_string(length) + " bytes of a handle for " +
                             std::to_string(h->length));
    }
    return ImportDecoded(*h, length, access == FabricAccess::kReadOnly);
  }

  // CloseIpc undoes fabric imports as well (one bookkeeping for both).
  Status CloseFabric(void* mapped, size_t length) override { return CloseIpc(mapped, length); }

  // The import of a checked handle (ImportIpc, ImportFabric): one mapping per exported allocation and access.
  StatusOr<void*> ImportDecoded(const CudaIpcHandle& decoded, size_t length, bool read_only = false) {
    const CudaIpcHandle* h = &decoded;
    const int device = h->device < device_count_ ? h->device : 0;
    // One mapping per exported allocation: the handle without its range.
    CudaIpcHandle whole = *h;
    whole.offset = 0;
    whole.length = 1;
    const std::string key = whole.Encode() + (read_only ? ":read-only" : "");

    ContextScope scope(driver_->api());
    std::lock_guard<std::mutex> lock(import_mu_);
    auto m = mappings_.find(key);
    if (m == mappings_.end()) {
      StatusOr<Mapping> mapped = Map(*h, device, read_only);
      if (!mapped.ok()) return mapped.status();
      m = mappings_.emplace(key, *mapped).first;
    }
    if (h->offset > m->second.size || h->length > m->second.size - h->offset) {
      Status outside = InvalidArgument("cuda: the handle's range [" + std::to_string(h->offset) + ", +" +
                                       std::to_string(h->length) + ") runs past its allocation of " +
                                       std::to_string(m->second.size) + " bytes");
      if (m->second.refs == 0) {  // mapped just now for this import
        Mapping gone = m->second;
        mappings_.erase(m);
        Status st = Unmap(gone);
        (void)st;
      }
      return outside;
    }
    const uintptr_t local = static_cast<uintptr_t>(m->second.base) + h->offset;
    auto it = imports_.find(local);
    if (it != imports_.end()) {
      if (it->second.key != key || it->second.length != length) {
        return InvalidArgument("cuda: " + Hex(local) + " is already imported with another handle or length");
      }
      ++it->second.refs;
    } else {
      imports_[local] = Import{key, length, 1};
    }
    ++m->second.refs;
    return reinterpret_cast<void*>(local);
  }

  Status CloseIpc(void* mapped, size_t length) override {
    MC_RETURN_IF_ERROR(Init());
    ContextScope scope(driver_->api());
    std::lock_guard<std::mutex> lock(import_mu_);
    auto it = imports_.find(reinterpret_cast<uintptr_t>(mapped));
    if (it == imports_.end()) return InvalidArgument("cuda: " + Addr(mapped) + " is not an address ImportIpc returned");
    if (it->second.length != length) {
      return InvalidArgument("cuda: CloseIpc of " + Addr(mapped) + " with " + std::to_string(length) +
                             " bytes; it was imported with " + std::to_string(it->second.length));
    }
    auto m = mappings_.find(it->second.key);
    if (--it->second.refs == 0) imports_.erase(it);
    if (--m->second.refs > 0) return Status::Ok();
    Mapping gone = m->second;
    mappings_.erase(m);
    return Unmap(gone);
  }

  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t length, int device,
                                                      void* user_stream) override {
    MC_RETURN_IF_ERROR(Init());
    if (length > 0 && (dst == nullptr || src == nullptr)) {
      return InvalidArgument("cuda: copy of " + std::to_string(length) + " bytes with a null address");
    }
    ContextScope scope(driver_->api());
    if (device == -1) {
      std::optional<MemoryKind> d = Classify(dst), s = Classify(src);
      device = d && d->is_device() ? d->device : s && s->is_device() ? s->device : 0;
    }
    MC_RETURN_IF_ERROR(EnterDevice(device));
    StatusOr<CUstream> stream = user_stream != nullptr ? StatusOr<CUstream>(static_cast<CUstream>(user_stream))
                                                       : Stream(device);
    if (!stream.ok()) return stream.status();
    const auto& api = driver_->api();
    if (length > 0) {
      MC_RETURN_IF_ERROR(Check(api.cuMemcpyAsync(Dptr(dst), Dptr(src), length, *stream),
                               "cuMemcpyAsync(" + Addr(dst) + " <- " + Addr(src) + ", " + std::to_string(length) + ")",
                               ErrorCode::kInvalidArgument));
    }
    // Blocking sync: the completion's Wait (cuEventSynchronize) sleeps until the copy is done instead of spinning
    // a core; no timing, so the event is cheap to record.
    CUevent event = nullptr;
    MC_RETURN_IF_ERROR(
        Check(api.cuEventCreate(&event, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    CUresult r = api.cuEventRecord(event, *stream);
    if (r != CUDA_SUCCESS) {
      api.cuEventDestroy(event);
      return Check(r, "cuEventRecord");
    }
    return std::unique_ptr<CopyCompletion>(new EventCompletion(driver_, Context(device), event));
  }

  StatusOr<void*> CreateStream(int device) override {
    MC_RETURN_IF_ERROR(Init());
    ContextScope scope(driver_->api());
    MC_RETURN_IF_ERROR(EnterDevice(device));
    CUstream s = nullptr;
    MC_RETURN_IF_ERROR(Check(driver_->api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
    std::lock_guard<std::mutex> lock(mu_);
    created_streams_[s] = device;
    return static_cast<void*>(s);
  }

  Status DestroyStream(void* stream) override {
    MC_RETURN_IF_ERROR(Init());
    CUstream s = static_cast<CUstream>(stream);
    int device = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = created_streams_.find(s);
      if (it == created_streams_.end()) {
        return InvalidArgument("cuda: " + Addr(stream) + " is not a stream CreateStream made (or it was destroyed)");
      }
      device = it->second;
      created_streams_.erase(it);
    }
    ContextScope scope(driver_->api());
    MC_RETURN_IF_ERROR(EnterDevice(device));
    // Returns at once; the driver releases the stream once the work already enqueued on it has completed.
    return Check(driver_->api().cuStreamDestroy(s), "cuStreamDestroy");
  }

 private:
  // Loads the driver and counts devices once; ok when usable, else kDeviceNotFound with the reason.
  Status Init() {
    std::call_once(init_once_, [this] {
      StatusOr<std::shared_ptr<const Driver>> loaded = Driver::Load(sonames_);
      if (!loaded.ok()) {
        probe_.reason = loaded.status().message();
        return;
      }
      const auto& api = (*loaded)->api();
      Status init = (*loaded)->Check(api.cuInit(0), "cuInit");
      if (!init.ok()) {
        probe_.reason = init.message();
        return;
      }
      int version = 0;
      api.cuDriverGetVersion(&version);
      int count = 0;
      Status counted = (*loaded)->Check(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
      if (!counted.ok()) {
        probe_.reason = counted.message();
        return;
      }
      const std::string driver =
          "CUDA driver " + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10) + " (" +
          (*loaded)->soname() + ")";
      if (count <= 0) {
        probe_.reason = "no CUDA device (" + driver + ")";
        return;
      }
      driver_ = *loaded;
      device_count_ = count;
      contexts_.assign(static_cast<size_t>(count), nullptr);
      streams_.assign(static_cast<size_t>(count), nullptr);
      localities_.assign(static_cast<size_t>(count), std::nullopt);
      probe_.usable = true;
      probe_.device_count = count;
      probe_.reason = driver + ", " + std::to_string(count) + " device(s)";
    });
    if (probe_.usable) return Status::Ok();
    return Status(ErrorCode::kDeviceNotFound, "cuda platform unusable: " + probe_.reason);
  }

  Status Check(CUresult r, const std::string& what, ErrorCode code = ErrorCode::kContext) const {
    return driver_->Check(r, "cuda: " + what, code);
  }

  // Makes `device`'s primary context current on this thread (retaining it the first time).
  Status EnterDevice(int device) {
    if (device < 0 || device >= device_count_) {
      return Status(ErrorCode::kDeviceNotFound, "cuda: no device " + std::to_string(device) + " (this process has " +
                                                    std::to_string(device_count_) + ")");
    }
    const auto& api = driver_->api();
    CUcontext ctx;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ctx = contexts_[static_cast<size_t>(device)];
      if (ctx == nullptr) {
        CUdevice dev = 0;
        MC_RETURN_IF_ERROR(Check(api.cuDeviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")"));
        MC_RETURN_IF_ERROR(Check(api.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
        contexts_[static_cast<size_t>(device)] = ctx;
      }
    }
    return Check(api.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  }

  // The POSIX fd of shareable allocation `a` at `base`, exported the first time (kept until Free).
  StatusOr<int> ExportedFd(uintptr_t base, const Allocation& a) {
    if (a.exported_fd >= 0) return a.exported_fd;
    MC_RETURN_IF_ERROR(EnterDevice(a.device));
    int fd = -1;
    MC_RETURN_IF_ERROR(Check(driver_->api().cuMemExportToShareableHandle(&fd, a.vmm,
                                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                             "cuMemExportToShareableHandle"));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(base);
    if (it == allocations_.end()) {  // freed meanwhile
      close(fd);
      return InvalidArgument("cuda: " + Hex(base) + " was freed during ExportIpc");
    }
    if (it->second.exported_fd >= 0) {  // another thread exported it first
      close(fd);
      return it->second.exported_fd;
    }
    it->second.exported_fd = fd;
    return fd;
  }

  CUcontext Context(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return contexts_[static_cast<size_t>(device)];
  }

  // The platform's stream on `device` (created the first time; needs that device's context current).
  StatusOr<CUstream> Stream(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    CUstream& s = streams_[static_cast<size_t>(device)];
    if (s == nullptr) {
      MC_RETURN_IF_ERROR(Check(driver_->api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
    }
    return s;
  }

  CUmemAllocationProp ShareableProp(int device, CUmemAllocationHandleType type) const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = type;
    return prop;
  }

  // Ok when `device` (current) reports fabric handle support; else why not ("fabric handles unsupported: ...").
  Status CheckFabricSupport(int device) const {
    const auto& api = driver_->api();
    CUdevice dev = 0;
    int supported = 0;
    MC_RETURN_IF_ERROR(Check(api.cuDeviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")"));
    MC_RETURN_IF_ERROR(Check(api.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev),
                             "cuDeviceGetAttribute(HANDLE_TYPE_FABRIC_SUPPORTED)"));
    if (supported) return Status::Ok();
    return Status(ErrorCode::kNotImplemented, "fabric handles unsupported: device " + std::to_string(device) +
                                                  " reports CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 0 "
                                                  "(multi-node NVLink needs an NVSwitch fabric and IMEX)");
  }

  // A fabric call the driver refused: kNotImplemented "fabric handles unsupported: ..." where it says the
  // fabric cannot (not supported / not permitted: no IMEX channel), its error otherwise.
  Status FabricRefused(CUresult r, const std::string& what) const {
    const bool unsupported = r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED;
    Status st = Check(r, what, unsupported ? ErrorCode::kNotImplemented : ErrorCode::kInvalidArgument);
    return unsupported ? Status(st.code(), "fabric handles unsupported: " + st.message()) : st;
  }

  // Read-write (or `read_only`) access to [va, va+size) for devices first .. first+count-1.
  Status SetAccess(CUdeviceptr va, size_t size, int first, int count = 1, bool read_only = false) const {
    std::vector<CUmemAccessDesc> access(static_cast<size_t>(count));
    for (int d = 0; d < count; ++d) {
      access[d].location = {CU_MEM_LOCATION_TYPE_DEVICE, first + d};
      access[d].flags = read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    return Check(driver_->api().cuMemSetAccess(va, size, access.data(), access.size()), "cuMemSetAccess");
  }

  // Reserves `size` bytes of address space and maps `vmm` there for `device`, or (`every_device`, imports: the
  // copy runs on the local buffer's device, not the exporter's ordinal) for every device of this process where
  // the driver allows it (else `device` only), read-only when `read_only`; the address, or an error with all
  // undone except `vmm`.
  StatusOr<CUdeviceptr> MapVmm(CUmemGenericAllocationHandle vmm, size_t size, int device, bool every_device = false,
                               bool read_only = false) {
    const auto& api = driver_->api();
    CUdeviceptr va = 0;
    MC_RETURN_IF_ERROR(Check(api.cuMemAddressReserve(&va, size, 0, 0, 0), "cuMemAddressReserve", ErrorCode::kMemory));
    Status st = Check(api.cuMemMap(va, size, 0, vmm, 0), "cuMemMap", ErrorCode::kMemory);
    if (!st.ok()) {
      api.cuMemAddressFree(va, size);
      return st;
    }
    const bool all = every_device && device_count_ > 1 && SetAccess(va, size, 0, device_count_, read_only).ok();
    st = all ? Status::Ok() : SetAccess(va, size, device, 1, read_only);
    if (!st.ok()) {
      api.cuMemUnmap(va, size);
      api.cuMemAddressFree(va, size);
      return st;
    }
    return va;
  }

  StatusOr<void*> AllocateShareable(size_t length, int device, Allocation* a, CUmemAllocationHandleType type) {
    const auto& api = driver_->api();
    CUmemAllocationProp prop = ShareableProp(device, type);
    size_t granularity = 0;
    MC_RETURN_IF_ERROR(Check(api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                             "cuMemGetAllocationGranularity"));
    if (granularity == 0) granularity = 2 << 20;
    const size_t size = platform_util::RoundUp(length, granularity);
    if (size < length) return InvalidArgument("cuda: length " + std::to_string(length) + " too large");
    CUmemGenericAllocationHandle vmm = 0;
    const std::string what = "cuMemCreate(" + std::to_string(size) + ")";
    CUresult created = api.cuMemCreate(&vmm, size, &prop, 0);
    if (created != CUDA_SUCCESS && type == CU_MEM_HANDLE_TYPE_FABRIC) return FabricRefused(created, what);
    MC_RETURN_IF_ERROR(Check(created, what, ErrorCode::kMemory));
    StatusOr<CUdeviceptr> va = MapVmm(vmm, size, device);
    if (!va.ok()) {
      api.cuMemRelease(vmm);
      return va.status();
    }
    a->mapped = size;
    a->vmm = vmm;
    return Ptr(*va);
  }

  StatusOr<Mapping> Map(const CudaIpcHandle& h, int device, bool read_only) {
    MC_RETURN_IF_ERROR(EnterDevice(device));
    const auto& api = driver_->api();
    Mapping m;
    m.kind = h.kind;
    m.device = device;
    if (h.kind == CudaIpcHandle::Kind::kLegacy) {
      CUipcMemHandle ipc;
      memcpy(ipc.reserved, h.legacy.data(), sizeof(ipc.reserved));
      MC_RETURN_IF_ERROR(Check(api.cuIpcOpenMemHandle(&m.base, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                               "cuIpcOpenMemHandle", ErrorCode::kInvalidArgument));
      CUdeviceptr range_base = 0;
      size_t size = 0;
      Status range = Check(api.cuMemGetAddressRange(&range_base, &size, m.base), "cuMemGetAddressRange");
      if (range.ok() && range_base != m.base) {
        range = Status(ErrorCode::kContext, "cuda: cuIpcOpenMemHandle returned " + Hex(m.base) +
                                                ", inside the allocation at " + Hex(range_base));
      }
      if (!range.ok()) {
        api.cuIpcCloseMemHandle(m.base);
        return range;
      }
      m.size = size;
      return m;
    }
    if (h.kind == CudaIpcHandle::Kind::kFabric) {
      CUmemFabricHandle fabric{};
      memcpy(fabric.data, h.legacy.data(), h.legacy.size());
      CUresult r = api.cuMemImportFromShareableHandle(&m.vmm, &fabric, CU_MEM_HANDLE_TYPE_FABRIC);
      if (r != CUDA_SUCCESS) return FabricRefused(r, "cuMemImportFromShareableHandle(FABRIC)");
    } else {
      StatusOr<int> fd = platform_util::DuplicateRemoteFd(h.pid, h.fd, "cuda");
      if (!fd.ok()) return fd.status();
      CUresult r = api.cuMemImportFromShareableHandle(&m.vmm, reinterpret_cast<void*>(static_cast<uintptr_t>(*fd)),
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      close(*fd);  // the imported handle holds the memory
      MC_RETURN_IF_ERROR(Check(r, "cuMemImportFromShareableHandle", ErrorCode::kInvalidArgument));
    }
    StatusOr<CUdeviceptr> va = MapVmm(m.vmm, h.allocation_size, device, /*every_device=*/true, read_only);
    if (!va.ok()) {
      api.cuMemRelease(m.vmm);
      return va.status();
    }
    m.base = *va;
    m.size = h.allocation_size;
    return m;
  }

  Status Unmap(const Mapping& m) {
    MC_RETURN_IF_ERROR(EnterDevice(m.device));
    const auto& api = driver_->api();
    if (m.kind == CudaIpcHandle::Kind::kLegacy) return Check(api.cuIpcCloseMemHandle(m.base), "cuIpcCloseMemHandle");
    Status unmap = Check(api.cuMemUnmap(m.base, m.size), "cuMemUnmap");
    Status release = Check(api.cuMemRelease(m.vmm), "cuMemRelease");
    Status address = Check(api.cuMemAddressFree(m.base, m.size), "cuMemAddressFree");
    return !unmap.ok() ? unmap : !release.ok() ? release : address;
  }

  // A copy of the allocation containing `addr` and its start; {0, nullopt} when none.
  std::pair<uintptr_t, std::optional<Allocation>> Lookup(uintptr_t addr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [start, a] = FindAllocation(addr);
    return {start, a != nullptr ? std::optional<Allocation>(*a) : std::nullopt};
  }

  // The allocation containing `addr` and its start; {0, null} when none. Needs mu_.
  std::pair<uintptr_t, Allocation*> FindAllocation(uintptr_t addr) {
    auto it = allocations_.upper_bound(addr);
    if (it == allocations_.begin()) return {0, nullptr};
    --it;
    if (addr - it->first >= it->second.length) return {0, nullptr};
    return {it->first, &it->second};
  }

  static Status CheckInside(uintptr_t addr, size_t length, uintptr_t base, size_t size) {
    if (addr < base || addr - base > size || length > size - (addr - base)) {
      return InvalidArgument("cuda: " + Range(addr, length) + " runs past its allocation " + Range(base, size));
    }
    return Status::Ok();
  }

  const std::vector<std::string> sonames_;
  const std::string sysfs_root_;           // where Locality reads PCI devices' numa_node ("/sys")
  std::once_flag init_once_;
  PlatformProbe probe_;                    // written once by Init
  std::shared_ptr<const Driver> driver_;   // set by Init when usable
  int device_count_ = 0;                   // written once by Init

  std::mutex mu_;  // allocations_, contexts_, streams_, created_streams_, localities_
  std::map<uintptr_t, Allocation> allocations_;
  std::vector<CUcontext> contexts_;
  std::vector<CUstream> streams_;               // the platform's own, per device
  std::map<CUstream, int> created_streams_;     // CreateStream's, alive -> device
  std::vector<std::optional<DeviceLocality>> localities_;  // per device, once Locality found it

  std::mutex import_mu_;  // mappings_, imports_
  std::map<std::string, Mapping> mappings_;  // handle of the whole allocation -> its mapping
  std::map<uintptr_t, Import> imports_;      // address ImportIpc returned -> import
};

}  // namespace

// Linked in: registered at start-up (unusable, with its reason, where there is no driver or GPU); as a .so: the
// plugin entry point. Platform::Probe answers for it either way.
MC_PLATFORM_PLUGIN("cuda", CudaPlatform, nullptr);

std::shared_ptr<Platform> MakeCudaPlatform() { return std::make_shared<CudaPlatform>(); }

std::shared_ptr<Platform> MakeCudaPlatform(std::vector<std::string> driver_sonames) {
  return std::make_shared<CudaPlatform>(std::move(driver_sonames));
}

std::shared_ptr<Platform> MakeCudaPlatform(std::vector<std::string> driver_sonames, std::string sysfs_root) {
  return std::make_shared<CudaPlatform>(std::move(driver_sonames), std::move(sysfs_root));
}

}  // namespace mooncake::te
