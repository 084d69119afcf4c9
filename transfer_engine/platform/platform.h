#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_PLATFORM_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_PLATFORM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

/// What kind of memory a range is. Transports declare which (local, remote) pairs they move; the engine
/// classifies every registration through the platform layer.
enum class MemoryType : uint8_t { kHost = 0, kCuda, kRocm, kNpu, kMusa, kFile, kCxl };

/// A memory kind and, for accelerator memory, its device ordinal. Text form: "host", "cuda:0", "rocm:1",
/// "npu:0", "musa:0", "file", "cxl" (Mooncake's "cpu:N" locations are host memory on NUMA node N).
struct MemoryKind {
  MemoryType type = MemoryType::kHost;
  int device = -1;  ///< accelerator ordinal; -1 for host, file and cxl

  /// "cuda:0", "host", ... A device type with a negative ordinal (not a valid kind) prints as "cuda:-1", which
  /// Parse rejects.
  std::string ToString() const;
  /// Exact, lower-case text, no spaces; ordinals are decimal digits. "cpu:N" forgets N (host memory).
  /// Accepts the text forms above plus Mooncake locations ("cpu:N", "*": host; "cuda:N", "npu:N", ...).
  /// kInvalidArgument for anything else.
  static StatusOr<MemoryKind> Parse(std::string_view text);
  bool is_device() const { return type != MemoryType::kHost && type != MemoryType::kFile && type != MemoryType::kCxl; }
  bool operator==(const MemoryKind& o) const { return type == o.type && device == o.device; }
  bool operator!=(const MemoryKind& o) const { return !(*this == o); }
};
const char* MemoryTypeName(MemoryType t);

/// What a platform found on this host.
struct PlatformProbe {
  bool usable = false;
  std::string reason;   ///< why not usable ("libcuda.so.1: cannot open shared object file", "no device"), or a summary
  int device_count = 0;
};

/// How memory is allocated by Platform::Allocate.
enum class AllocationKind : uint8_t {
  kPinnedHost = 0,  ///< page-locked host memory the device can DMA into
  kDevice,          ///< plain device memory
  kShareable,       ///< device memory exportable to other processes (VMM with a shareable handle)
  kFabric,          ///< device memory exportable to processes of other hosts of one NVLink domain (ExportFabric)
};

/// How an ImportFabric mapping may be accessed by this process's devices.
enum class FabricAccess : uint8_t { kReadWrite = 0, kReadOnly };

/// A dma-buf exported by Platform::ExportDmabuf: `fd` is a dma-buf file descriptor of this process whose byte
/// `offset` is the first byte of the exported range (the dma-buf may start before it and end after it, rounded
/// to pages).
struct DmabufExport {
  int fd = -1;
  uint64_t offset = 0;
};

/// Where a device sits on this host: its NUMA node and PCI address, as far as known.
struct DeviceLocality {
  int numa_node = -1;      ///< -1: unknown (no NUMA, or the platform cannot tell)
  std::string pci_bus_id;  ///< "0000:3b:00.0" (domain:bus:device.function, lower-case hex); empty: unknown
};

/// A copy started by Platform::CopyAsync. Wait blocks until done; thread-safe.
class CopyCompletion {
 public:
  virtual ~CopyCompletion() = default;
  /// True once the copy has finished (successfully or not).
  virtual bool Done() = 0;
  /// Blocks until finished; the copy's outcome.
  virtual Status Wait() = 0;
};

/// One accelerator family (or the host). Implementations live in platform/<name>/, load their vendor library at
/// run time (dlopen of a list of sonames) and are never linked by the core. Every method is thread-safe and
/// returns an error (never crashes) when the platform is unusable.
class Platform {
 public:
  virtual ~Platform() = default;
  /// "cpu", "cuda", "rocm", "ascend", "musa", "host_emulation".
  virtual std::string name() const = 0;
  /// The memory type of this platform's devices (kHost for cpu).
  virtual MemoryType device_type() const = 0;
  /// Loads the vendor library and counts devices; cheap after the first call.
  virtual PlatformProbe Probe() = 0;

  /// The kind of the memory at `ptr` when it belongs to this platform (device memory, or host memory the
  /// platform allocated); nullopt otherwise (including when the platform is unusable).
  virtual std::optional<MemoryKind> Classify(const void* ptr) = 0;

  virtual StatusOr<void*> Allocate(size_t length, AllocationKind kind, int device) = 0;
  virtual Status Free(void* ptr, size_t length, AllocationKind kind) = 0;

