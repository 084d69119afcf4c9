#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_SHM_SHM_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_SHM_SHM_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/common/process_watch.h"
#include "transfer_engine/common/work_queue.h"
#include "transfer_engine/transport/shm/parallel_copy.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::shm {

/// Same-host transport: one copy, no socket. A target buffer backed by a memfd (allocate_managed_buffer) is
/// mapped into this process once (/proc/<pid>/fd/<fd>) and copied with memcpy; other registered memory is
/// copied with cross-memory attach (process_vm_readv/writev); a target in this process is a plain memcpy.
/// Reaches only segments with this host's host_id. When the kernel forbids access to a peer (ptrace policy,
/// another user), CanReach says no (logged once per peer) and the engine uses its network transport.
///
/// Trust: the kernel lets only processes with ptrace rights over the target (same user) map or attach its
/// memory. Before each copy the initiator checks the range against the buffers the target published and that
/// the target's registration epoch (a page it shares read-only) still equals the descriptor's, so memory the
/// target unregistered is never touched (short of an unregistration racing the copy itself). Peer state is
/// kept per instance (the descriptor's random id) with a watch on the peer's process (pidfd): before and after
/// each copy the initiator checks that the process still runs, so a copy into the memory of a peer that has
/// exited (mapped here, or a reused pid) never reports success; the peer's mappings are then dropped and the
/// copy fails with kPeerUnreachable. Within one process the registry is checked and pinned directly.
///
/// Threading: SubmitAndDrive copies on the caller's thread; Submit hands the work to MC_SHM_THREADS workers.
/// Either way a large slice is cut into parts copied by that thread together with MC_SHM_COPY_THREADS - 1
/// helpers (default: 2 threads in all, at most the usable CPUs), since one thread's cross-memory attach into
/// 4 KiB pages runs at about two thirds of memcpy (the kernel pins each page; see README.md).
class ShmTransport : public Transport {
 public:
  struct Mapping;  // one mapping of a peer's memfd (defined in the .cc; its background fill uses it)
  ShmTransport();
  ~ShmTransport() override;

  std::string name() const override { return "shm"; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  /// Host memory only (device memory is declined); a region backed by a file descriptor (a memfd) publishes
  /// `shm_fd`/`shm_offset` so peers map it instead of attaching to it.
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  /// Moves the registration epoch on (peers see it before their next copy).
  void WithdrawRegion(const MemoryRegion& region) override;
  /// `epoch` and `epoch_fd`: the registration epoch and the memfd of the page holding it.
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  size_t slice_size() const override { return slice_size_; }
  nlohmann::json Stats() const override;

 private:
  struct Peer {
    std::string name;
    int pid = 0;
    bool usable = true;
    std::string why;  // when not usable
    std::map<int, std::shared_ptr<Mapping>> mappings;  // by the peer's memfd number
    std::shared_ptr<Mapping> epoch;                    // the peer's registration epoch page
    std::unique_ptr<ProcessWatch> process;             // null for this process
    uint64_t bytes = 0, slices = 0, errors = 0, mapped_copies = 0, attach_copies = 0;
    uint64_t parts = 0, helper_parts = 0;  // slices' copy parts, and how many of them helper threads copied
  };

  Peer& PeerFor(const SegmentDescriptor& desc) const;  // mu_ held
  void Copy(const SegmentDescriptor& desc, const std::vector<Slice*>& slices);
  Status CopySlice(const SegmentDescriptor& desc, Slice* s);
  /// CopySlice for a peer in another engine (the checks of its registrations and the copy itself).
  Status CopyToPeer(const SegmentDescriptor& desc, Slice* s);
  /// kPeerUnreachable once the peer's process has exited (its mappings dropped then).
  Status CheckAlive(const SegmentDescriptor& desc);
  /// Runs the slice's copy through `part` on copier_ and counts it for the peer (in `kind` when not null).
  Status CopyInParts(const SegmentDescriptor& desc, Slice* s, uint64_t Peer::*kind, const ParallelCopier::PartFn& part);
  /// kStaleMetadata when the peer unregistered memory after `desc` was fetched (its epoch page moved on).
  Status CheckEpoch(const SegmentDescriptor& desc);
  StatusOr<std::shared_ptr<Mapping>> MapBuffer(const SegmentDescriptor& desc, const BufferDescriptor& buf);

  /// A one-page memfd that same-host peers map read-only: the count of withdrawn registrations. A peer whose
  /// cached descriptor carries an older epoch must refresh it before touching this process's memory.
  class EpochPage;

  TransportContext ctx_;
  std::unique_ptr<EpochPage> epoch_;
  size_t slice_size_ = 64 << 20;
  int threads_ = 1;
  int copy_threads_ = 2;
  int pid_ = 0;
  mutable std::mutex mu_;  // guards peers_
  mutable std::map<std::string, Peer> peers_;  // by peer instance id

  std::unique_ptr<ParallelCopier> copier_;  // MC_SHM_COPY_THREADS threads per large slice; helpers end in Stop
  std::unique_ptr<WorkQueue> workers_;      // MC_SHM_THREADS threads for asynchronous batches
};

}  // namespace mooncake::te::shm

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_SHM_SHM_TRANSPORT_H_
