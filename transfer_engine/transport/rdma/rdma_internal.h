#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_INTERNAL_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_INTERNAL_H_

// What rdma_transport.cc (lifecycle, memory, peers) and rdma_submit.cc (the data path) share: the per-region
// state, the per-peer state and the per-slice job, and the untrusted-field helpers. Not a public header.

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/transport/rdma/rdma_transport.h"

namespace mooncake::te::rdma {


/// What the transport keeps per registered region: its MRs, [nic][chunk]. Deregistered by Release
/// (UnregisterRegion) or the destructor, whichever comes first.
class RdmaRegionState : public TransportRegionState {
 public:
  RdmaRegionState(const VerbsApi* api, uint64_t start, uint64_t chunk) : api_(api), start_(start), chunk_(chunk) {}
  ~RdmaRegionState() override { Release(); }

  void Add(std::shared_ptr<RdmaNic> nic, std::vector<ibv_mr*> mrs) {
    nics_.push_back(std::move(nic));
    mrs_.push_back(std::move(mrs));
  }
  void Release() const {
    std::lock_guard lock(mu_);
    for (auto& per_nic : mrs_) {
      for (ibv_mr*& mr : per_nic) {
        if (mr) api_->dereg_mr(mr);
        mr = nullptr;
      }
    }
  }
  uint64_t start() const { return start_; }
  uint64_t chunk() const { return chunk_; }  // 0: one chunk
  /// The lkey covering `addr` on NIC `nic`, or nullopt once released.
  std::optional<uint32_t> Lkey(size_t nic, uint64_t addr) const {
    std::lock_guard lock(mu_);
    if (nic >= mrs_.size()) return std::nullopt;
    size_t k = chunk_ ? static_cast<size_t>((addr - start_) / chunk_) : 0;
    if (k >= mrs_[nic].size() || !mrs_[nic][k]) return std::nullopt;
    return mrs_[nic][k]->lkey;
  }

 private:
  const VerbsApi* api_;
  const uint64_t start_;
  const uint64_t chunk_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<RdmaNic>> nics_;  // keep the PDs alive while MRs exist
  mutable std::vector<std::vector<ibv_mr*>> mrs_;
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

struct RdmaTransport::Peer {
  std::string key;
  std::string segment;
  struct Nic {
    std::string name;
    ibv_gid gid{};
    uint16_t lid = 0;
  };
  std::vector<Nic> nics;
  size_t local_count = 0;
  std::vector<std::shared_ptr<Endpoint>> eps;  // [local * nics.size() + peer]
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> bytes{0}, slices{0}, errors{0}, retries{0};

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