  /// An opaque handle other processes of this host pass to ImportIpc to map [ptr, ptr+length) (which must lie in
  /// one allocation of this platform). kNotImplemented where the platform has no IPC.
  virtual StatusOr<std::string> ExportIpc(void* ptr, size_t length) = 0;
  /// Maps a handle exported by process `owner_pid`; the mapping's local address. CloseIpc undoes it.
  virtual StatusOr<void*> ImportIpc(const std::string& handle, int owner_pid, size_t length) = 0;
  virtual Status CloseIpc(void* mapped, size_t length) = 0;

  /// Copies `length` bytes (either side may be host or this platform's device memory), asynchronously, for
  /// `device` (-1: the device of whichever side is device memory), on `stream`:
  /// - nullptr: a queue (stream) of the platform's own for `device`;
  /// - otherwise the platform's native stream handle (CUstream, hipStream_t, MUstream, aclrtStream) of a stream
  ///   on `device`, owned by the caller, who keeps it alive until the copy has finished. The copy (and the
  ///   completion's event) is enqueued on it, so it is ordered with the stream's other work. Platforms without
  ///   streams (cpu) accept only nullptr; the host emulation takes nullptr or a handle of its CreateStream
  ///   (kInvalidArgument otherwise).
  /// The completion may outlive the platform; dropping it does not cancel the copy. Errors found when starting
  /// are returned; later ones by Wait.
  virtual StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t length, int device,
                                                              void* stream) = 0;
  /// The same on the platform's own stream (stream nullptr). Not virtual: implementations override the form
  /// above (and a derived class that is used by its own type re-exports this one with `using`).
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t length, int device) {
    return CopyAsync(dst, src, length, device, nullptr);
  }

  /// A new stream on `device` (>= 0): its native handle (CUstream, hipStream_t, MUstream, aclrtStream; the host
  /// emulation's own kind), usable as CopyAsync's `stream`. Work on one stream runs in order; work on different
  /// streams may run concurrently, and none of it is ordered with the platform's own stream. Non-blocking where
  /// the platform distinguishes (it does not synchronise with a legacy default stream).
  /// Ownership: the caller's, until it passes the handle to DestroyStream, which it must do before the platform
  /// goes (a platform may leave streams still alive then unreleased). Thread-safe; may be called on any thread.
  /// Errors: kNotImplemented where the platform has no streams (cpu, and these defaults: callers then pass
  /// nullptr to CopyAsync);
  /// kDeviceNotFound for a device this process does not have or an unusable platform; the vendor's error else.
  virtual StatusOr<void*> CreateStream(int /*device*/) {
    return Status(ErrorCode::kNotImplemented, name() + " platform has no streams (copies take a null stream)");
  }
  /// Releases a stream CreateStream returned. Work already enqueued on it is not cancelled: it completes (and
  /// its completions report it) whether DestroyStream returns at once or blocks until it has (platform's
  /// choice). The handle is invalid afterwards. kInvalidArgument (nothing released) for a handle this platform
  /// did not create or already destroyed. Thread-safe, but not concurrently with a CopyAsync on the same stream.
  virtual Status DestroyStream(void* /*stream*/) {
    return Status(ErrorCode::kNotImplemented, name() + " platform has no streams");
  }

  /// A dma-buf for [ptr, ptr+length), which must lie in one device allocation of this platform, for RDMA NICs
  /// to register (ibv_reg_dmabuf_mr) without a peer-memory kernel module.
  /// Ownership: the returned fd is the caller's, who closes it; closing it does not free or unmap the memory,
  /// and a NIC registration made from it keeps its own reference to the dma-buf. The dma-buf stays valid while
  /// the allocation lives (the caller must not use it past the allocation's Free).
  /// Thread-safe; may be called on any thread (the calling thread's current context, if any, is kept).
  /// Errors (nothing is leaked): kInvalidArgument for a null pointer, zero length, or a range that is not in one
  /// device allocation; kNotImplemented where the platform or its driver cannot export dma-bufs (these
  /// defaults, a driver without the entry point, a device without dma-buf support), with the reason;
  /// kDeviceNotFound for an unusable platform; the vendor's error else.
  virtual StatusOr<DmabufExport> ExportDmabuf(const void* /*ptr*/, size_t /*length*/) {
    return Status(ErrorCode::kNotImplemented, name() + " platform cannot export dma-bufs");
  }

  /// A fabric handle of [ptr, ptr+length), which must lie in one AllocationKind::kFabric allocation of this
  /// platform, that processes of other hosts of the same NVLink domain (multi-node NVLink through NVSwitches)
  /// map with ImportFabric. Opaque text; valid while the allocation lives.
  /// Errors: kNotImplemented "fabric handles unsupported: <reason>" where the platform, driver or device cannot
  /// (these defaults; a device without fabric handle support, no IMEX channel); kInvalidArgument for a range
  /// that is not in one fabric allocation; kDeviceNotFound for an unusable platform. Thread-safe.
  virtual StatusOr<std::string> ExportFabric(void* /*ptr*/, size_t /*length*/) {
    return Status(ErrorCode::kNotImplemented, "fabric handles unsupported: " + name() + " platform has none");
  }
  /// Maps the first `length` bytes of a handle ExportFabric made (in any process of the domain, this one
  /// included); the mapping's local address, device memory of this platform, accessible to this process's
  /// devices with `access`: kReadWrite, or kReadOnly (a write through the mapping faults; CUDA:
  /// CU_MEM_ACCESS_FLAGS_PROT_READ; the host emulation: a PROT_READ mapping). Imports of one allocation with
  /// different access are separate mappings. The mapping keeps the memory alive after the exporter frees it.
  /// CloseFabric undoes one import.
  /// Errors: as ExportFabric's, and kInvalidArgument for a handle that is malformed, of another platform, or
  /// shorter than `length`; kNotFound when the exported memory is gone. Thread-safe.
  virtual StatusOr<void*> ImportFabric(const std::string& /*handle*/, size_t /*length*/, FabricAccess /*access*/) {
    return Status(ErrorCode::kNotImplemented, "fabric handles unsupported: " + name() + " platform has none");
  }
  /// ImportFabric read-write. Not virtual (implementations override the form above and re-export this one with
  /// `using`).
  StatusOr<void*> ImportFabric(const std::string& handle, size_t length) {
    return ImportFabric(handle, length, FabricAccess::kReadWrite);
  }
  /// Unmaps an ImportFabric mapping (`length` as imported); kInvalidArgument for anything else.
  virtual Status CloseFabric(void* /*mapped*/, size_t /*length*/) {
    return Status(ErrorCode::kNotImplemented, "fabric handles unsupported: " + name() + " platform has none");
  }

  /// The NUMA node and PCI address of device `device` (an ordinal of this platform). Fields the platform cannot
  /// tell stay unknown (-1 / empty); that is not an error. Cheap after the first call for a device; thread-safe.
  /// Errors: kDeviceNotFound for a device this process does not have or an unusable platform; kNotImplemented
  /// where the platform has no devices (these defaults: cpu).
  virtual StatusOr<DeviceLocality> Locality(int /*device*/) {
    return Status(ErrorCode::kNotImplemented, name() + " platform has no devices with a locality");
  }
};

