#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_LATENCY_HISTOGRAM_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace mooncake::te {

/// Completed-transfer latencies with fixed bucket bounds (microseconds, Prometheus-style "le" buckets plus
/// +Inf). Record is lock-free (relaxed atomics) and may run on any thread; ToJson reads a snapshot that is
/// consistent per counter, not across counters.
class LatencyHistogram {
 public:
  static constexpr std::array<uint64_t, 18> kBoundsUs = {10,    25,    50,     100,    250,    500,
                                                          1000,  2500,  5000,   10000,  25000,  50000,
                                                          100000, 250000, 500000, 1000000, 2500000, 10000000};

  void Record(std::chrono::nanoseconds latency, uint64_t bytes);
  /// {"le_us": [bounds], "counts": [per bucket, the last one +Inf], "count", "sum_us", "bytes"}.
  nlohmann::json ToJson() const;

 private:
  std::array<std::atomic<uint64_t>, kBoundsUs.size() + 1> counts_{};
  std::atomic<uint64_t> count_{0}, sum_ns_{0}, bytes_{0};
};

/// One histogram per (transport, peer segment), created on first use. At most kMaxPeers peers per transport
/// get their own; later ones share "(other)", so a process that talks to many peers keeps bounded memory.
/// Thread-safe.
class LatencyStats {
 public:
  static constexpr size_t kMaxPeers = 1024;
  std::shared_ptr<LatencyHistogram> For(const std::string& transport, const std::string& peer);
  /// {transport: {peer: histogram json}}.
  nlohmann::json ToJson() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::unordered_map<std::string, std::shared_ptr<LatencyHistogram>>> by_transport_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_LATENCY_HISTOGRAM_H_
