#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_TRANSPORT_H_

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
#include "transfer_engine/transport/nvlink_intra/epoch_page.h"
#include "transfer_engine/transport/nvlink_intra/ipc_cache.h"
#include "transfer_engine/transport/nvlink_intra/nvlink_intra_config.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::nvlink_intra {

/// Same-host device-to-device transfers through the CUDA platform's IPC (Mooncake's `nvlink_intra`): the target
/// exports each registered CUDA region (Platform::ExportIpc: a legacy CUDA IPC handle, or a POSIX-fd VMM handle
/// for shareable memory; on the host emulation its memfd) and publishes it as the buffer's `shm_name` (upper-case
/// hex); the initiator maps a peer buffer once (ImportIpc, cached per peer instance and buffer; IpcCache) and copies
/// with CopyAsync on a few streams per device (StreamPool, MC_NVLINK_INTRA_STREAMS, created when a region of the
/// device is registered): each copy takes the least busy one, so unrelated transfers run concurrently. No socket,
/// no staging.
///
/// - Reaches: peers with this host's `host_id` whose descriptor names the same IPC platform
///   (`nvlink_intra_platform`: "cuda", or "host_emulation" in tests); moves (cuda, cuda) only.
/// - Without a usable CUDA platform in the context (no driver, emulation off) it is inert: it declines every region
///   and reaches no peer (the plugin's probe already says unusable unless libcuda.so.1 loads or
///   MC_PLATFORM_EMULATION=1).
/// - Mappings are dropped on ForgetPeer (the engine calls it when it refreshes the peer's descriptor, e.g. after the
///   peer unregistered memory) and when a buffer's handle changes; a copy in flight keeps its mapping alive.
/// - Withdrawn memory: each registered region has its own epoch in the target's table (epoch_page.h: a sealed
///   memfd peers map read-only; the buffer's entry names its slot and value), which moves on in WithdrawRegion;
///   before each copy the initiator compares the target buffer's epoch with the descriptor's and, when it moved,
///   forgets that buffer's mapping and fails the slice with kStaleMetadata / SliceRetry::kRefreshPeer (the engine
///   refetches the descriptor, and a range no longer registered fails with kAddressNotRegistered). Copies into the
///   peer's other buffers go on untouched. An unregistration racing the copy itself is not caught.
/// - Mappings: at most MC_NVLINK_INTRA_MAX_MAPPINGS peer buffers stay mapped (IpcCache: least recently used first;
///   one an in-flight copy holds is never unmapped).
/// - allocate_managed_buffer (when nvlink_intra is the preferred protocol): shareable device memory
///   (AllocationKind::kShareable: VMM with a POSIX-fd handle on CUDA).
///
/// Threading: SubmitAndDrive copies and waits on the caller's thread; Submit starts the copies on the caller's
/// thread and one waiter thread completes the slices in order.
class NvlinkIntraTransport : public Transport {
 public:
  NvlinkIntraTransport() = default;
  ~NvlinkIntraTransport() override;

  std::string name() const override { return "nvlink_intra"; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  /// CUDA memory: exported, `shm_name` = the handle in hex; anything else is declined.
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  /// Moves the region's epoch on (peers see it before their next copy into it; other buffers stay valid).
  void WithdrawRegion(const MemoryRegion& region) override;
  /// Gives up the region's epoch slot.
  void UnregisterRegion(const MemoryRegion& region) override;
  /// `nvlink_intra_platform`: the IPC platform's name, `nvlink_intra_epoch_fd`: its epoch table (only when a
  /// platform is usable).
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  StatusOr<void*> AllocateManaged(size_t length) override;
  Status FreeManaged(void* addr, size_t length) override;
  size_t slice_size() const override { return config_.slice_size; }
  /// Per peer segment: bytes, slices, errors, buffers "mapped" now and "imports" made (a mapping made once).
  nlohmann::json Stats() const override;

 private:
  struct Copy {
    std::unique_ptr<CopyCompletion> completion;
    Slice* slice;
    std::shared_ptr<PeerMapping> mapping;  // kept mapped until the copy finished
    std::string segment;
  };
  /// Starts the slice's copy, or completes it with the error (false).
  bool StartCopy(const SegmentDescriptor& peer, Slice* s, Copy* out);
  void Finish(Copy& c, const Status& st);
  void WaitLoop();

  NvlinkIntraConfig config_;
  TransportContext ctx_;
  std::shared_ptr<Platform> platform_;  // the CUDA platform of the context; null: inert
  std::string inert_why_;
  std::unique_ptr<IpcCache> cache_;
  std::unique_ptr<StreamPool> streams_;  // with platform_
  std::unique_ptr<LocalEpochs> epochs_;
  // A region's epoch slot lives in its registration's state (RegionRegistration::state), not in a map keyed by
  // address: an old registration of an address still draining and a new one of the same address stay apart.
  PeerEpochs peer_epochs_;

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
  std::map<std::string, Counters> stats_;  // by peer segment
};

}  // namespace mooncake::te::nvlink_intra

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_NVLINK_INTRA_NVLINK_INTRA_TRANSPORT_H_
