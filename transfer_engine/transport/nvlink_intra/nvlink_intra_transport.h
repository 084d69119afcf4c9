#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_TRANSPORT_H_

#include "transfer_engine/transport/device_ipc/device_ipc_transport.h"

namespace mooncake::te::nvlink_intra {

/// Descriptor fields of nvlink_intra's registration epochs (device_ipc::EpochFields::For("nvlink_intra")).
inline constexpr const char kEpochFdField[] = "nvlink_intra_epoch_fd";
inline constexpr const char kEpochSlotField[] = "nvlink_intra_epoch_slot";
inline constexpr const char kEpochField[] = "nvlink_intra_epoch";

/// Same-host CUDA device-to-device transfers through the CUDA platform's IPC (Mooncake's `nvlink_intra`): a
/// DeviceIpcTransport (device_ipc_transport.h) for MemoryType::kCuda with the default hooks: Platform::ExportIpc
/// (a legacy CUDA IPC handle, or a POSIX-fd VMM handle for shareable memory; on the host emulation its memfd),
/// peers of this host_id only, epochs in a memfd read through /proc. Settings MC_NVLINK_INTRA_*;
/// allocate_managed_buffer gives AllocationKind::kShareable (VMM with a POSIX-fd handle on CUDA).
class NvlinkIntraTransport final : public device_ipc::DeviceIpcTransport {
 public:
  NvlinkIntraTransport();
};

}  // namespace mooncake::te::nvlink_intra

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_TRANSPORT_H_
