#include "transfer_engine/platform/ascend/ascend_platform.h"

#include <cstdint>

#include "transfer_engine/platform/gpu/dl_library.h"
#include "transfer_engine/platform/gpu/gpu_platform.h"
#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te {
namespace {

// The ACL ABI this file relies on (acl/acl_base.h, acl/acl_rt.h; C linkage).
using aclError = int;
constexpr aclError kAclSuccess = 0;
constexpr aclError kAclErrorRepeatInitialize = 100002;
constexpr int kAclMemMallocHugeFirst = 0;
enum AclMemcpyKind { kHostToHost = 0, kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3 };
constexpr int kAclEventRecordedStatusComplete = 1;  // aclrtEventRecordedStatus (aclrtQueryEventStatus)
constexpr int kAclEventStatusComplete = 0;          // aclrtEventStatus (the older aclrtQueryEvent)
constexpr uint32_t kAclMemLocationHost = 0, kAclMemLocationDevice = 1;

struct AclPtrAttributes {  // aclrtPtrAttributes
  uint32_t location_id;
  uint32_t location_type;  // aclrtMemLocationType
  uint32_t page_size;
  uint32_t rsv[4];
};

struct AclApi {
  aclError (*aclInit)(const char*);
  aclError (*aclrtGetDeviceCount)(uint32_t*);
  aclError (*aclrtSetDevice)(int32_t);
  aclError (*aclrtMalloc)(void**, size_t, int);
  aclError (*aclrtFree)(void*);
  aclError (*aclrtMallocHost)(void**, size_t);
  aclError (*aclrtFreeHost)(void*);
  aclError (*aclrtCreateStream)(void**);
  aclError (*aclrtDestroyStream)(void*);
  aclError (*aclrtMemcpyAsync)(void*, size_t, const void*, size_t, int, void*);
  aclError (*aclrtCreateEvent)(void**);
  aclError (*aclrtRecordEvent)(void*, void*);
  aclError (*aclrtQueryEventStatus)(void*, int*);  // optional (newer CANN)
  aclError (*aclrtQueryEvent)(void*, int*);        // optional (older CANN)
  aclError (*aclrtSynchronizeEvent)(void*);
  aclError (*aclrtDestroyEvent)(void*);
  aclError (*aclrtPointerGetAttributes)(const void*, AclPtrAttributes*);  // optional (CANN 8)
  const char* (*aclGetRecentErrMsg)();                                      // optional
};

class AclRuntime final : public gpu::Runtime {
 public:
  explicit AclRuntime(std::vector<std::string> sonames) : sonames_(std::move(sonames)) {}

  StatusOr<gpu::RuntimeInfo> Load() override {
    StatusOr<gpu::DlLibrary> lib = gpu::DlLibrary::Open(sonames_, "libascendcl.so");
    if (!lib.ok()) return lib.status();
    std::string missing;
    lib->Require(&api_.aclInit, {"aclInit"}, &missing);
    lib->Require(&api_.aclrtGetDeviceCount, {"aclrtGetDeviceCount"}, &missing);
    lib->Require(&api_.aclrtSetDevice, {"aclrtSetDevice"}, &missing);
    lib->Require(&api_.aclrtMalloc, {"aclrtMalloc"}, &missing);
    lib->Require(&api_.aclrtFree, {"aclrtFree"}, &missing);
    lib->Require(&api_.aclrtMallocHost, {"aclrtMallocHost"}, &missing);
    lib->Require(&api_.aclrtFreeHost, {"aclrtFreeHost"}, &missing);
    lib->Require(&api_.aclrtCreateStream, {"aclrtCreateStream"}, &missing);
    lib->Require(&api_.aclrtDestroyStream, {"aclrtDestroyStream"}, &missing);
    lib->Require(&api_.aclrtMemcpyAsync, {"aclrtMemcpyAsync"}, &missing);
    lib->Require(&api_.aclrtCreateEvent, {"aclrtCreateEvent"}, &missing);
    lib->Require(&api_.aclrtRecordEvent, {"aclrtRecordEvent"}, &missing);
    lib->Require(&api_.aclrtSynchronizeEvent, {"aclrtSynchronizeEvent"}, &missing);
    lib->Require(&api_.aclrtDestroyEvent, {"aclrtDestroyEvent"}, &missing);
    if (!lib->Resolve(&api_.aclrtQueryEventStatus, {"aclrtQueryEventStatus"}) &&
        !lib->Resolve(&api_.aclrtQueryEvent, {"aclrtQueryEvent"}) && missing.empty()) {
      missing = "aclrtQueryEventStatus";
    }
    lib->Resolve(&api_.aclrtPointerGetAttributes, {"aclrtPointerGetAttributes"});
    lib->Resolve(&api_.aclGetRecentErrMsg, {"aclGetRecentErrMsg"});
    if (!missing.empty()) return Status(ErrorCode::kDeviceNotFound, lib->soname() + " has no " + missing);
    aclError init = api_.aclInit(nullptr);
    if (init != kAclErrorRepeatInitialize) MC_RETURN_IF_ERROR(Check(init, "aclInit", ErrorCode::kDeviceNotFound));
    uint32_t count = 0;
    MC_RETURN_IF_ERROR(Check(api_.aclrtGetDeviceCount(&count), "aclrtGetDeviceCount", ErrorCode::kDeviceNotFound));
    gpu::RuntimeInfo info;
    info.device_count = static_cast<int>(count);
    info.summary = "CANN ACL runtime (" + lib->soname() + ")";
    return info;
  }

