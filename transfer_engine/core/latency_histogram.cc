#include "transfer_engine/core/latency_histogram.h"

#include <algorithm>

namespace mooncake::te {

void LatencyHistogram::Record(std::chrono::nanoseconds latency, uint64_t bytes) {
  const uint64_t ns = latency.count() > 0 ? static_cast<uint64_t>(latency.count()) : 0;
  const uint64_t us = ns / 1000;
  size_t i = static_cast<size_t>(std::lower_bound(kBoundsUs.begin(), kBoundsUs.end(), us) - kBoundsUs.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

nlohmann::json LatencyHistogram::ToJson() const {
  nlohmann::json counts = nlohmann::json::array();
  for (const auto& c : counts_) counts.push_back(c.load(std::memory_order_relaxed));
  return {{"le_us", kBoundsUs},
          {"counts", std::move(counts)},
          {"count", count_.load(std::memory_order_relaxed)},
          {"sum_us", sum_ns_.load(std::memory_order_relaxed) / 1000.0},
          {"bytes", bytes_.load(std::memory_order_relaxed)}};
}

std::shared_ptr<LatencyHistogram> LatencyStats::For(const std::string& transport, const std::string& peer) {
  std::lock_guard lock(mu_);
  auto& peers = by_transport_[transport];
  auto it = peers.find(peer);
  if (it != peers.end()) return it->second;
  const std::string& key = peers.size() < kMaxPeers ? peer : std::string("(other)");
  auto& slot = peers[key];
  if (!slot) slot = std::make_shared<LatencyHistogram>();
  return slot;
}

nlohmann::json LatencyStats::ToJson() const {
  nlohmann::json out = nlohmann::json::object();
  std::lock_guard lock(mu_);
  for (const auto& [transport, peers] : by_transport_) {
    for (const auto& [peer, h] : peers) out[transport][peer] = h->ToJson();
  }
  return out;
}

}  // namespace mooncake::te
