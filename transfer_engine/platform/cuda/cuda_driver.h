#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_DRIVER_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_DRIVER_H_

// The CUDA driver API as a function table, filled at run time: dlopen of the driver library, dlsym of
// cuGetProcAddress_v2 (cuGetProcAddress on drivers older than 12.0) only, and every other entry point through
// it at the ABI version named in its PFN type (cudaTypedefs.h), so one build serves CUDA 12 and 13 drivers
// whichever headers it was compiled with. Nothing links libcuda.

#include <cuda.h>
#include <cudaTypedefs.h>

#include <memory>
#include <string>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te::cuda {

/// The entry points the platform uses, each at a fixed ABI version.
struct DriverApi {
  PFN_cuInit_v2000 cuInit = nullptr;
  PFN_cuDriverGetVersion_v2020 cuDriverGetVersion = nullptr;
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 cuGetErrorString = nullptr;
  PFN_cuDeviceGetCount_v2000 cuDeviceGetCount = nullptr;
  PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain = nullptr;
  PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent = nullptr;
  PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent = nullptr;
  PFN_cuPointerGetAttribute_v4000 cuPointerGetAttribute = nullptr;
  PFN_cuPointerGetAttributes_v7000 cuPointerGetAttributes = nullptr;
  PFN_cuMemGetAddressRange_v3020 cuMemGetAddressRange = nullptr;
  PFN_cuMemAlloc_v3020 cuMemAlloc = nullptr;
  PFN_cuMemFree_v3020 cuMemFree = nullptr;
  PFN_cuMemHostAlloc_v2020 cuMemHostAlloc = nullptr;
  PFN_cuMemFreeHost_v2000 cuMemFreeHost = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 cuMemExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle = nullptr;
  PFN_cuIpcGetMemHandle_v4010 cuIpcGetMemHandle = nullptr;
  PFN_cuIpcOpenMemHandle_v11000 cuIpcOpenMemHandle = nullptr;
  PFN_cuIpcCloseMemHandle_v4010 cuIpcCloseMemHandle = nullptr;
  PFN_cuMemcpyAsync_v4000 cuMemcpyAsync = nullptr;
  PFN_cuStreamCreate_v2000 cuStreamCreate = nullptr;
  PFN_cuStreamDestroy_v4000 cuStreamDestroy = nullptr;
  PFN_cuStreamSynchronize_v2000 cuStreamSynchronize = nullptr;
  PFN_cuEventCreate_v2000 cuEventCreate = nullptr;
  PFN_cuEventRecord_v2000 cuEventRecord = nullptr;
  PFN_cuEventQuery_v2000 cuEventQuery = nullptr;
  PFN_cuEventSynchronize_v2000 cuEventSynchronize = nullptr;
  PFN_cuEventDestroy_v4000 cuEventDestroy = nullptr;
  // Optional entry points: null when the driver lacks them (Load does not fail); callers check.
  PFN_cuMemGetHandleForAddressRange_v11070 cuMemGetHandleForAddressRange = nullptr;  ///< dma-buf export (11.7+)
};

/// The default sonames, in the order tried.
std::vector<std::string> DefaultDriverSonames();

/// A loaded driver: the library stays loaded for the life of the process (never dlclose'd: other code may hold
/// pointers into it); a Load that fails dlcloses what it opened. Immutable after Load; thread-safe.
class Driver {
 public:
  /// dlopens the first of `sonames` that loads (RTLD_NOW | RTLD_LOCAL) and resolves the table. Errors
  /// (kDeviceNotFound) say exactly why: the dlerror() text of the first soname ("libcuda.so.1: cannot open
  /// shared object file: No such file or directory"), a missing cuGetProcAddress, or the first entry point the
  /// driver does not provide (the optional ones of DriverApi excepted: they stay null). Does not call cuInit.
  static StatusOr<std::shared_ptr<const Driver>> Load(const std::vector<std::string>& sonames);

  const DriverApi& api() const { return api_; }
  /// The soname that loaded.
  const std::string& soname() const { return soname_; }
  /// "CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected".
  std::string ErrorText(CUresult r) const;
  /// Ok, or `code` with "<what> failed: <ErrorText>".
  Status Check(CUresult r, const std::string& what, ErrorCode code = ErrorCode::kContext) const;

 private:
  DriverApi api_;
  std::string soname_;
};

}  // namespace mooncake::te::cuda

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_DRIVER_H_