  Status SetDevice(int device) override { return Check(api_.aclrtSetDevice(device), "aclrtSetDevice"); }

  std::optional<MemoryKind> PointerKind(const void* ptr) override {
    if (api_.aclrtPointerGetAttributes == nullptr) return std::nullopt;  // the platform's own records answer
    AclPtrAttributes attr{};
    if (api_.aclrtPointerGetAttributes(ptr, &attr) != kAclSuccess) return std::nullopt;
    if (attr.location_type == kAclMemLocationDevice) {
      return MemoryKind{MemoryType::kNpu, static_cast<int>(attr.location_id)};
    }
    if (attr.location_type == kAclMemLocationHost) return MemoryKind{MemoryType::kHost, -1};
    return std::nullopt;
  }

  StatusOr<void*> Malloc(size_t length) override {
    void* p = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.aclrtMalloc(&p, length, kAclMemMallocHugeFirst), "aclrtMalloc", ErrorCode::kMemory));
    return p;
  }
  Status Free(void* ptr) override { return Check(api_.aclrtFree(ptr), "aclrtFree"); }
  StatusOr<void*> HostMalloc(size_t length) override {
    void* p = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.aclrtMallocHost(&p, length), "aclrtMallocHost", ErrorCode::kMemory));
    return p;
  }
  Status HostFree(void* ptr) override { return Check(api_.aclrtFreeHost(ptr), "aclrtFreeHost"); }

  bool has_ipc() const override { return false; }
  StatusOr<std::pair<void*, size_t>> AddressRange(const void*) override { return NoIpc(); }
  StatusOr<std::string> IpcGetHandle(void*) override { return NoIpc(); }
  StatusOr<void*> IpcOpen(const std::string&) override { return NoIpc(); }
  Status IpcClose(void*) override { return NoIpc(); }

  StatusOr<void*> CreateStream() override {
    void* s = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.aclrtCreateStream(&s), "aclrtCreateStream"));
    return s;
  }
  // ACL wants the stream's tasks finished first: GpuPlatform::DestroyStream waits for them before calling this.
  Status DestroyStream(void* stream) override {
    return Check(api_.aclrtDestroyStream(stream), "aclrtDestroyStream");
  }
  Status MemcpyAsync(void* dst, const void* src, size_t length, bool dst_device, bool src_device,
                     void* stream) override {
    const int kind = dst_device ? (src_device ? kDeviceToDevice : kHostToDevice)
                                : (src_device ? kDeviceToHost : kHostToHost);
    return Check(api_.aclrtMemcpyAsync(dst, length, src, length, kind, stream), "aclrtMemcpyAsync",
                 ErrorCode::kInvalidArgument);
  }
  StatusOr<void*> RecordEvent(void* stream) override {
    void* e = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.aclrtCreateEvent(&e), "aclrtCreateEvent"));
    aclError r = api_.aclrtRecordEvent(e, stream);
    if (r != kAclSuccess) {
      api_.aclrtDestroyEvent(e);
      return Check(r, "aclrtRecordEvent");
    }
    return e;
  }
  StatusOr<bool> QueryEvent(void* event) override {
    int status = -1;
    if (api_.aclrtQueryEventStatus != nullptr) {
      MC_RETURN_IF_ERROR(
          Check(api_.aclrtQueryEventStatus(event, &status), "aclrtQueryEventStatus", ErrorCode::kMemory));
      return status == kAclEventRecordedStatusComplete;
    }
    MC_RETURN_IF_ERROR(Check(api_.aclrtQueryEvent(event, &status), "aclrtQueryEvent", ErrorCode::kMemory));
    return status == kAclEventStatusComplete;
  }
  Status SynchronizeEvent(void* event) override {
    return Check(api_.aclrtSynchronizeEvent(event), "aclrtSynchronizeEvent", ErrorCode::kMemory);
  }
  void DestroyEvent(void* event) override { api_.aclrtDestroyEvent(event); }

 private:
  static Status NoIpc() {
    return Status(ErrorCode::kNotImplemented, "ascend: no IPC handles in this platform (use HCCL / HIXL)");
  }

  Status Check(aclError r, const char* what, ErrorCode code = ErrorCode::kContext) const {
    if (r == kAclSuccess) return Status::Ok();
    const char* msg = api_.aclGetRecentErrMsg != nullptr ? api_.aclGetRecentErrMsg() : nullptr;
    return Status(code, std::string(what) + " failed: aclError " + std::to_string(r) +
                            (msg != nullptr && *msg != '\0' ? std::string(": ") + msg : ""));
  }

  const std::vector<std::string> sonames_;
  AclApi api_{};
};

class AscendPlatform final : public gpu::GpuPlatform {
 public:
  AscendPlatform() : AscendPlatform(std::vector<std::string>{"libascendcl.so"}) {}
  explicit AscendPlatform(std::vector<std::string> sonames)
      : GpuPlatform("ascend", MemoryType::kNpu, std::make_unique<AclRuntime>(std::move(sonames))) {}
};

}  // namespace

MC_PLATFORM_PLUGIN("ascend", AscendPlatform, nullptr);

std::shared_ptr<Platform> MakeAscendPlatform() { return std::make_shared<AscendPlatform>(); }
std::shared_ptr<Platform> MakeAscendPlatform(std::vector<std::string> sonames) {
  return std::make_shared<AscendPlatform>(std::move(sonames));
}

}  // namespace mooncake::te
