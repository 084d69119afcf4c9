#include "transfer_engine/platform/musa/musa_platform.h"

#include <cstdint>
#include <cstring>
#include <mutex>

#include "transfer_engine/platform/gpu/dl_library.h"
#include "transfer_engine/platform/gpu/gpu_platform.h"
#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te {
namespace {

// The MUSA driver ABI this file relies on (musa.h mirrors cuda.h: same shapes and enum values).
using MUresult = int;
using MUdeviceptr = unsigned long long;
constexpr MUresult kMusaSuccess = 0;
constexpr MUresult kMusaErrorNotReady = 600;
constexpr int kPointerAttributeMemoryType = 2, kPointerAttributeDeviceOrdinal = 9;
constexpr unsigned kMemoryTypeHost = 1, kMemoryTypeDevice = 2;
constexpr unsigned kMemHostAllocPortable = 0x1, kMemHostAllocDeviceMap = 0x2;
constexpr unsigned kStreamNonBlocking = 0x1;
constexpr unsigned kEventBlockingSync = 0x1;  // muEventSynchronize sleeps instead of spinning
constexpr unsigned kEventDisableTiming = 0x2;
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;

struct MuIpcMemHandle {
  char reserved[64];
};

struct MusaApi {
  MUresult (*muInit)(unsigned);
  MUresult (*muDriverGetVersion)(int*);
  MUresult (*muDeviceGetCount)(int*);
  MUresult (*muDeviceGet)(int*, int);
  MUresult (*muDevicePrimaryCtxRetain)(void**, int);
  MUresult (*muCtxSetCurrent)(void*);
  MUresult (*muGetErrorName)(MUresult, const char**);
  MUresult (*muGetErrorString)(MUresult, const char**);
  MUresult (*muPointerGetAttribute)(void*, int, MUdeviceptr);
  MUresult (*muMemGetAddressRange)(MUdeviceptr*, size_t*, MUdeviceptr);
  MUresult (*muMemAlloc)(MUdeviceptr*, size_t);
  MUresult (*muMemFree)(MUdeviceptr);
  MUresult (*muMemHostAlloc)(void**, size_t, unsigned);
  MUresult (*muMemFreeHost)(void*);
  MUresult (*muIpcGetMemHandle)(MuIpcMemHandle*, MUdeviceptr);
  MUresult (*muIpcOpenMemHandle)(MUdeviceptr*, MuIpcMemHandle, unsigned);
  MUresult (*muIpcCloseMemHandle)(MUdeviceptr);
  MUresult (*muStreamCreate)(void**, unsigned);
  MUresult (*muStreamDestroy)(void*);
  MUresult (*muMemcpyAsync)(MUdeviceptr, MUdeviceptr, size_t, void*);
  MUresult (*muEventCreate)(void**, unsigned);
  MUresult (*muEventRecord)(void*, void*);
  MUresult (*muEventQuery)(void*);
  MUresult (*muEventSynchronize)(void*);
  MUresult (*muEventDestroy)(void*);
};

MUdeviceptr Dptr(const void* p) { return static_cast<MUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }
void* Ptr(MUdeviceptr d) { return reinterpret_cast<void*>(static_cast<uintptr_t>(d)); }

class MusaRuntime final : public gpu::Runtime {
 public:
  explicit MusaRuntime(std::vector<std::string> sonames) : sonames_(std::move(sonames)) {}

