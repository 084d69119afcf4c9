#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_EMULATION_HANDLE_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_EMULATION_HANDLE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "transfer_engine/api/status.h"

namespace mooncake::te::host_emulation {

/// What an exported host-emulation IPC handle says: the owner's memfd (its fd number in the owner process and
/// the allocation's serial, which is part of the memfd's name, so a reused fd number is detected), the exported
/// range inside it, and the emulated device it belongs to. Text form (printable, no spaces):
///   "mc-host-emulation-ipc:v1:<pid>:<fd>:<serial>:<offset>:<length>:<device>"
struct EmulationHandle {
  int pid = 0;          ///< owner process
  int fd = -1;          ///< the owner's memfd, valid in the owner only
  uint64_t serial = 0;  ///< the allocation's number in the owner (memfd name: MemfdName(device, serial))
  uint64_t offset = 0;  ///< start of the exported range inside the memfd
  uint64_t length = 0;  ///< bytes exported (> 0)
  int device = 0;       ///< emulated device ordinal

  std::string Encode() const;
  /// kInvalidArgument naming what is wrong for anything Encode does not produce (other platforms' handles,
  /// truncated or non-numeric fields, zero length, offset + length overflowing).
  static StatusOr<EmulationHandle> Decode(std::string_view text);
};

/// The memfd name of allocation `serial` on emulated device `device` of memory type `type` ("cuda", "rocm"):
/// "mc-host-emulation-<type><device>-<serial>" (/proc shows it as "/memfd:<name> (deleted)").
std::string MemfdName(const std::string& type, int device, uint64_t serial);

/// Where the emulation keeps fabric allocations: named files in this directory, which every "host" of this
/// machine (network and PID namespaces, one mount namespace) opens by name.
inline constexpr const char kFabricDir[] = "/dev/shm";
/// The prefix of their names; a name is the prefix plus [0-9a-z-] only.
inline constexpr const char kFabricPrefix[] = "mc-emu-fabric-";

/// What an exported host-emulation fabric handle says: the shared file (its name under kFabricDir), the memory
/// type of the exporting platform, the exported range in the file and the device. Text form:
///   "mc-host-emulation-fabric:v1:<type>:<name>:<offset>:<length>:<device>"
struct EmulationFabricHandle {
  std::string type;  ///< "cuda", "rocm"
  std::string name;  ///< kFabricPrefix + [0-9a-z-]+ (never a path)
  uint64_t offset = 0;
  uint64_t length = 0;  ///< > 0
  int device = 0;

  std::string Encode() const;
  /// kInvalidArgument for anything Encode does not produce (a name with a '/' or '.', another prefix, zero
  /// length, offset + length overflowing).
  static StatusOr<EmulationFabricHandle> Decode(std::string_view text);
};

}  // namespace mooncake::te::host_emulation

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_HOST_EMULATION_EMULATION_HANDLE_H_
