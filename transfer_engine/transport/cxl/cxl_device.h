#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_DEVICE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_DEVICE_H_

// A CXL memory device (device-DAX /dev/daxX.Y, or any file standing in for one) mapped MAP_SHARED, and the
// small table at its start through which the engines sharing it see each other and carve ranges out of it.
//
// Layout: the first kReservedBytes (2 MiB: one device-DAX alignment unit) hold a header, kMaxEngines engine
// slots (who maps the device: liveness and a registration epoch) and kMaxAllocations allocation entries.
// Everything above is payload. The table is changed only under flock(LOCK_EX) on the device's file (engines of
// one kernel; across physical hosts the allocation must come from one coordinator, see README.md), and every
// change is written back to the device (WriteBack) before the lock is released; readers invalidate first.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te::cxl {

/// What names one device: the random id written into its header when it was formatted (the same for every
/// host that maps it), its size, and on this kernel the path's st_dev/st_ino. Two engines share the device
/// when uuid and size are equal and, on one kernel, dev and ino too (a copy of a formatted file is another
/// device with the same uuid).
struct DeviceIdentity {
  std::string uuid;  ///< 32 hex digits
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
};

/// The process that owns an engine slot or an allocation; `kernel` tells whether pid means anything here.
struct Owner {
  std::string kernel;  ///< KernelId() of the owner's host
  int pid = 0;
  uint64_t pid_start = 0;  ///< ProcessStartTime(pid) there
};
/// This kernel's boot id plus this process's PID namespace: equal on processes that can watch each other's
/// pids (network-namespace "hosts" of one machine included).
std::string KernelId();
Owner ThisProcess();
/// Whether `o` is provably gone: of this kernel, and its process has exited. Owners of other kernels are never
/// provably gone (their entries stay until they free them).
bool OwnerGone(const Owner& o);

/// One allocation of the device.
struct Allocation {
  uint64_t offset = 0;  ///< from the device's start (>= kReservedBytes)
  uint64_t length = 0;
  std::string tag;      ///< the caller's label (e.g. a store client's name), up to 47 bytes
  Owner owner;
};

/// The device mapped into this process. Thread-safe (table changes serialise on the file lock and a mutex).
class CxlDevice {
 public:
  static constexpr uint64_t kReservedBytes = 2 << 20;
  static constexpr uint64_t kAlignment = 2 << 20;  ///< device-DAX mappings and allocations: 2 MiB units
  static constexpr int kMaxEngines = 256;
  static constexpr int kMaxAllocations = 4096;

  /// Opens `path` O_RDWR and maps `size` bytes of it MAP_SHARED (0: the file's size, or for /dev/daxX.Y the
  /// size in /sys/bus/dax/devices/daxX.Y/size). A regular file smaller than `size` is grown (a stand-in);
  /// the table is formatted when the header is not there yet. kInvalidArgument for a size below 4 MiB or not
  /// a multiple of 2 MiB; kDeviceNotFound when the path cannot be opened or mapped (the reason included).
  static StatusOr<std::unique_ptr<CxlDevice>> Open(const std::string& path, uint64_t size);
  ~CxlDevice();
  CxlDevice(const CxlDevice&) = delete;
  CxlDevice& operator=(const CxlDevice&) = delete;

  const std::string& path() const { return path_; }
  char* base() const { return base_; }
  uint64_t size() const { return identity_.size; }
  const DeviceIdentity& identity() const { return identity_; }
  /// Whether [addr, addr+len) lies in this mapping's payload; its offset then.
  bool Contains(uint64_t addr, uint64_t len) const;

  // --- allocations (ranges carved from the payload for whoever asks, e.g. a store client's segment) ---
  /// A free, 2 MiB-aligned range of at least `length` bytes (rounded up), owned by this process, first fit;
  /// entries of owners that are provably gone (OwnerGone) are reclaimed first. kMemory when nothing fits.
  StatusOr<Allocation> Allocate(uint64_t length, const std::string& tag);
  /// Frees the allocation at `offset` that this process owns (kInvalidArgument otherwise).
  Status Free(uint64_t offset);
  /// The live allocations, by offset.
  std::vector<Allocation> Allocations() const;
  /// The live allocation of another process overlapping [offset, offset+len), if any.
  bool OverlapsForeign(uint64_t offset, uint64_t len, Allocation* found) const;

  // --- engine slots (one per engine mapping the device) ---
  /// Claims a slot for engine `instance` (a slot of a provably gone owner is reused). Its epoch starts at 0.
  StatusOr<int> ClaimSlot(const std::string& instance);
  /// Marks the slot closed (peers' next transfers see the engine gone) and frees it.
  void ReleaseSlot(int slot);
  /// Moves the slot's epoch on (its engine withdrew memory: cached descriptors are stale); the new value.
  uint64_t AdvanceEpoch(int slot);
  /// What a peer's slot says now (read from the device, invalidated first).
  struct SlotState {
    bool live = false;
    std::string instance;
    uint64_t epoch = 0;
    Owner owner;
  };
  SlotState ReadSlot(int slot) const;

 private:
  struct Header;
  CxlDevice() = default;
  Header* header() const;
  Status Format();
  /// flock(LOCK_EX) on the file plus mu_: the table's only writers.
  class TableLock;

  std::string path_;
  int fd_ = -1;
  char* base_ = nullptr;
  DeviceIdentity identity_;
  mutable std::mutex mu_;
};

}  // namespace mooncake::te::cxl

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_DEVICE_H_
