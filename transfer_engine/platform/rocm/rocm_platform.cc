#include "transfer_engine/platform/rocm/rocm_platform.h"

#include <cstring>

#include "transfer_engine/platform/gpu/dl_library.h"
#include "transfer_engine/platform/gpu/gpu_platform.h"
#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te {
namespace {

// The HIP ABI this file relies on (hip_runtime_api.h of ROCm 5.x-7.x, C linkage).
using hipError_t = int;
constexpr hipError_t kHipSuccess = 0;
constexpr hipError_t kHipErrorNotReady = 600;
constexpr unsigned kHipHostMallocPortable = 0x1, kHipHostMallocMapped = 0x2;
constexpr unsigned kHipStreamNonBlocking = 0x1;
constexpr unsigned kHipEventBlockingSync = 0x1;  // hipEventSynchronize sleeps instead of spinning
constexpr unsigned kHipEventDisableTiming = 0x2;
constexpr int kHipMemcpyDefault = 4;

struct HipIpcMemHandle {
  char reserved[64];
};

// hipPointerAttribute_t: the same layout in ROCm 5 ("memoryType") and 6+ ("type").
struct HipPointerAttribute {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  int is_managed;
  unsigned allocation_flags;
};

struct HipApi {
  hipError_t (*hipInit)(unsigned);
  hipError_t (*hipRuntimeGetVersion)(int*);
  hipError_t (*hipGetDeviceCount)(int*);
  hipError_t (*hipSetDevice)(int);
  const char* (*hipGetErrorName)(hipError_t);
  const char* (*hipGetErrorString)(hipError_t);
  hipError_t (*hipPointerGetAttributes)(HipPointerAttribute*, const void*);
  hipError_t (*hipMalloc)(void**, size_t);
  hipError_t (*hipFree)(void*);
  hipError_t (*hipHostMalloc)(void**, size_t, unsigned);
  hipError_t (*hipHostFree)(void*);
  hipError_t (*hipMemGetAddressRange)(void**, size_t*, void*);
  hipError_t (*hipIpcGetMemHandle)(HipIpcMemHandle*, void*);
  hipError_t (*hipIpcOpenMemHandle)(void**, HipIpcMemHandle, unsigned);
  hipError_t (*hipIpcCloseMemHandle)(void*);
  hipError_t (*hipStreamCreateWithFlags)(void**, unsigned);
  hipError_t (*hipStreamDestroy)(void*);
  hipError_t (*hipMemcpyAsync)(void*, const void*, size_t, int, void*);
  hipError_t (*hipEventCreateWithFlags)(void**, unsigned);
  hipError_t (*hipEventRecord)(void*, void*);
  hipError_t (*hipEventQuery)(void*);
  hipError_t (*hipEventSynchronize)(void*);
  hipError_t (*hipEventDestroy)(void*);
};

class HipRuntime final : public gpu::Runtime {
 public:
  explicit HipRuntime(std::vector<std::string> sonames) : sonames_(std::move(sonames)) {}

