#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_TRANSPORT_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/common/process_watch.h"
#include "transfer_engine/common/work_queue.h"
#include "transfer_engine/transport/cxl/cxl_config.h"
#include "transfer_engine/transport/cxl/cxl_device.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::cxl {

/// Moves bytes through a CXL memory device that every engine sharing it maps (CxlDevice): a transfer is a
/// copy between local memory and this engine's own mapping of the device at the offset the target published,
/// with the cache write-back (writes) and invalidation (reads) that memory shared without coherence needs
/// (cxl_cache.h; MC_CXL_FLUSH=0 turns them off for coherent setups).
///
/// Addressing: kVirtual. Requests name the target's virtual address, which the engine checks against the
/// target's published buffers; the transport translates it through the buffer's published device `offset`
/// (target_address - addr + offset), bounds-checked against the device size.
///
/// Registration: a region inside a MAP_SHARED mapping of the device (this transport's own, or any other
/// mapping of the same file in this process, found in /proc/self/maps) publishes its device `offset`; one
/// that overlaps an allocation another live process owns is refused (kAddressOverlapped). Other host memory
/// registers without an offset: it can be the local side of a transfer, and peers reach it by another
/// transport (slices aimed at it fail with kOtherPath).
///
/// Peers: reachable when their descriptor names the same device (cxl_uuid and cxl_size; on one kernel also
/// cxl_dev/cxl_ino). Each engine holds a slot in the device's table; before and after every copy the initiator
/// reads the target's slot: a closed slot or another instance there (the target stopped) fails the slice with
/// kPeerUnreachable, a moved epoch (the target withdrew memory) with kStaleMetadata, both kRefreshPeer; a target
/// process of this kernel that has exited (pidfd watch) fails with kPeerUnreachable. Every descriptor field is
/// read with JsonUint/JsonString and checked.
///
/// Threading: SubmitAndDrive copies on the caller's thread, Submit on MC_CXL_THREADS workers. Thread-safe.
class CxlTransport : public Transport {
 public:
  CxlTransport();
  ~CxlTransport() override;

  std::string name() const override { return "cxl"; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  void WithdrawRegion(const MemoryRegion& region) override;
  /// cxl_name, cxl_base_addr (Mooncake's), cxl_size, cxl_uuid, cxl_dev, cxl_ino, cxl_kernel, cxl_slot,
  /// cxl_epoch, cxl_pid_start.
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  /// A range carved from the device (CxlDevice::Allocate, tagged with this engine's segment name): what
  /// allocate_managed_buffer returns when cxl is the preferred protocol, so a store client's segment lies on
  /// the device. Freed by FreeManaged, or when the transport stops.
  StatusOr<void*> AllocateManaged(size_t length, int device) override;
  Status FreeManaged(void* addr, size_t length) override;
  size_t slice_size() const override { return config_.slice_size; }
  nlohmann::json Stats() const override;

  /// The mapped device (null before Start).
  CxlDevice* device() const { return device_.get(); }

  /// The device offset of [addr, addr+len) of this process's memory: inside `device`'s own mapping, or inside
  /// another MAP_SHARED mapping of the same file (by /proc/self/maps); kNotFound otherwise.
  static StatusOr<uint64_t> DeviceOffsetOf(const CxlDevice& device, uint64_t addr, uint64_t len);

 private:
  struct Peer {
    std::string name;
    std::unique_ptr<ProcessWatch> process;  // a target process of this kernel, else null
    uint64_t bytes = 0, slices = 0, errors = 0;
  };
  /// Whether the target engine still holds its slot under the descriptor's epoch (and its process lives).
  Status CheckPeer(const SegmentDescriptor& desc);
  /// Where the slice's target bytes are in the device (all descriptor fields checked).
  StatusOr<uint64_t> TargetOffset(const SegmentDescriptor& desc, const Slice& s) const;
  Status CopySlice(const SegmentDescriptor& desc, Slice* s);
  void Copy(const SegmentDescriptor& desc, const std::vector<Slice*>& slices);

  CxlConfig config_;
  TransportContext ctx_;
  std::unique_ptr<CxlDevice> device_;
  int slot_ = -1;
  uint64_t pid_start_ = 0;
  std::unique_ptr<WorkQueue> workers_;
  std::mutex alloc_mu_;
  std::vector<uint64_t> allocations_;  // device offsets this transport allocated (freed in Stop)
  mutable std::mutex mu_;  // guards peers_
  std::map<std::string, Peer> peers_;  // by the peer's instance id
};

}  // namespace mooncake::te::cxl

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_TRANSPORT_H_
