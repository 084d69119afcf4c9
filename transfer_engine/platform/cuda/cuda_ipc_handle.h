#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_IPC_HANDLE_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_IPC_HANDLE_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "transfer_engine/api/status.h"

namespace mooncake::te::cuda {

/// What the cuda platform's ExportIpc hands out, in one of two forms:
/// - kLegacy: a cuIpcGetMemHandle handle (64 bytes) of the allocation containing the range; the importer
///   opens it with cuIpcOpenMemHandle and adds `offset`.
///     "mc-cuda-ipc:v1:legacy:<pid>:<device>:<offset>:<length>:<128 hex digits>"
/// - kPosixFd: a VMM allocation exported as a POSIX file descriptor (number `fd` in the owner); the importer
///   takes the fd with pidfd_getfd (or /proc/<pid>/fd), imports it, and maps `allocation_size` bytes.
///   `allocation_id` names the allocation among all of the owner's (fd numbers are reused once freed).
///     "mc-cuda-ipc:v1:fd:<pid>:<device>:<offset>:<length>:<fd>:<allocation_size>:<allocation_id>"
/// - kFabric (ExportFabric, not ExportIpc): a VMM allocation's CU_MEM_HANDLE_TYPE_FABRIC handle (64 bytes), which
///   processes of other hosts of the NVLink domain import (cuMemImportFromShareableHandle) and map
///   `allocation_size` bytes of; `pid` is the exporter's (for messages only).
///     "mc-cuda-ipc:v1:fabric:<pid>:<device>:<offset>:<length>:<allocation_size>:<128 hex digits>"
/// `offset` is the range's start inside the allocation; `device` the owner's ordinal.
struct CudaIpcHandle {
  enum class Kind { kLegacy, kPosixFd, kFabric };
  Kind kind = Kind::kLegacy;
  int pid = 0;
  int device = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::array<uint8_t, 64> legacy{};  ///< kLegacy: the CUipcMemHandle bytes; kFabric: the CUmemFabricHandle's
  int fd = -1;                       ///< kPosixFd
  uint64_t allocation_size = 0;      ///< kPosixFd, kFabric: bytes of the whole allocation (granularity-aligned)
  uint64_t allocation_id = 0;        ///< kPosixFd: unique among the owner process's allocations

  std::string Encode() const;
  /// kInvalidArgument naming the problem for anything Encode does not produce, or when offset + length
  /// overflows or (kPosixFd, kFabric) runs past allocation_size.
  static StatusOr<CudaIpcHandle> Decode(std::string_view text);
};

}  // namespace mooncake::te::cuda

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_IPC_HANDLE_H_
