#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_ENGINE_IMPL_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_ENGINE_IMPL_H_

// The engine's private state and steps, shared by engine.cc (initialisation, metadata, submission) and
// engine_api.cc (the public TransferEngine methods). Not part of the API.

#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/common/net.h"
#include "transfer_engine/common/process_watch.h"
#include "transfer_engine/common/work_queue.h"
#include "transfer_engine/core/batch.h"
#include "transfer_engine/core/handshake_methods.h"
#include "transfer_engine/core/managed_memory.h"
#include "transfer_engine/core/memory_registry.h"
#include "transfer_engine/core/metadata.h"
#include "transfer_engine/core/notification_queue.h"
#include "transfer_engine/core/rpc.h"
#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/core/slice_retry.h"
#include "transfer_engine/core/topology.h"
#include "transfer_engine/core/transport_set.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te {

class TransferEngine::Impl : public TransportHost {
 public:
  explicit Impl(EngineOptions options) : options_(std::move(options)), config_(options_.config) {}
  ~Impl() override { Shutdown(); }

  // TransportHost
  Status RegisterMethod(const std::string& method, MethodHandler handler) override {
    return methods_.Register(method, std::move(handler));
  }
  StatusOr<std::string> CallPeer(const std::string& segment, const std::string& method,
                                 const std::string& payload) override;
  Status Republish() override { return PublishLocal(); }

  Status Init();
  void Shutdown();
  /// Ok when the engine published at `owner` under our segment name is provably gone; else why not.
  Status OwnerGone(const net::HostPort& owner) const;

  // State read by the public methods.
  EngineOptions options_;
  EngineConfig config_;
  std::string segment_name_;
  std::string advertised_ip_;
  std::string host_id_ = LocalHostId();
  std::string instance_;  // random per engine: tells a restarted peer from the old one
  const uint64_t pid_start_ = ProcessStartTime(getpid());  // published as "pid_start", with "pid"
  MemoryRegistry memory_;
  std::unique_ptr<MetadataBackend> metadata_;
  TransportSet transports_;
  RpcServer rpc_;
  HandshakeMethods methods_;
  std::unique_ptr<ManagedMemory> managed_;
  std::mutex transport_managed_mu_;
  std::unordered_map<uint64_t, size_t> transport_managed_;  // allocate_managed_buffer served by the transport
  /// Off the I/O threads: notifications (worker_, one thread) and slice retries (retry_worker_,
  /// kRetryWorkers threads; SliceRetrier keeps each segment on one of them at a time), so a retry waiting for
  /// an unreachable peer's metadata never holds up notifications or other peers' retries. worker_ is shared
  /// with the notification callbacks of batches, which may finish after Shutdown (they then find it stopped).
  /// Both are stopped (threads joined) in Shutdown.
  static constexpr int kRetryWorkers = 4;
  std::shared_ptr<WorkQueue> worker_;
  std::unique_ptr<WorkQueue> retry_worker_;
  std::unique_ptr<SliceRetrier> retrier_;
  bool shut_down_ = false;

  // Segments: handles and the descriptor cache.
  mutable std::mutex seg_mu_;
  std::vector<std::string> handle_names_;  // handle h -> name (h >= 1)
  std::unordered_map<std::string, SegmentHandle> handles_;
  // A cached descriptor of a segment in another process of this host comes with a watch on that process:
  // once it has exited, the entry (and the transports' state for the name) is dropped and fetched afresh.
  struct CachedSegment {
    std::shared_ptr<const SegmentDescriptor> desc;
    std::shared_ptr<const ProcessWatch> owner;  // null: another host, or this process
  };
  std::unordered_map<std::string, CachedSegment> cache_;
  std::unordered_map<std::string, std::shared_ptr<const SegmentDescriptor>> defined_;  // DefineSegment

  // Latency of completed tasks per (transport chosen at submit, target segment), in StatsJson()["latency"].
  LatencyStats latency_;

  // Batches.
  mutable std::mutex batch_mu_;
  std::unordered_map<BatchId, std::shared_ptr<Batch>> batches_;
  BatchId next_batch_ = 1;

  // Notifications received (bounded in count and bytes: any peer can send them).
  static constexpr size_t kMaxQueuedNotifications = 65536;
  NotificationQueue notifications_{kMaxQueuedNotifications, config_.notify_queue_bytes};

  std::mutex publish_mu_;

  std::string BuildLocalDescriptor() const;
  Status PublishLocal();
  /// The descriptor of segment `name`, from the cache unless `refresh` (or MC_DISABLE_METACACHE). A segment
  /// published by a process of this host that has exited (a SIGKILLed engine's metadata outlives it) is never
  /// returned: the cached one is dropped and fetched again, and a fetched one fails with kPeerUnreachable
  /// until the name's new owner publishes itself.
  StatusOr<std::shared_ptr<const SegmentDescriptor>> Descriptor(const std::string& name, bool refresh);
  /// Parses a descriptor; one the parser refuses is offered to the transports
  /// (Transport::CompleteForeignDescriptor) and parsed once more if one of them completed it.
  StatusOr<SegmentDescriptor> ParseDescriptor(const std::string& name, const std::string& text) const;
  /// Drops the cached descriptor of `name` and the transports' connections and mappings for it.
  void Forget(const std::string& name);
  StatusOr<std::string> SegmentNameOf(SegmentHandle h) const;
  /// Registers a region with every transport, then with the registry (undone on any error).
  Status RegisterRegion(MemoryRegion region);
  /// For device memory: fills region.locality and, when the owning platform exports one, region.backing_fd /
  /// backing_offset with a dma-buf. Returns that fd (the caller owns it and closes it after the transports'
  /// RegisterRegion calls), or -1 (logged once at debug level with the reason).
  int AttachDeviceBacking(MemoryRegion& region);
  Status UnregisterRegion(uint64_t addr);
  StatusOr<std::shared_ptr<Batch>> FindBatch(BatchId id) const;
  StatusOr<std::string> HandleRpc(const RpcFrame& frame);
  Status SubmitImpl(Batch& b, const std::vector<TransferRequest>& requests, const Notification* notify,
                    bool drive);
  Status SendNotifyImpl(const std::string& segment, const Notification& n);
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_ENGINE_IMPL_H_