  StatusOr<gpu::RuntimeInfo> Load() override {
    StatusOr<gpu::DlLibrary> lib = gpu::DlLibrary::Open(sonames_, "libmusa.so.*");
    if (!lib.ok()) return lib.status();
    std::string missing;
    lib->Require(&api_.muInit, {"muInit"}, &missing);
    lib->Require(&api_.muDriverGetVersion, {"muDriverGetVersion"}, &missing);
    lib->Require(&api_.muDeviceGetCount, {"muDeviceGetCount"}, &missing);
    lib->Require(&api_.muDeviceGet, {"muDeviceGet"}, &missing);
    lib->Require(&api_.muDevicePrimaryCtxRetain, {"muDevicePrimaryCtxRetain"}, &missing);
    lib->Require(&api_.muCtxSetCurrent, {"muCtxSetCurrent"}, &missing);
    lib->Require(&api_.muGetErrorName, {"muGetErrorName"}, &missing);
    lib->Require(&api_.muGetErrorString, {"muGetErrorString"}, &missing);
    lib->Require(&api_.muPointerGetAttribute, {"muPointerGetAttribute"}, &missing);
    lib->Require(&api_.muMemGetAddressRange, {"muMemGetAddressRange_v2", "muMemGetAddressRange"}, &missing);
    lib->Require(&api_.muMemAlloc, {"muMemAlloc_v2", "muMemAlloc"}, &missing);
    lib->Require(&api_.muMemFree, {"muMemFree_v2", "muMemFree"}, &missing);
    lib->Require(&api_.muMemHostAlloc, {"muMemHostAlloc"}, &missing);
    lib->Require(&api_.muMemFreeHost, {"muMemFreeHost"}, &missing);
    lib->Require(&api_.muIpcGetMemHandle, {"muIpcGetMemHandle"}, &missing);
    lib->Require(&api_.muIpcOpenMemHandle, {"muIpcOpenMemHandle_v2", "muIpcOpenMemHandle"}, &missing);
    lib->Require(&api_.muIpcCloseMemHandle, {"muIpcCloseMemHandle"}, &missing);
    lib->Require(&api_.muStreamCreate, {"muStreamCreate"}, &missing);
    lib->Require(&api_.muStreamDestroy, {"muStreamDestroy_v2", "muStreamDestroy"}, &missing);
    lib->Require(&api_.muMemcpyAsync, {"muMemcpyAsync"}, &missing);
    lib->Require(&api_.muEventCreate, {"muEventCreate"}, &missing);
    lib->Require(&api_.muEventRecord, {"muEventRecord"}, &missing);
    lib->Require(&api_.muEventQuery, {"muEventQuery"}, &missing);
    lib->Require(&api_.muEventSynchronize, {"muEventSynchronize"}, &missing);
    lib->Require(&api_.muEventDestroy, {"muEventDestroy_v2", "muEventDestroy"}, &missing);
    if (!missing.empty()) return Status(ErrorCode::kDeviceNotFound, lib->soname() + " has no " + missing);
    MC_RETURN_IF_ERROR(Check(api_.muInit(0), "muInit", ErrorCode::kDeviceNotFound));
    int version = 0;
    api_.muDriverGetVersion(&version);
    int count = 0;
    MC_RETURN_IF_ERROR(Check(api_.muDeviceGetCount(&count), "muDeviceGetCount", ErrorCode::kDeviceNotFound));
    contexts_.assign(static_cast<size_t>(count > 0 ? count : 0), nullptr);
    gpu::RuntimeInfo info;
    info.device_count = count;
    info.summary = "MUSA driver " + std::to_string(version) + " (" + lib->soname() + ")";
    return info;
  }

  // The device's primary context, made current (retained the first time).
  Status SetDevice(int device) override {
    void* ctx = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ctx = contexts_[static_cast<size_t>(device)];
      if (ctx == nullptr) {
        int dev = 0;
        MC_RETURN_IF_ERROR(Check(api_.muDeviceGet(&dev, device), "muDeviceGet"));
        MC_RETURN_IF_ERROR(Check(api_.muDevicePrimaryCtxRetain(&ctx, dev), "muDevicePrimaryCtxRetain"));
        contexts_[static_cast<size_t>(device)] = ctx;
      }
    }
    return Check(api_.muCtxSetCurrent(ctx), "muCtxSetCurrent");
  }

  std::optional<MemoryKind> PointerKind(const void* ptr) override {
    unsigned type = 0;
    if (api_.muPointerGetAttribute(&type, kPointerAttributeMemoryType, Dptr(ptr)) != kMusaSuccess) {
      return std::nullopt;
    }
    if (type == kMemoryTypeHost) return MemoryKind{MemoryType::kHost, -1};
    if (type != kMemoryTypeDevice) return std::nullopt;
    int ordinal = 0;
    if (api_.muPointerGetAttribute(&ordinal, kPointerAttributeDeviceOrdinal, Dptr(ptr)) != kMusaSuccess) ordinal = 0;
    return MemoryKind{MemoryType::kMusa, ordinal};
  }