/// The process-wide set of platforms: "cpu" always; others registered statically (alwayslink) or by plugins.
/// Thread-safe. Platforms are shared: a platform removed or replaced stays alive while someone holds it.
class PlatformRegistry {
 public:
  /// The registry (created on first use, never destroyed, so static registrars and destructors may use it).
  static PlatformRegistry& Get();
  /// Adds `platform`; one already registered under the same name() is replaced (same position). Null: ignored.
  void Register(std::shared_ptr<Platform> platform);
  /// Removes the platform named `name` (tests); false when none. "cpu" cannot be removed.
  bool Unregister(const std::string& name);
  /// Registration order; "cpu" first.
  std::vector<std::shared_ptr<Platform>> All() const;
  std::shared_ptr<Platform> Find(const std::string& name) const;
  /// The first registered platform whose memory type is `type` and which is usable (host: "cpu"); null when
  /// none. Probes outside the registry lock.
  std::shared_ptr<Platform> ForType(MemoryType type) const;
  /// Asks every usable non-host platform in registration order; host (NUMA node unknown) when none claims the
  /// pointer (also for null).
  MemoryKind Classify(const void* ptr) const;
  /// The first usable platform of memory type `type` that classifies `ptr` as its device memory (the one that
  /// can export it, e.g. with ExportDmabuf); null when none (also for host types).
  std::shared_ptr<Platform> OwnerOf(const void* ptr, MemoryType type) const;
  /// The locality of device memory kind `kind` (ForType(kind.type)->Locality(kind.device)): what transports
  /// use to prefer NICs near a device. kInvalidArgument for a host kind; kDeviceNotFound when no usable
  /// platform serves the type; the platform's error else.
  StatusOr<DeviceLocality> Locality(const MemoryKind& kind) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Platform>> platforms_;
  PlatformRegistry();
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_PLATFORM_H_
