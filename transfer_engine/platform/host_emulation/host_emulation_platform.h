#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_HOST_EMULATION_PLATFORM_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_HOST_EMULATION_PLATFORM_H_

#include <memory>
#include <vector>

#include "transfer_engine/platform/platform.h"

namespace mooncake::te {

/// The environment variable that enables the registered host emulation ("1"; anything else: disabled).
inline constexpr const char kPlatformEmulationEnv[] = "MC_PLATFORM_EMULATION";
/// Which devices the registered host emulation presents: "cuda" (unset or empty: the default) or "rocm" (memory
/// type kRocm, for the hip transport's tests); any other value leaves it disabled, saying why.
inline constexpr const char kPlatformEmulationDeviceEnv[] = "MC_PLATFORM_EMULATION_DEVICE";

/// An EMULATION of a CUDA (or ROCm) platform on host memory, for tests: name "host_emulation", memory type kCuda
/// (kRocm with MC_PLATFORM_EMULATION_DEVICE=rocm or MakeHostEmulationPlatformOf), so code
/// paths written for device memory (classification, IPC export/import between processes, asynchronous copies
/// with completions) run on machines without a GPU. It is not a GPU: "device" memory is ordinary host memory
/// any CPU code can touch, and nothing is faster for being "on the device".
///
/// - Devices: `device_count` emulated devices, ordinals 0..device_count-1.
/// - Allocate: kDevice and kShareable = a MAP_SHARED mapping of a fresh memfd (named
///   "mc-host-emulation-<cuda|rocm><N>-<serial>") that the platform keeps open until Free; kFabric = a MAP_SHARED
///   mapping of a new file /dev/shm/mc-emu-fabric-<pidns>-<pid>-<serial>-<random> (mode 0600), unlinked at Free (a
///   process that dies first leaves it behind, and the next process of its PID namespace to allocate one removes
///   it: common/shm_names.h); kPinnedHost = a private anonymous mapping. Zero-filled.
/// - Classify: "<cuda|rocm>:<device>" for its device allocations and for ranges it imported; host for its pinned
///   allocations; nullopt otherwise.
/// - ExportIpc: the memfd's fd number in this process + offset + length + device (see emulation_handle.h);
///   valid while the allocation lives. ImportIpc (any process of this host allowed to read the owner's fds:
///   same user or root) gets the fd with pidfd_getfd, else through /proc/<pid>/fd/<fd>, checks that it is an
///   emulation memfd large enough, and maps it MAP_SHARED; CloseIpc unmaps it. The mapping stays valid after
///   the owner frees its allocation or exits (the memory lives until the last mapping goes).
/// - CopyAsync: runs on a worker thread, in submission order per stream (a copy starts after every copy submitted
///   to the same stream before it has finished, whether or not anyone waits for those); the completion reports
///   the copy's Status. The copy goes through CheckedCopy, so an unmapped or read-only range is an error, not a
///   crash. `stream` null: the platform's own worker; otherwise a stream of CreateStream (kInvalidArgument for
///   any other handle, or when `device` is neither -1 nor the stream's device).
/// - Streams: CreateStream(device) starts a worker thread of its own (with its first copy), so copies on
///   different streams really run concurrently (one blocked copy holds back only its own stream); its handle is
///   an opaque address of this process. DestroyStream runs the copies already queued on it, then ends its thread
///   (it blocks until they have run).
///
/// - ExportFabric (kFabric allocations only; ExportIpc refuses them): the file's name, the range and the device
///   (emulation_handle.h). ImportFabric, in any process of this machine that may open the file (same user),
///   whatever its network or PID namespace (so across the "hosts" of multi-host tests), opens it by name and maps
///   it (PROT_READ for FabricAccess::kReadOnly, opened O_RDONLY); CloseFabric unmaps. An import made before the owner's Free stays valid; one after it fails (kNotFound).
///   Handles of the other memory type are refused. Stands in for CUDA fabric handles (multi-node NVLink).
/// - ExportDmabuf: for a range of one of its device allocations, a dup of the allocation's memfd (the
///   emulation's stand-in for a dma-buf; the caller closes it) and the range's offset in it; kInvalidArgument
///   for anything else (pinned host memory, IPC imports, ranges past the allocation).
/// - Locality: as configured at creation (MakeHostEmulationPlatform's `locality`), else unknown (-1, "").
///
/// Enabling: never silently. The instance the library registers (linked in, or loaded as a plugin) is enabled
/// only when MC_PLATFORM_EMULATION=1 when it is created; otherwise its Probe says unusable (so the registry
/// neither classifies with it nor returns it from ForType) and every call fails with kDeviceNotFound saying how
/// to enable it. An instance made here is enabled (tests register it with PlatformRegistry::Register, which
/// replaces the disabled one).
/// Thread-safe. Destruction runs the copies already queued, then unmaps what is still allocated or imported.
std::shared_ptr<Platform> MakeHostEmulationPlatform(int device_count = 2);
/// The same, with device i's Locality answered by locality[i] (devices beyond the vector: unknown).
std::shared_ptr<Platform> MakeHostEmulationPlatform(int device_count, std::vector<DeviceLocality> locality);

/// An enabled emulation of `type` devices (kCuda or kRocm; null for any other type).
std::shared_ptr<Platform> MakeHostEmulationPlatformOf(MemoryType type, int device_count = 2);

/// Whether MC_PLATFORM_EMULATION=1.
bool HostEmulationRequestedByEnv();

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_HOST_EMULATION_PLATFORM_H_
