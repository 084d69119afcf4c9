#include "transfer_engine/transport/shm/parallel_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

namespace mooncake::te::shm {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;
constexpr auto kPatience = std::chrono::seconds(10);

// Counts parts in flight. AwaitTogether blocks (up to kPatience) until `n` have been in flight at the same
// moment; AwaitOpen until Open is called.
class Gate {
 public:
  void Enter() {
    std::lock_guard lock(mu_);
    in_flight_++;
    peak_ = std::max(peak_, in_flight_);
    cv_.notify_all();
  }
  void Leave() {
    std::lock_guard lock(mu_);
    in_flight_--;
  }
  bool AwaitTogether(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kPatience, [&] { return peak_ >= n; });
  }
  bool AwaitOpen() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kPatience, [&] { return open_; });
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  int peak() {
    std::lock_guard lock(mu_);
    return peak_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int in_flight_ = 0, peak_ = 0;
  bool open_ = false;
};

TEST(ParallelCopierTest, PartsCoverTheRangeExactlyOnce) {
  ParallelCopier copier(3, /*min_part=*/4 * KiB, /*max_part=*/64 * KiB);
  for (size_t length : {size_t{0}, size_t{1}, 8 * KiB - 1, 8 * KiB, 8 * KiB + 1, 1 * MiB + 5, 3 * MiB + 4095}) {
    std::mutex mu;
    std::vector<std::pair<size_t, size_t>> seen;
    auto out = copier.Run(length, [&](size_t offset, size_t len) {
      std::lock_guard lock(mu);
      seen.emplace_back(offset, len);
      return Status::Ok();
    });
    ASSERT_TRUE(out.status.ok()) << length;
    ASSERT_EQ(out.parts, seen.size()) << length;
    std::sort(seen.begin(), seen.end());
    size_t next = 0;
    for (auto [offset, len] : seen) {
      ASSERT_EQ(offset, next) << length;
      ASSERT_GT(len, 0u) << length;
      next += len;
    }
    EXPECT_EQ(next, length);
    if (length >= 8 * KiB) {  // two minimum parts or more: split
      EXPECT_GT(out.parts, 1u) << length;
    }
  }
}

TEST(ParallelCopierTest, PartSizes) {
  ParallelCopier two(2);
  EXPECT_EQ(two.PartSize(64 * MiB), 4 * MiB);              // capped: claimed one at a time, so a slow thread
  EXPECT_EQ(two.PartSize(3 * MiB), 3 * MiB / 2);           // leaves its share to the other
  EXPECT_EQ(two.PartSize(2 * MiB - 1), 2 * MiB - 1);       // too small to be worth a helper
  EXPECT_EQ(two.PartSize(3 * MiB + 1) % (4 * KiB), 0u);    // page multiples
  ParallelCopier one(1);
  EXPECT_EQ(one.PartSize(64 * MiB), 64 * MiB);
  int calls = 0;
  EXPECT_TRUE(one.Run(64 * MiB, [&](size_t offset, size_t len) {
    calls++;
    EXPECT_EQ(offset, 0u);
    EXPECT_EQ(len, 64 * MiB);
    return Status::Ok();
  }).status.ok());
  EXPECT_EQ(calls, 1);
}

// The point of the copier: two parts of one copy are in flight at the same moment.
TEST(ParallelCopierTest, TwoThreadsCopyPartsAtOnce) {
  ParallelCopier copier(2, /*min_part=*/4 * KiB);
  Gate gate;
  auto out = copier.Run(8 * KiB, [&](size_t, size_t) {
    gate.Enter();
    bool together = gate.AwaitTogether(2);
    gate.Leave();
    return together ? Status::Ok() : Status(ErrorCode::kTimeout, "the other part never ran alongside");
  });
  EXPECT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.parts, 2u);
  EXPECT_EQ(out.helper_parts, 1u);
  EXPECT_EQ(gate.peak(), 2);
}

TEST(ParallelCopierTest, TheCallerFinishesAloneWhenTheHelpersAreBusy) {
  ParallelCopier copier(2, /*min_part=*/4 * KiB);
  Gate first;
  std::thread blocked([&] {
    auto out = copier.Run(8 * KiB, [&](size_t, size_t) {
      first.Enter();
      bool opened = first.AwaitOpen();
      first.Leave();
      return opened ? Status::Ok() : Status(ErrorCode::kTimeout, "never released");
    });
    EXPECT_TRUE(out.status.ok());
  });
  ASSERT_TRUE(first.AwaitTogether(2));  // its caller and the only helper are both stuck in its parts
  std::vector<char> src(64 * KiB, 'x'), dst(64 * KiB, 0);
  auto t0 = std::chrono::steady_clock::now();
  auto out = copier.Run(src.size(), [&](size_t offset, size_t len) {
    memcpy(dst.data() + offset, src.data() + offset, len);
    return Status::Ok();
  });
  auto waited = std::chrono::steady_clock::now() - t0;
  first.Open();
  blocked.join();
  EXPECT_TRUE(out.status.ok());
  EXPECT_EQ(out.helper_parts, 0u);
  EXPECT_GT(out.parts, 1u);
  EXPECT_LT(waited, kPatience / 2);
  EXPECT_EQ(src, dst);
}

TEST(ParallelCopierTest, FirstFailureIsReportedAndNoPartRunsAfterReturn) {
  ParallelCopier copier(2, /*min_part=*/4 * KiB, /*max_part=*/4 * KiB);
  std::atomic<bool> returned{false};
  std::atomic<int> late{0}, calls{0};
  auto out = copier.Run(1 * MiB, [&](size_t offset, size_t) {
    if (returned.load()) late++;
    calls++;
    if (offset == 8 * KiB) return Status(ErrorCode::kSocket, "part at 8 KiB failed");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    return Status::Ok();
  });
  returned.store(true);
  EXPECT_EQ(out.status.code(), ErrorCode::kSocket);
  EXPECT_EQ(out.status.message(), "part at 8 KiB failed");
  EXPECT_EQ(out.parts, 256u);
  EXPECT_LT(calls.load(), 256);  // the rest were skipped
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(late.load(), 0);
}

TEST(ParallelCopierTest, ManyCallersShareTheHelpers) {
  ParallelCopier copier(2, /*min_part=*/4 * KiB, /*max_part=*/16 * KiB);
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&, t] {
      std::vector<char> src(256 * KiB + t * 977), dst(src.size());
      for (int round = 0; round < 20; ++round) {
        std::iota(src.begin(), src.end(), static_cast<char>(t * 31 + round));
        std::fill(dst.begin(), dst.end(), 0);
        auto out = copier.Run(src.size(), [&](size_t offset, size_t len) {
          memcpy(dst.data() + offset, src.data() + offset, len);
          return Status::Ok();
        });
        if (!out.status.ok() || src != dst) bad++;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ParallelCopierTest, AfterStopTheCallerCopiesAlone) {
  ParallelCopier copier(2, /*min_part=*/4 * KiB);
  copier.Stop();
  copier.Stop();
  std::vector<char> src(64 * KiB, 'y'), dst(64 * KiB, 0);
  auto out = copier.Run(src.size(), [&](size_t offset, size_t len) {
    memcpy(dst.data() + offset, src.data() + offset, len);
    return Status::Ok();
  });
  EXPECT_TRUE(out.status.ok());
  EXPECT_GT(out.parts, 1u);
  EXPECT_EQ(out.helper_parts, 0u);
  EXPECT_EQ(src, dst);
}

TEST(ParallelCopierTest, UsableCpusIsPositive) { EXPECT_GE(UsableCpus(), 1); }

}  // namespace
}  // namespace mooncake::te::shm