  StatusOr<void*> Malloc(size_t length) override {
    MUdeviceptr d = 0;
    MC_RETURN_IF_ERROR(Check(api_.muMemAlloc(&d, length), "muMemAlloc", ErrorCode::kMemory));
    return Ptr(d);
  }
  Status Free(void* ptr) override { return Check(api_.muMemFree(Dptr(ptr)), "muMemFree"); }
  StatusOr<void*> HostMalloc(size_t length) override {
    void* p = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.muMemHostAlloc(&p, length, kMemHostAllocPortable | kMemHostAllocDeviceMap),
                             "muMemHostAlloc", ErrorCode::kMemory));
    return p;
  }
  Status HostFree(void* ptr) override { return Check(api_.muMemFreeHost(ptr), "muMemFreeHost"); }

  bool has_ipc() const override { return true; }
  StatusOr<std::pair<void*, size_t>> AddressRange(const void* ptr) override {
    MUdeviceptr base = 0;
    size_t size = 0;
    MC_RETURN_IF_ERROR(Check(api_.muMemGetAddressRange(&base, &size, Dptr(ptr)), "muMemGetAddressRange"));
    return std::make_pair(Ptr(base), size);
  }
  StatusOr<std::string> IpcGetHandle(void* base) override {
    MuIpcMemHandle h;
    MC_RETURN_IF_ERROR(Check(api_.muIpcGetMemHandle(&h, Dptr(base)), "muIpcGetMemHandle"));
    return std::string(h.reserved, sizeof(h.reserved));
  }
  StatusOr<void*> IpcOpen(const std::string& handle) override {
    MuIpcMemHandle h;
    if (handle.size() != sizeof(h.reserved)) return InvalidArgument("a MUSA IPC handle has 64 bytes");
    memcpy(h.reserved, handle.data(), sizeof(h.reserved));
    MUdeviceptr d = 0;
    MC_RETURN_IF_ERROR(Check(api_.muIpcOpenMemHandle(&d, h, kIpcMemLazyEnablePeerAccess), "muIpcOpenMemHandle"));
    return Ptr(d);
  }
  Status IpcClose(void* base) override { return Check(api_.muIpcCloseMemHandle(Dptr(base)), "muIpcCloseMemHandle"); }

  StatusOr<void*> CreateStream() override {
    void* s = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.muStreamCreate(&s, kStreamNonBlocking), "muStreamCreate"));
    return s;
  }
  Status DestroyStream(void* stream) override { return Check(api_.muStreamDestroy(stream), "muStreamDestroy"); }
  Status MemcpyAsync(void* dst, const void* src, size_t length, bool, bool, void* stream) override {
    return Check(api_.muMemcpyAsync(Dptr(dst), Dptr(src), length, stream), "muMemcpyAsync",
                 ErrorCode::kInvalidArgument);
  }
  StatusOr<void*> RecordEvent(void* stream) override {
    void* e = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.muEventCreate(&e, kEventBlockingSync | kEventDisableTiming), "muEventCreate"));
    MUresult r = api_.muEventRecord(e, stream);
    if (r != kMusaSuccess) {
      api_.muEventDestroy(e);
      return Check(r, "muEventRecord");
    }
    return e;
  }
  StatusOr<bool> QueryEvent(void* event) override {
    MUresult r = api_.muEventQuery(event);
    if (r == kMusaErrorNotReady) return false;
    MC_RETURN_IF_ERROR(Check(r, "muEventQuery", ErrorCode::kMemory));
    return true;
  }
  Status SynchronizeEvent(void* event) override {
    return Check(api_.muEventSynchronize(event), "muEventSynchronize", ErrorCode::kMemory);
  }
  void DestroyEvent(void* event) override { api_.muEventDestroy(event); }

 private:
  Status Check(MUresult r, const char* what, ErrorCode code = ErrorCode::kContext) const {
    if (r == kMusaSuccess) return Status::Ok();
    const char* name = nullptr;
    const char* text = nullptr;
    if (api_.muGetErrorName == nullptr || api_.muGetErrorName(r, &name) != kMusaSuccess) name = nullptr;
    if (api_.muGetErrorString == nullptr || api_.muGetErrorString(r, &text) != kMusaSuccess) text = nullptr;
    return Status(code, std::string(what) + " failed: " + (name ? name : "MUresult") + " (" + std::to_string(r) + ")" +
                            (text ? std::string(": ") + text : ""));
  }

  const std::vector<std::string> sonames_;
  MusaApi api_{};
  std::mutex mu_;
  std::vector<void*> contexts_;
};

class MusaPlatform final : public gpu::GpuPlatform {
 public:
  MusaPlatform() : MusaPlatform(std::vector<std::string>{"libmusa.so.1", "libmusa.so"}) {}
  explicit MusaPlatform(std::vector<std::string> sonames)
      : GpuPlatform("musa", MemoryType::kMusa, std::make_unique<MusaRuntime>(std::move(sonames))) {}
};

}  // namespace

MC_PLATFORM_PLUGIN("musa", MusaPlatform, nullptr);

std::shared_ptr<Platform> MakeMusaPlatform() { return std::make_shared<MusaPlatform>(); }
std::shared_ptr<Platform> MakeMusaPlatform(std::vector<std::string> sonames) {
  return std::make_shared<MusaPlatform>(std::move(sonames));
}

}  // namespace mooncake::te