  StatusOr<gpu::RuntimeInfo> Load() override {
    StatusOr<gpu::DlLibrary> lib = gpu::DlLibrary::Open(sonames_, "libamdhip64.so.*");
    if (!lib.ok()) return lib.status();
    std::string missing;
    lib->Require(&api_.hipInit, {"hipInit"}, &missing);
    lib->Require(&api_.hipRuntimeGetVersion, {"hipRuntimeGetVersion"}, &missing);
    lib->Require(&api_.hipGetDeviceCount, {"hipGetDeviceCount"}, &missing);
    lib->Require(&api_.hipSetDevice, {"hipSetDevice"}, &missing);
    lib->Require(&api_.hipGetErrorName, {"hipGetErrorName"}, &missing);
    lib->Require(&api_.hipGetErrorString, {"hipGetErrorString"}, &missing);
    lib->Require(&api_.hipPointerGetAttributes, {"hipPointerGetAttributes"}, &missing);
    lib->Require(&api_.hipMalloc, {"hipMalloc"}, &missing);
    lib->Require(&api_.hipFree, {"hipFree"}, &missing);
    lib->Require(&api_.hipHostMalloc, {"hipHostMalloc", "hipHostAlloc"}, &missing);
    lib->Require(&api_.hipHostFree, {"hipHostFree", "hipFreeHost"}, &missing);
    lib->Require(&api_.hipMemGetAddressRange, {"hipMemGetAddressRange"}, &missing);
    lib->Require(&api_.hipIpcGetMemHandle, {"hipIpcGetMemHandle"}, &missing);
    lib->Require(&api_.hipIpcOpenMemHandle, {"hipIpcOpenMemHandle"}, &missing);
    lib->Require(&api_.hipIpcCloseMemHandle, {"hipIpcCloseMemHandle"}, &missing);
    lib->Require(&api_.hipStreamCreateWithFlags, {"hipStreamCreateWithFlags"}, &missing);
    lib->Require(&api_.hipStreamDestroy, {"hipStreamDestroy"}, &missing);
    lib->Require(&api_.hipMemcpyAsync, {"hipMemcpyAsync"}, &missing);
    lib->Require(&api_.hipEventCreateWithFlags, {"hipEventCreateWithFlags"}, &missing);
    lib->Require(&api_.hipEventRecord, {"hipEventRecord"}, &missing);
    lib->Require(&api_.hipEventQuery, {"hipEventQuery"}, &missing);
    lib->Require(&api_.hipEventSynchronize, {"hipEventSynchronize"}, &missing);
    lib->Require(&api_.hipEventDestroy, {"hipEventDestroy"}, &missing);
    if (!missing.empty()) return Status(ErrorCode::kDeviceNotFound, lib->soname() + " has no " + missing);
    MC_RETURN_IF_ERROR(Check(api_.hipInit(0), "hipInit", ErrorCode::kDeviceNotFound));
    int version = 0;
    MC_RETURN_IF_ERROR(Check(api_.hipRuntimeGetVersion(&version), "hipRuntimeGetVersion", ErrorCode::kDeviceNotFound));
    major_ = version / 10000000;
    int count = 0;
    hipError_t counted = api_.hipGetDeviceCount(&count);
    if (counted != kHipSuccess && counted != 100 /* hipErrorNoDevice */) {
      return Check(counted, "hipGetDeviceCount", ErrorCode::kDeviceNotFound);
    }
    gpu::RuntimeInfo info;
    info.device_count = counted == kHipSuccess ? count : 0;
    info.summary = "HIP runtime " + std::to_string(major_) + "." + std::to_string(version / 100000 % 100) + " (" +
                   lib->soname() + ")";
    return info;
  }

  Status SetDevice(int device) override { return Check(api_.hipSetDevice(device), "hipSetDevice"); }

  std::optional<MemoryKind> PointerKind(const void* ptr) override {
    HipPointerAttribute attr{};
    if (api_.hipPointerGetAttributes(&attr, ptr) != kHipSuccess) return std::nullopt;  // ROCm 5: unknown host
    // ROCm >= 6: Unregistered 0, Host 1, Device 2, Managed 3; ROCm 5: Host 0, Device 1, Array 2, Unified 3.
    const bool device = major_ >= 6 ? (attr.type == 2 || attr.type == 3) : attr.type == 1;
    const bool host = major_ >= 6 ? attr.type == 1 : attr.type == 0;
    if (device) return MemoryKind{MemoryType::kRocm, attr.device};
    if (host) return MemoryKind{MemoryType::kHost, -1};
    return std::nullopt;
  }

