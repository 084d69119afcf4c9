#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_SLICE_RETRY_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_SLICE_RETRY_H_

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/common/work_queue.h"
#include "transfer_engine/core/batch.h"
#include "transfer_engine/core/memory_registry.h"
#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/core/transport_set.h"

namespace mooncake::te {

/// The engine's rules for slices a transport failed with a retriable error (SliceRetry):
/// - kOtherPath: the slice goes to the best other transport that can do it (one it has not failed on);
/// - kRefreshPeer: the engine drops the peer's cached descriptor and the transports' connections and mappings
///   for it, fetches the descriptor again (once for every slice of the segment that failed meanwhile; a slice
///   handed out before the last refresh of its segment started takes that refresh's outcome, so stragglers of
///   one failure cause no more refreshes) and moves the slice once more on fresh connections: a restarted peer
///   is found at its new address, a connection the peer dropped (evicted, reset) is made again. A slice is
///   moved after a refresh at most once; a failed fetch fails it;
/// - a slice changes transport (kOtherPath) at most `retry_count` times (MC_RETRY_CNT; 0: never); otherwise it
///   completes with its error (a range the fresh descriptor no longer has: kAddressNotRegistered).
/// The work runs on `worker` (never on a transport's thread), which may have several threads: each segment's
/// retries run on one thread at a time, in the order they failed, so one slow peer (a hung descriptor fetch)
/// holds only its own segment's retries. Thread-safe.
class SliceRetrier {
 public:
  struct Services {
    /// The engine's descriptor cache (refresh: fetch again).
    std::function<StatusOr<std::shared_ptr<const SegmentDescriptor>>(const std::string&, bool refresh)> descriptor;
    /// Drops the cached descriptor and the transports' state for a segment.
    std::function<void(const std::string&)> forget;
    const TransportSet* transports = nullptr;
    const MemoryRegistry* memory = nullptr;
    WorkQueue* worker = nullptr;
    int retry_count = 9;
  };
  explicit SliceRetrier(Services services) : s_(std::move(services)) {}

  /// The batches' SliceRetryHook: true when the slice was taken over (it completes later).
  bool OnFailure(Slice* slice, const Status& status, SliceRetry retry);

 private:
  struct Pending {
    Slice* slice;
    Status status;
    SliceRetry retry;
  };
  struct RefreshOutcome {
    std::chrono::steady_clock::time_point started;
    Status error;
  };
  /// A slice still in flight after this long was handed out after the refresh, or has failed already.
  static constexpr std::chrono::minutes kForgetRefresh{10};

  /// Runs the segment's queued retries until its queue is empty, then clears its scheduled mark.
  void Drain(const std::string& segment);
  void Run(const std::string& segment, std::vector<Pending> queued);
  /// The segment's queue (emptied); with `finish`, an empty queue also ends its turn on the worker.
  std::vector<Pending> Take(const std::string& segment, bool finish);

  struct SegmentQueue {
    std::vector<Pending> queue;
    bool scheduled = false;  // a Drain is posted or running for the segment: no second one is posted
  };
  Services s_;
  std::mutex mu_;
  std::unordered_map<std::string, SegmentQueue> pending_;         // by segment; guarded by mu_
  std::unordered_map<std::string, RefreshOutcome> last_refresh_;  // guarded by mu_
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_SLICE_RETRY_H_
