#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_DEVICE_IPC_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_DEVICE_IPC_TRANSPORT_H_

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transfer_engine/platform/stream_pool.h"
#include "transfer_engine/transport/device_ipc/device_ipc_config.h"
#include "transfer_engine/transport/device_ipc/epoch_page.h"
#include "transfer_engine/transport/device_ipc/ipc_cache.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::device_ipc {

/// What distinguishes one device-IPC transport from another (nvlink_intra, hip, nvlink).
struct DeviceIpcSpec {
  std::string name;         ///< transport name; its descriptor fields are "<name>_platform", "<name>_epoch..."
  std::string env_prefix;   ///< of its settings (DeviceIpcConfig): "MC_NVLINK_INTRA"
  MemoryType memory;        ///< the device memory it moves (both sides)
  std::string memory_name;  ///< for messages: "CUDA", "ROCm"
  bool remote_hosts = false;  ///< peers of other hosts (fabric handles); false: this host only
  AllocationKind managed_kind = AllocationKind::kShareable;  ///< what AllocateManaged returns
};

/// Device-to-device transfers between processes through the platform's exported handles (Mooncake's
/// `nvlink_intra`, `hip`, and with fabric hooks `nvlink`): the target exports each registered region of
/// spec.memory (ExportRegion: Platform::ExportIpc by default) and publishes it as the buffer's `shm_name`
/// (upper-case hex); the initiator maps a peer buffer once (IpcCache, per peer instance and buffer, with
/// MakeMappingOps: ImportIpc by default) and copies with CopyAsync on a few streams per device (StreamPool,
/// <P>_STREAMS, created when a region of the device is registered): each copy takes the least busy one. No
/// socket, no staging.
///
/// - Reaches: a peer whose `<name>_platform` names our platform and that PeerInReach accepts (by default the
///   same `host_id`); moves (spec.memory, spec.memory) only.
/// - Without a usable platform of spec.memory in the context it is inert: it declines every region and reaches no
///   peer (a derived class may also make itself inert in StartHooks).
/// - Withdrawn memory: each registered region has its own epoch (LocalEpochs; by default a sealed memfd that
///   same-host peers map read-only, ProcPeerEpochs), which moves on in WithdrawRegion; before the copies of a
///   submission the initiator compares the target buffer's epoch (read once per submission, see below) with the
///   descriptor's and, when it moved, forgets that buffer's mapping and fails the slices with kStaleMetadata /
///   SliceRetry::kRefreshPeer (the engine refetches the descriptor, and a range no longer registered fails with
///   kAddressNotRegistered). Copies into the peer's other buffers go on untouched. An unregistration racing the
///   submission or the copy itself is not caught.
/// - Mappings: at most <P>_MAX_MAPPINGS peer buffers stay mapped (least recently used first; one an in-flight
///   copy holds is never unmapped); all of a peer's are dropped on ForgetPeer, one when its handle changes.
/// - allocate_managed_buffer (when this is the preferred protocol): Platform::Allocate(spec.managed_kind) on
///   ManagedDevice(). What the engine has not freed (FreeManaged) when the transport is destroyed is freed then
///   (after Stop: no copy of this transport runs, and the engine stopped all its transports first).
/// - Epochs are read once per buffer and submission (Submit / SubmitAndDrive call): all its slices into one
///   buffer share the read, which is made after the submission started, so a withdrawal that completed before it
///   fails every one of its slices into that buffer.
///
/// Threading: SubmitAndDrive copies and waits on the caller's thread; Submit starts the copies on the caller's
/// thread and one waiter thread completes the slices in order. The hooks are called from Start (StartHooks,
/// Make*) and from any thread afterwards (ExportRegion, PeerInReach): they must be thread-safe.
class DeviceIpcTransport : public Transport {
 public:
  explicit DeviceIpcTransport(DeviceIpcSpec spec);
  ~DeviceIpcTransport() override;

