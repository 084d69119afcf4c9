#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_PLATFORM_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_PLATFORM_H_

#include <memory>
#include <string>
#include <vector>

#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

/// The CUDA platform ("cuda", memory type kCuda) on the driver API, loaded at run time (cuda_driver.h): one
/// build serves CUDA 12 and 13 drivers; nothing links libcuda or libcudart.
///
/// - Probe: loads the driver, cuInit, counts devices; the first call does the work, later calls return the
///   same verdict. Unusable reasons are the exact cause ("libcuda.so.1: cannot open shared object file: No
///   such file or directory", "cuInit failed: CUDA_ERROR_NO_DEVICE (100): ...", "no CUDA device").
/// - Contexts: a call on device d retains d's primary context (once, for the life of the platform) and makes it
///   current while it works; every call returns with the calling thread's current context as it found it
///   (none included).
/// - Classify: cuPointerGetAttributes: device memory (cuMemAlloc, VMM, IPC-mapped, other libraries' too) is
///   "cuda:<ordinal>"; CUDA-pinned or registered host memory is host; anything else nullopt. It never enters,
///   creates or retains a context: where the driver cannot answer without one current, nullopt.
/// - Allocate: kPinnedHost = cuMemHostAlloc (portable, mapped); kDevice = cuMemAlloc; kShareable = cuMemCreate
///   (POSIX-fd handle type, rounded up to the allocation granularity) mapped and made accessible to `device`.
///   Free takes only what Allocate returned, with the same length and kind.
/// - ExportIpc: for kShareable allocations a POSIX-fd handle (the fd is exported once and kept until Free);
///   for any other device memory (also memory this platform did not allocate) a legacy cuIpcGetMemHandle
///   handle of the allocation containing the range (cuda_ipc_handle.h). Pinned host memory: kNotImplemented.
/// - ImportIpc: maps a handle of another process on this host into the handle's device ordinal (device 0 when
///   this process has fewer devices); importing the same exported allocation again shares one mapping
///   (reference-counted). A handle whose range runs past the mapped allocation is refused. A handle exported by this very process cannot be imported (CUDA refuses it).
///   CloseIpc undoes one ImportIpc.
/// - CopyAsync: cuMemcpyAsync, then an event, on `stream` (a CUstream of `device`'s primary context, e.g.
///   torch's current stream; CU_STREAM_LEGACY / CU_STREAM_PER_THREAD name the default streams) or, when it is
///   null, on a per-device stream of the platform; the completion queries / synchronises the event. `device` -1
///   picks the device of whichever side is device memory (else 0); its primary context is current while the
///   copy is enqueued. Its event is created with CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING, so Wait sleeps
///   in cuEventSynchronize instead of spinning.
/// - CreateStream: cuStreamCreate(CU_STREAM_NON_BLOCKING) in `device`'s primary context; DestroyStream:
///   cuStreamDestroy (returns at once; the driver finishes the stream's enqueued work first). Only streams this
///   platform created are accepted (kInvalidArgument otherwise).
/// - ExportDmabuf: cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) of the host pages holding
///   the range (CUDA wants page-aligned ranges; the offset says where the range starts in the dma-buf), in the
///   range's device context. The range must lie in one allocation (cuMemGetAddressRange). kNotImplemented when
///   the driver lacks the entry point (older than 11.7), the device reports no CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
///   or the driver answers CUDA_ERROR_NOT_SUPPORTED.
/// - Locality: the PCI address from cuDeviceGetAttribute (PCI_DOMAIN_ID, PCI_BUS_ID, PCI_DEVICE_ID; function 0)
///   and the NUMA node from <sysfs>/bus/pci/devices/<address>/numa_node (-1 when absent or negative); cached.
/// Thread-safe. Allocations and imports still held when the platform is destroyed are not released (the
/// driver may already be shutting down at exit).
std::shared_ptr<Platform> MakeCudaPlatform();

/// The same, loading the driver from `driver_sonames` (tried in order) instead of libcuda.so.1, libcuda.so.
std::shared_ptr<Platform> MakeCudaPlatform(std::vector<std::string> driver_sonames);

/// The same, with Locality reading PCI devices under `sysfs_root` instead of /sys (tests).
std::shared_ptr<Platform> MakeCudaPlatform(std::vector<std::string> driver_sonames, std::string sysfs_root);

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_PLATFORM_H_
