#include "transfer_engine/platform/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <type_traits>

namespace mooncake::te::cuda {
namespace {

// cuGetProcAddress at either ABI: v2 (CUDA >= 12.0, reports why a symbol is missing) or v1.
struct ProcAddress {
  PFN_cuGetProcAddress_v12000 v2 = nullptr;
  PFN_cuGetProcAddress_v11030 v1 = nullptr;

  // The entry point `symbol` (base name, e.g. "cuMemAlloc") at ABI `version`; null with `why` set when absent.
  void* Get(const char* symbol, int version, std::string* why) const {
    void* fn = nullptr;
    CUresult r;
    if (v2 != nullptr) {
      CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
      r = v2(symbol, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
      if (r == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS) {
        *why = found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? "the driver's version is too old"
                                                                    : "the driver has no such symbol";
        return nullptr;
      }
    } else {
      r = v1(symbol, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT);
    }
    if (r != CUDA_SUCCESS || fn == nullptr) {
      *why = "cuGetProcAddress returned " + std::to_string(static_cast<int>(r));
      return nullptr;
    }
    return fn;
  }
};

}  // namespace

std::vector<std::string> DefaultDriverSonames() { return {"libcuda.so.1", "libcuda.so"}; }

StatusOr<std::shared_ptr<const Driver>> Driver::Load(const std::vector<std::string>& sonames) {
  if (sonames.empty()) return Status(ErrorCode::kDeviceNotFound, "no CUDA driver library to try");
  void* lib = nullptr;
  std::string first_error;
  std::string loaded;
  for (const auto& name : sonames) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      loaded = name;
      break;
    }
    const char* err = dlerror();
    if (first_error.empty()) first_error = err != nullptr ? err : name + ": cannot be loaded";
  }
  if (lib == nullptr) return Status(ErrorCode::kDeviceNotFound, first_error);

  ProcAddress proc;
  proc.v2 = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
  if (proc.v2 == nullptr) proc.v1 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(dlsym(lib, "cuGetProcAddress"));
  if (proc.v2 == nullptr && proc.v1 == nullptr) {
    dlclose(lib);
    return Status(ErrorCode::kDeviceNotFound,
                  loaded + " has neither cuGetProcAddress_v2 nor cuGetProcAddress (a CUDA driver older than 11.3?)");
  }

  auto driver = std::shared_ptr<Driver>(new Driver());
  driver->soname_ = loaded;
  DriverApi& a = driver->api_;
  std::string missing;
  auto resolve = [&](auto& slot, const char* symbol, int version) {
    if (!missing.empty()) return;
    std::string why;
    void* fn = proc.Get(symbol, version, &why);
    if (fn == nullptr) {
      missing = std::string(symbol) + " (ABI " + std::to_string(version) + "): " + why;
      return;
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(fn);
  };
  resolve(a.cuInit, "cuInit", 2000);
  resolve(a.cuDriverGetVersion, "cuDriverGetVersion", 2020);
  resolve(a.cuGetErrorName, "cuGetErrorName", 6000);
  resolve(a.cuGetErrorString, "cuGetErrorString", 6000);
  resolve(a.cuDeviceGetCount, "cuDeviceGetCount", 2000);
  resolve(a.cuDeviceGet, "cuDeviceGet", 2000);
  resolve(a.cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000);
  resolve(a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000);
  resolve(a.cuCtxSetCurrent, "cuCtxSetCurrent", 4000);
  resolve(a.cuCtxGetCurrent, "cuCtxGetCurrent", 4000);
  resolve(a.cuPointerGetAttribute, "cuPointerGetAttribute", 4000);
  resolve(a.cuPointerGetAttributes, "cuPointerGetAttributes", 7000);
  resolve(a.cuMemGetAddressRange, "cuMemGetAddressRange", 3020);
  resolve(a.cuMemAlloc, "cuMemAlloc", 3020);
  resolve(a.cuMemFree, "cuMemFree", 3020);
  resolve(a.cuMemHostAlloc, "cuMemHostAlloc", 2020);
  resolve(a.cuMemFreeHost, "cuMemFreeHost", 2000);
  resolve(a.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020);
  resolve(a.cuMemCreate, "cuMemCreate", 10020);
  resolve(a.cuMemRelease, "cuMemRelease", 10020);
  resolve(a.cuMemAddressReserve, "cuMemAddressReserve", 10020);
  resolve(a.cuMemAddressFree, "cuMemAddressFree", 10020);
  resolve(a.cuMemMap, "cuMemMap", 10020);
  resolve(a.cuMemUnmap, "cuMemUnmap", 10020);
  resolve(a.cuMemSetAccess, "cuMemSetAccess", 10020);
  resolve(a.cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020);
  resolve(a.cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020);
  resolve(a.cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010);
  resolve(a.cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 11000);
  resolve(a.cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010);
  resolve(a.cuMemcpyAsync, "cuMemcpyAsync", 4000);
  resolve(a.cuStreamCreate, "cuStreamCreate", 2000);
  resolve(a.cuStreamDestroy, "cuStreamDestroy", 4000);
  resolve(a.cuStreamSynchronize, "cuStreamSynchronize", 2000);
  resolve(a.cuEventCreate, "cuEventCreate", 2000);
  resolve(a.cuEventRecord, "cuEventRecord", 2000);
  resolve(a.cuEventQuery, "cuEventQuery", 2000);
  resolve(a.cuEventSynchronize, "cuEventSynchronize", 2000);
  resolve(a.cuEventDestroy, "cuEventDestroy", 4000);
  std::string why_optional;  // an optional entry point the driver lacks stays null
  a.cuMemGetHandleForAddressRange = reinterpret_cast<PFN_cuMemGetHandleForAddressRange_v11070>(
      proc.Get("cuMemGetHandleForAddressRange", 11070, &why_optional));
  if (!missing.empty()) {
    dlclose(lib);
    return Status(ErrorCode::kDeviceNotFound, loaded + " lacks an entry point the platform needs: " + missing);
  }
  return std::shared_ptr<const Driver>(std::move(driver));
}

std::string Driver::ErrorText(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_.cuGetErrorName == nullptr || api_.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (api_.cuGetErrorString == nullptr || api_.cuGetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
  std::string out = name != nullptr ? name : "CUresult";
  out += " (" + std::to_string(static_cast<int>(r)) + ")";
  if (text != nullptr) out += std::string(": ") + text;
  return out;
}

Status Driver::Check(CUresult r, const std::string& what, ErrorCode code) const {
  if (r == CUDA_SUCCESS) return Status::Ok();
  return Status(code, what + " failed: " + ErrorText(r));
}

}  // namespace mooncake::te::cuda
