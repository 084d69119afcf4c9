#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_NVLINK_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_NVLINK_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "transfer_engine/transport/device_ipc/device_ipc_transport.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::nvlink {

/// Descriptor fields of nvlink (besides the buffers' `shm_name`, `nvlink_epoch_slot`, `nvlink_epoch` and the
/// top-level `nvlink_platform`): the NVLink domain and the fabric handle (hex) of the epoch table.
inline constexpr const char kDomainField[] = "nvlink_domain";
inline constexpr const char kEpochTableField[] = "nvlink_epoch_table";

/// Multi-node NVLink (Mooncake's `nvlink`, MNNVL): CUDA device-to-device transfers between processes of the
/// hosts of one NVLink domain through FABRIC handles: a DeviceIpcTransport (device_ipc_transport.h) for
/// MemoryType::kCuda whose hooks use Platform::ExportFabric / ImportFabric / CloseFabric instead of IPC handles.
///
/// - Domain: option `nvlink.domain` / MC_NVLINK_DOMAIN (any text, the same on every host of the domain); else,
///   at Start, NVML's fabric information for every device of the process (their PCI addresses from
///   Platform::Locality): "<cluster uuid>:<clique id>" (nvml_domain.h; NVML from `nvlink.nvml_library` /
///   MC_NVLINK_NVML_LIBRARY, else libnvidia-ml.so.1, loaded at run time), which must be the same on all of them:
///   GPUs of different domains (or one in none) leave the transport inert, naming both. Without a domain the
///   transport is inert, saying why.
/// - Device: option `nvlink.device` / MC_NVLINK_DEVICE (default 0): where managed buffers and the epoch table
///   are allocated (a process per GPU sets its own).
/// - Reaches: a peer whose `nvlink_domain` equals ours and whose `nvlink_platform` names our platform, on this
///   host or another.
/// - Registration: only memory of an AllocationKind::kFabric allocation exports (cuMemCreate with
///   CU_MEM_HANDLE_TYPE_FABRIC on CUDA; a shared /dev/shm file on the host emulation); other device memory is
///   declined with the platform's reason (tcp staging or nvlink_intra may move it). allocate_managed_buffer
///   with protocol "nvlink" gives kFabric memory.
/// - Start allocates the epoch table (kEpochTableBytes) as fabric memory and exports it; a platform, driver or
///   device that refuses fabric handles (no NVSwitch / IMEX channel) leaves the transport inert with the
///   platform's "fabric handles unsupported: <reason>".
/// - Withdrawn memory: the epochs of device_ipc, kept in that table: a change is copied into it (CopyAsync, then
///   waited) before WithdrawRegion returns; the initiator imports a peer's table once (ImportFabric, read-only)
///   and reads a buffer's slot with an 8-byte CopyAsync once per submission (shared by its slices into it).
/// Thread-safe as DeviceIpcTransport.
class NvlinkTransport final : public device_ipc::DeviceIpcTransport {
 public:
  NvlinkTransport();
  ~NvlinkTransport() override;
  Status Configure(const TransportOptions& options) override;

  /// The epoch table's memory (StartHooks) and where it is published; shared with the epochs' publisher.
  struct Table;

 protected:
  std::string StartHooks() override;
  StatusOr<std::string> ExportRegion(void* ptr, size_t length) override;
  device_ipc::MappingOps MakeMappingOps() override;
  std::unique_ptr<device_ipc::LocalEpochs> MakeLocalEpochs() override;
  std::unique_ptr<device_ipc::PeerEpochs> MakePeerEpochs() override;
  void DescribeEpochs(nlohmann::json& descriptor) const override;
  bool PeerInReach(const SegmentDescriptor& peer) const override;
  int ManagedDevice() const override { return device_; }

 private:
  /// Sets domain_ from NVML; "" when it did, else why not.
  std::string DomainFromNvml();

  std::string domain_;                     // Configure's, or DomainFromNvml's at Start
  int device_ = 0;                         // Configure's: managed buffers and the epoch table
  std::vector<std::string> nvml_sonames_;  // Configure's
  std::shared_ptr<Table> table_;  // set by StartHooks
};

/// The plugin's probe: usable on the host emulation (MC_PLATFORM_EMULATION=1, CUDA devices) or where
/// libcuda.so.1 loads (whether the device and fabric allow fabric handles is known only at Start); otherwise
/// unusable, "no CUDA driver: <why>".
TransportProbe ProbeNvlink();

}  // namespace mooncake::te::nvlink

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_NVLINK_TRANSPORT_H_
