#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_INTERNAL_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_INTERNAL_H_

// What rdma_transport.cc (lifecycle, memory, peers) and rdma_submit.cc (the data path) share: the per-region
// state, the per-peer state and the per-slice job, and the untrusted-field helpers. Not a public header.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/transport/rdma/rdma_transport.h"

namespace mooncake::te::rdma {


/// How a region's memory was registered with the HCAs.
enum class RegPath : uint8_t {
  kHost,        ///< ibv_reg_mr on host memory
  kDmabuf,      ///< ibv_reg_dmabuf_mr on the dma-buf fd the platform exported for device memory
  kPeerMemory,  ///< ibv_reg_mr on the device pointer (a peer-memory client such as nvidia_peermem pins it)
};
const char* RegPathName(RegPath p);

/// What the transport keeps per registered region: per NIC and chunk a local MR (local write access only: its
/// lkey serves our own work requests) and, for remote-accessible memory, a remote MR (its rkey is what peers
/// get). WithdrawRemote deregisters the remote MRs (peers' late accesses fail with a remote access error at
/// once) while our own transfers still finish on the local MRs; Release (UnregisterRegion, or the destructor)
/// deregisters everything. Thread-safe.
class RdmaRegionState : public TransportRegionState {
 public:
  RdmaRegionState(const VerbsApi* api, uint64_t start, uint64_t chunk, RegPath path)
      : api_(api), start_(start), chunk_(chunk), path_(path) {}
  ~RdmaRegionState() override { Release(); }

  /// The MRs of the next NIC (index = nics_.size()); `remote` is empty for memory peers may not touch.
  void Add(std::shared_ptr<RdmaNic> nic, std::vector<ibv_mr*> local, std::vector<ibv_mr*> remote) {
    std::lock_guard lock(mu_);
    nics_.push_back(std::move(nic));
    local_.push_back(std::move(local));
    remote_.push_back(std::move(remote));
  }
  void WithdrawRemote() const {
    std::lock_guard lock(mu_);
    Deregister(remote_);
  }
  void Release() const {
    std::lock_guard lock(mu_);
    Deregister(remote_);
    Deregister(local_);
  }
  uint64_t start() const { return start_; }
  uint64_t chunk() const { return chunk_; }  // 0: one chunk
  RegPath path() const { return path_; }
  /// The lkey covering `addr` on NIC `nic`, or nullopt once released.
  std::optional<uint32_t> Lkey(size_t nic, uint64_t addr) const {
    std::lock_guard lock(mu_);
    if (nic >= local_.size()) return std::nullopt;
    size_t k = chunk_ ? static_cast<size_t>((addr - start_) / chunk_) : 0;
    if (k >= local_[nic].size() || !local_[nic][k]) return std::nullopt;
    return local_[nic][k]->lkey;
  }
  /// The local NICs nearest this memory (by index, set at registration); empty: no preference.
  std::vector<bool> preferred;

 private:
  void Deregister(std::vector<std::vector<ibv_mr*>>& table) const {
    for (auto& per_nic : table) {
      for (ibv_mr*& mr : per_nic) {
        if (mr) api_->dereg_mr(mr);
        mr = nullptr;
      }
    }
  }

  const VerbsApi* api_;
  const uint64_t start_;
  const uint64_t chunk_;
  const RegPath path_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<RdmaNic>> nics_;  // keep the PDs alive while MRs exist
  mutable std::vector<std::vector<ibv_mr*>> local_, remote_;
};

inline std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + ",") {
    if (c == ',' || c == ' ' || c == ';') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

// The JSON value `j[key]` when it is an unsigned number not above `max`.
inline std::optional<uint64_t> BoundedUint(const nlohmann::json& j, const char* key, uint64_t max) {
  auto v = JsonUint(j, key);
  if (!v || *v > max) return std::nullopt;
  return v;
}

inline std::optional<uint32_t> Key32(const nlohmann::json& v) {
  if (!v.is_number_unsigned()) return std::nullopt;
  uint64_t k = v.get<uint64_t>();
  if (k > 0xffffffffULL) return std::nullopt;
  return static_cast<uint32_t>(k);
}

/// Jobs run at a given time on one thread of its own. Post after Stop refuses; Stop runs every job still
/// waiting at once (on the caller's thread), then joins. Jobs must be quick (they hand work to a pool).
class RdmaTransport::DelayQueue {
 public:
  using Clock = std::chrono::steady_clock;
  DelayQueue() : thread_([this] { Run(); }) {}
  ~DelayQueue() { Stop(); }
  bool Post(Clock::time_point when, std::function<void()> fn) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return false;
      jobs_.emplace(when, std::move(fn));
    }
    cv_.notify_one();
    return true;
  }
  void Stop() {
    std::multimap<Clock::time_point, std::function<void()>> left;
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
    {
      std::lock_guard lock(mu_);
      left.swap(jobs_);
    }
    for (auto& [when, fn] : left) fn();
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      if (jobs_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = jobs_.begin();
      if (Clock::now() < first->first) {
        cv_.wait_until(lock, first->first);
        continue;
      }
      auto fn = std::move(first->second);
      jobs_.erase(first);
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::multimap<Clock::time_point, std::function<void()>> jobs_;
  std::thread thread_;  // last: started after the members it uses
};

/// A peer's counters (Stats), kept by segment name across the Peer objects a refresh or restart replaces.
struct RdmaTransport::PeerCounters {
  std::atomic<uint64_t> bytes{0}, slices{0}, errors{0}, retries{0};
};

struct RdmaTransport::PeerNic {
  std::string name;
  ibv_gid gid{};
  uint16_t lid = 0;
};

struct RdmaTransport::Peer {
  std::string key;
  std::string segment;
  std::vector<PeerNic> nics;
  size_t local_count = 0;
  std::vector<std::shared_ptr<Endpoint>> eps;  // [local * nics.size() + peer]
  std::atomic<uint64_t> next{0};
  std::shared_ptr<PeerCounters> counters;  // shared with the Peers before and after this one (same segment)
  // The peer's strand on the worker pool (RunForPeer): its retries run in order, one at a time.
  std::mutex retry_mu;
  std::deque<std::function<void()>> retry_jobs;
  bool retry_running = false;

  std::shared_ptr<Endpoint>& ep(size_t pair) { return eps[pair]; }
  size_t pairs() const { return eps.size(); }
};

/// One slice on its way: its pieces (work items) and outcome.
struct RdmaTransport::SliceJob {
  Slice* slice = nullptr;
  std::shared_ptr<Peer> peer;
  RegionPin pin;
  const RdmaRegionState* local = nullptr;  // of pin
  uint64_t remote_base = 0;                // the peer's buffer
  uint64_t remote_chunk = 0;               // 0: one chunk
  std::vector<std::vector<uint32_t>> rkeys;  // [peer nic][chunk]
  std::atomic<int> remaining{0};
  std::mutex mu;  // guards error, retry, attempts (slice->attempts)
  Status error;
  SliceRetry retry = SliceRetry::kFinal;
};

}  // namespace mooncake::te::rdma

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_INTERNAL_H_
