#include "transfer_engine/platform/stream_pool.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "transfer_engine/platform/cpu/cpu_platform.h"
#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/platform/testing/stalling_page.h"

namespace mooncake::te {
namespace {

// The host emulation (real worker threads per stream), watched: which stream each copy was given and which
// streams are alive. Everything is forwarded.
class WatchedPlatform final : public Platform {
 public:
  WatchedPlatform() : inner_(MakeHostEmulationPlatform(2)) {}
  std::string name() const override { return "watched"; }
  MemoryType device_type() const override { return inner_->device_type(); }
  PlatformProbe Probe() override { return inner_->Probe(); }
  std::optional<MemoryKind> Classify(const void* p) override { return inner_->Classify(p); }
  StatusOr<void*> Allocate(size_t n, AllocationKind k, int d) override { return inner_->Allocate(n, k, d); }
  Status Free(void* p, size_t n, AllocationKind k) override { return inner_->Free(p, n, k); }
  StatusOr<std::string> ExportIpc(void* p, size_t n) override { return inner_->ExportIpc(p, n); }
  StatusOr<void*> ImportIpc(const std::string& h, int pid, size_t n) override { return inner_->ImportIpc(h, pid, n); }
  Status CloseIpc(void* p, size_t n) override { return inner_->CloseIpc(p, n); }
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t n, int device,
                                                      void* stream) override {
    {
      std::lock_guard lock(mu_);
      copy_streams_.push_back(stream);
    }
    return inner_->CopyAsync(dst, src, n, device, stream);
  }
  StatusOr<void*> CreateStream(int device) override {
    auto s = inner_->CreateStream(device);
    std::lock_guard lock(mu_);
    if (s.ok()) live_.insert(*s);
    return s;
  }
  Status DestroyStream(void* s) override {
    {
      std::lock_guard lock(mu_);
      live_.erase(s);
    }
    return inner_->DestroyStream(s);
  }

  std::vector<void*> copy_streams() {
    std::lock_guard lock(mu_);
    return copy_streams_;
  }
  size_t live() {
    std::lock_guard lock(mu_);
    return live_.size();
  }

 private:
  std::shared_ptr<Platform> inner_;
  std::mutex mu_;
  std::vector<void*> copy_streams_;
  std::set<void*> live_;
};

TEST(StreamPoolTest, CopiesInFlightGoToDifferentStreams) {
  auto watched = std::make_shared<WatchedPlatform>();
  StreamPool pool(watched, 3);
  auto made = pool.Prepare(0);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(*made, 3u);
  EXPECT_EQ(watched->live(), 3u);
  EXPECT_EQ(*pool.Prepare(0), 3u);  // once per device
  EXPECT_EQ(watched->live(), 3u);

  std::vector<char> src(256, 'a'), dst(256, 0);
  std::vector<std::unique_ptr<CopyCompletion>> c;
  for (int i = 0; i < 4; ++i) {
    auto started = pool.CopyAsync(dst.data() + i * 64, src.data() + i * 64, 64, 0);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    c.push_back(std::move(*started));
  }
  auto used = watched->copy_streams();
  ASSERT_EQ(used.size(), 4u);
  EXPECT_EQ(std::set<void*>(used.begin(), used.begin() + 3).size(), 3u);  // one per stream while all are busy
  EXPECT_NE(used[0], nullptr);
  EXPECT_EQ(pool.in_flight(), 4u);
  EXPECT_TRUE(c[1]->Wait().ok());
  EXPECT_EQ(pool.in_flight(), 3u);
  auto next = pool.CopyAsync(dst.data(), src.data(), 64, 0);  // to the only stream with nothing in flight
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(watched->copy_streams().back(), used[1]);
  for (auto& x : c) EXPECT_TRUE(x->Wait().ok());
  EXPECT_TRUE((*next)->Wait().ok());
  EXPECT_EQ(pool.in_flight(), 0u);
  EXPECT_EQ(dst, src);

  // Device 1 gets its own streams; -1 the platform's own stream; a copy that does not start counts for nothing.
  auto on1 = pool.CopyAsync(dst.data(), src.data(), 64, 1);
  ASSERT_TRUE(on1.ok());
  EXPECT_EQ(watched->live(), 6u);
  EXPECT_EQ(pool.streams(), 6u);
  auto own = pool.CopyAsync(dst.data(), src.data(), 64, -1);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(watched->copy_streams().back(), nullptr);
  EXPECT_EQ(pool.CopyAsync(nullptr, src.data(), 64, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE((*on1)->Wait().ok());
  EXPECT_TRUE((*own)->Done() || (*own)->Wait().ok());
  EXPECT_EQ(pool.in_flight(), 0u);
  EXPECT_EQ(pool.Prepare(-1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(pool.Prepare(7).status().code(), ErrorCode::kDeviceNotFound);  // and device 7 uses the own stream
}

TEST(StreamPoolTest, AStalledCopyHoldsBackOnlyItsOwnStream) {
  testing::StallingPage stall;
  if (!stall.ok()) GTEST_SKIP() << "no userfaultfd here: " << stall.why();
  auto watched = std::make_shared<WatchedPlatform>();
  StreamPool pool(watched, 2);
  std::vector<char> sink(stall.size()), src(64, 'z'), dst(64, 0);
  auto stalled = pool.CopyAsync(sink.data(), stall.data(), stall.size(), 0);
  ASSERT_TRUE(stalled.ok());
  ASSERT_TRUE(stall.WaitForToucher(10000));
  auto other = pool.CopyAsync(dst.data(), src.data(), src.size(), 0);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->Wait().ok());  // would hang on a single stream
  EXPECT_EQ(dst, src);
  EXPECT_FALSE((*stalled)->Done());
  ASSERT_TRUE(stall.Release('r'));
  EXPECT_TRUE((*stalled)->Wait().ok());
  EXPECT_EQ(sink, std::vector<char>(stall.size(), 'r'));
}

TEST(StreamPoolTest, StreamsGoOnceThePoolAndItsCompletionsAreGone) {
  auto watched = std::make_shared<WatchedPlatform>();
  std::vector<char> src(64, 'k'), dst(64, 0);
  std::unique_ptr<CopyCompletion> kept;
  {
    StreamPool pool(watched, 2);
    auto c = pool.CopyAsync(dst.data(), src.data(), src.size(), 0);
    ASSERT_TRUE(c.ok());
    kept = std::move(*c);
    EXPECT_EQ(watched->live(), 2u);
  }
  EXPECT_EQ(watched->live(), 2u);  // the completion still shares them
  EXPECT_TRUE(kept->Wait().ok());
  kept.reset();
  EXPECT_EQ(watched->live(), 0u);
  EXPECT_EQ(dst, src);
}

TEST(StreamPoolTest, APlatformWithoutStreamsCopiesOnItsOwn) {
  StreamPool pool(MakeCpuPlatform(), 4);
  EXPECT_EQ(pool.Prepare(0).status().code(), ErrorCode::kNotImplemented);
  auto again = pool.Prepare(0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u);
  std::vector<char> src(64, 'c'), dst(64, 0);
  auto c = pool.CopyAsync(dst.data(), src.data(), src.size(), 0);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->Wait().ok());
  EXPECT_EQ(dst, src);
  EXPECT_EQ(pool.streams(), 0u);
  EXPECT_EQ(pool.in_flight(), 0u);
}

}  // namespace
}  // namespace mooncake::te
