#include "transfer_engine/core/latency_histogram.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace mooncake::te {
namespace {

using std::chrono::microseconds;

TEST(LatencyHistogramTest, BucketsCountAndSum) {
  LatencyHistogram h;
  h.Record(microseconds(5), 100);      // <= 10 us
  h.Record(microseconds(10), 100);     // <= 10 us (bounds are inclusive, as Prometheus' "le")
  h.Record(microseconds(11), 100);     // <= 25 us
  h.Record(microseconds(20000000), 1);  // +Inf
  h.Record(std::chrono::nanoseconds(-5), 0);  // a clock that went back counts as 0
  auto j = h.ToJson();
  EXPECT_EQ(j["counts"].size(), LatencyHistogram::kBoundsUs.size() + 1);
  EXPECT_EQ(j["counts"][0], 3);
  EXPECT_EQ(j["counts"][1], 1);
  EXPECT_EQ(j["counts"][LatencyHistogram::kBoundsUs.size()], 1);
  EXPECT_EQ(j["count"], 5);
  EXPECT_EQ(j["bytes"], 301);
  EXPECT_DOUBLE_EQ(j["sum_us"].get<double>(), 20000026.0);
}

TEST(LatencyHistogramTest, ManyThreadsLoseNothingAndPeersAreBounded) {
  LatencyStats stats;
  auto h = stats.For("tcp", "peer");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) h->Record(microseconds(i % 3000), 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(stats.ToJson()["tcp"]["peer"]["count"], 40000);
  EXPECT_EQ(stats.For("tcp", "peer"), h);
  for (size_t i = 0; i < LatencyStats::kMaxPeers + 10; ++i) stats.For("shm", "p" + std::to_string(i));
  auto j = stats.ToJson();
  EXPECT_EQ(j["shm"].size(), LatencyStats::kMaxPeers + 1) << "peers beyond the limit share one entry";
  EXPECT_TRUE(j["shm"].contains("(other)"));
}

}  // namespace
}  // namespace mooncake::te