  std::string name() const override { return spec_.name; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  /// spec.memory regions: exported, `shm_name` = the handle in hex; anything else is declined.
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  /// Moves the region's epoch on (peers see it before their next copy into it; other buffers stay valid).
  void WithdrawRegion(const MemoryRegion& region) override;
  /// Gives up the region's epoch slot.
  void UnregisterRegion(const MemoryRegion& region) override;
  /// `<name>_platform`: the platform's name, and the epoch table's field (only when a platform is usable).
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  StatusOr<void*> AllocateManaged(size_t length, int device) override;
  Status FreeManaged(void* addr, size_t length) override;
  size_t slice_size() const override { return config_.slice_size; }
  /// Per peer segment: bytes, slices, errors, buffers "mapped" now, "imports" made (a mapping made once) and
  /// "epoch_reads" (reads of its epoch table: one per buffer and submission).
  nlohmann::json Stats() const override;

 protected:
  /// After the platform was found: more checks (a derived transport may refuse: return the reason, and the
  /// transport is inert), "" to go on. Default: "".
  virtual std::string StartHooks() { return ""; }
  /// The handle peers map [ptr, ptr+length) with. Default: platform()->ExportIpc.
  virtual StatusOr<std::string> ExportRegion(void* ptr, size_t length);
  /// How peer handles are mapped. Default: IpcMappingOps (ImportIpc / CloseIpc).
  virtual MappingOps MakeMappingOps();
  /// This process's epochs and how peers' are read. Default: a shared memfd table, read through /proc.
  virtual std::unique_ptr<LocalEpochs> MakeLocalEpochs();
  virtual std::unique_ptr<PeerEpochs> MakePeerEpochs();
  /// Adds the field peers find the epoch table by. Default: `<name>_epoch_fd` = the memfd.
  virtual void DescribeEpochs(nlohmann::json& descriptor) const;
  /// Whether `peer` (which names our platform) can be reached. Default: same host_id.
  virtual bool PeerInReach(const SegmentDescriptor& peer) const;
  /// The device AllocateManaged allocates on when the caller names none (device -1). Default: 0.
  virtual int ManagedDevice() const { return 0; }

  const DeviceIpcSpec& spec() const { return spec_; }
  const TransportContext& context() const { return ctx_; }
  const std::shared_ptr<Platform>& platform() const { return platform_; }
  LocalEpochs* local_epochs() const { return epochs_.get(); }
  const EpochFields& epoch_fields() const { return fields_; }

 private:
  struct Copy {
    std::unique_ptr<CopyCompletion> completion;
    Slice* slice;
    std::shared_ptr<PeerMapping> mapping;  // kept mapped until the copy finished
    std::string segment;
  };
  /// Starts the slice's copy, or completes it with the error (false).
  bool StartCopy(const SegmentDescriptor& peer, Slice* s, Copy* out, EpochReads* reads);
  /// StartCopy of each slice; the copies started.
  std::vector<Copy> StartAll(const SegmentDescriptor& peer, const std::vector<Slice*>& slices);
  void Finish(Copy& c, const Status& st);
  void WaitLoop();
  std::string Prefixed(const std::string& message) const { return spec_.name + ": " + message; }

  const DeviceIpcSpec spec_;
  const EpochFields fields_;
  DeviceIpcConfig config_;
  TransportContext ctx_;
  std::shared_ptr<Platform> platform_;  // the platform of spec.memory in the context; null: inert
  std::string inert_why_;
  std::unique_ptr<IpcCache> cache_;
  std::unique_ptr<StreamPool> streams_;  // with platform_
  std::unique_ptr<LocalEpochs> epochs_;
  // A region's epoch slot lives in its registration's state (RegionRegistration::state), not in a map keyed by
  // address: an old registration of an address still draining and a new one of the same address stay apart.
  std::unique_ptr<PeerEpochs> peer_epochs_;

  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  std::deque<Copy> waiting_;
  bool stopping_ = false;
  std::thread waiter_;
  std::map<uintptr_t, size_t> managed_;  // AllocateManaged: address -> length

  struct Counters {
    uint64_t bytes = 0, slices = 0, errors = 0;
  };
  mutable std::mutex stats_mu_;
  std::set<std::string> same_process_direct_;  // peers of this process whose handles do not import (stats_mu_)
  /// Whether [addr, addr+length) is device memory of spec.memory that our platform allocated or mapped (the
  /// check before a direct copy to a peer said to be in this process).
  bool DirectRangeIsOurs(uint64_t addr, uint64_t length) const;
  std::map<std::string, Counters> stats_;  // by peer segment
};

}  // namespace mooncake::te::device_ipc

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_DEVICE_IPC_TRANSPORT_H_