  StatusOr<void*> Malloc(size_t length) override {
    void* p = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.hipMalloc(&p, length), "hipMalloc", ErrorCode::kMemory));
    return p;
  }
  Status Free(void* ptr) override { return Check(api_.hipFree(ptr), "hipFree"); }
  StatusOr<void*> HostMalloc(size_t length) override {
    void* p = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.hipHostMalloc(&p, length, kHipHostMallocPortable | kHipHostMallocMapped),
                             "hipHostMalloc", ErrorCode::kMemory));
    return p;
  }
  Status HostFree(void* ptr) override { return Check(api_.hipHostFree(ptr), "hipHostFree"); }

  bool has_ipc() const override { return true; }
  StatusOr<std::pair<void*, size_t>> AddressRange(const void* ptr) override {
    void* base = nullptr;
    size_t size = 0;
    MC_RETURN_IF_ERROR(
        Check(api_.hipMemGetAddressRange(&base, &size, const_cast<void*>(ptr)), "hipMemGetAddressRange"));
    return std::make_pair(base, size);
  }
  StatusOr<std::string> IpcGetHandle(void* base) override {
    HipIpcMemHandle h;
    MC_RETURN_IF_ERROR(Check(api_.hipIpcGetMemHandle(&h, base), "hipIpcGetMemHandle"));
    return std::string(h.reserved, sizeof(h.reserved));
  }
  StatusOr<void*> IpcOpen(const std::string& handle) override {
    HipIpcMemHandle h;
    if (handle.size() != sizeof(h.reserved)) return InvalidArgument("a HIP IPC handle has 64 bytes");
    memcpy(h.reserved, handle.data(), sizeof(h.reserved));
    void* p = nullptr;
    // hipIpcMemLazyEnablePeerAccess: 0 in ROCm 5's headers, 1 from ROCm 6.
    MC_RETURN_IF_ERROR(Check(api_.hipIpcOpenMemHandle(&p, h, major_ >= 6 ? 1u : 0u), "hipIpcOpenMemHandle"));
    return p;
  }
  Status IpcClose(void* base) override { return Check(api_.hipIpcCloseMemHandle(base), "hipIpcCloseMemHandle"); }

  StatusOr<void*> CreateStream() override {
    void* s = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.hipStreamCreateWithFlags(&s, kHipStreamNonBlocking), "hipStreamCreateWithFlags"));
    return s;
  }
  Status DestroyStream(void* stream) override { return Check(api_.hipStreamDestroy(stream), "hipStreamDestroy"); }
  Status MemcpyAsync(void* dst, const void* src, size_t length, bool, bool, void* stream) override {
    return Check(api_.hipMemcpyAsync(dst, src, length, kHipMemcpyDefault, stream), "hipMemcpyAsync",
                 ErrorCode::kInvalidArgument);
  }
  StatusOr<void*> RecordEvent(void* stream) override {
    void* e = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.hipEventCreateWithFlags(&e, kHipEventBlockingSync | kHipEventDisableTiming), "hipEventCreateWithFlags"));
    hipError_t r = api_.hipEventRecord(e, stream);
    if (r != kHipSuccess) {
      api_.hipEventDestroy(e);
      return Check(r, "hipEventRecord");
    }
    return e;
  }
  StatusOr<bool> QueryEvent(void* event) override {
    hipError_t r = api_.hipEventQuery(event);
    if (r == kHipErrorNotReady) return false;
    MC_RETURN_IF_ERROR(Check(r, "hipEventQuery", ErrorCode::kMemory));
    return true;
  }
  Status SynchronizeEvent(void* event) override {
    return Check(api_.hipEventSynchronize(event), "hipEventSynchronize", ErrorCode::kMemory);
  }
  void DestroyEvent(void* event) override { api_.hipEventDestroy(event); }

 private:
  Status Check(hipError_t r, const char* what, ErrorCode code = ErrorCode::kContext) const {
    if (r == kHipSuccess) return Status::Ok();
    const char* name = api_.hipGetErrorName != nullptr ? api_.hipGetErrorName(r) : nullptr;
    const char* text = api_.hipGetErrorString != nullptr ? api_.hipGetErrorString(r) : nullptr;
    return Status(code, std::string(what) + " failed: " + (name ? name : "hipError") + " (" + std::to_string(r) + ")" +
                            (text ? std::string(": ") + text : ""));
  }

  const std::vector<std::string> sonames_;
  HipApi api_{};
  int major_ = 0;
};

std::vector<std::string> DefaultSonames() {
  return {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"};
}

class RocmPlatform final : public gpu::GpuPlatform {
 public:
  RocmPlatform() : RocmPlatform(DefaultSonames()) {}
  explicit RocmPlatform(std::vector<std::string> sonames)
      : GpuPlatform("rocm", MemoryType::kRocm, std::make_unique<HipRuntime>(std::move(sonames))) {}

  // dma-buf export on ROCm is an HSA call (hsa_amd_portable_export_dmabuf); this platform loads HIP only.
  StatusOr<DmabufExport> ExportDmabuf(const void* /*ptr*/, size_t /*length*/) override {
    PlatformProbe probe = Probe();
    if (!probe.usable) return Status(ErrorCode::kDeviceNotFound, "rocm platform unusable: " + probe.reason);
    return Status(ErrorCode::kNotImplemented,
                  "rocm: dma-buf export needs hsa_amd_portable_export_dmabuf (libhsa-runtime64), which this "
                  "platform does not load (it loads HIP only); ROCm memory reaches RDMA NICs through peer memory");
  }
};

}  // namespace

MC_PLATFORM_PLUGIN("rocm", RocmPlatform, nullptr);

std::shared_ptr<Platform> MakeRocmPlatform() { return std::make_shared<RocmPlatform>(); }
std::shared_ptr<Platform> MakeRocmPlatform(std::vector<std::string> sonames) {
  return std::make_shared<RocmPlatform>(std::move(sonames));
}

}  // namespace mooncake::te
