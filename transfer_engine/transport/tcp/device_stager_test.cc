// DeviceStager on the host emulation platform: pinned buffers and their cache, copies whose continuations run
// off the caller's thread, errors of a copy and of a missing platform, and Stop.
#include "transfer_engine/transport/tcp/device_stager.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"

namespace mooncake::te::tcp {
namespace {

const MemoryKind kCuda0{MemoryType::kCuda, 0};

class DeviceStagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    emulation_ = MakeHostEmulationPlatform(1);
    PlatformRegistry::Get().Register(emulation_);
  }
  void TearDown() override { PlatformRegistry::Get().Unregister("host_emulation"); }

  // Runs one copy and returns its status and the thread its continuation ran on.
  std::pair<Status, std::thread::id> CopyAndWait(DeviceStager& stager, void* dst, const void* src, size_t n) {
    std::promise<std::pair<Status, std::thread::id>> done;
    stager.Copy(kCuda0, dst, src, n, [&](const Status& st) { done.set_value({st, std::this_thread::get_id()}); });
    return done.get_future().get();
  }

  std::shared_ptr<Platform> emulation_;
};

TEST_F(DeviceStagerTest, StagesIntoDeviceMemoryAndBackOnItsOwnThread) {
  DeviceStager stager(&PlatformRegistry::Get(), 1 << 20);
  ASSERT_TRUE(stager.CanStage(kCuda0));
  constexpr size_t kLen = 300000;
  auto device = emulation_->Allocate(kLen, AllocationKind::kDevice, 0);
  ASSERT_TRUE(device.ok());
  auto staging = stager.Acquire(kCuda0, kLen);
  ASSERT_TRUE(staging.ok()) << staging.status().ToString();
  EXPECT_GE((*staging)->capacity, kLen);
  for (size_t i = 0; i < kLen; ++i) (*staging)->data[i] = static_cast<char>(i * 7 + 3);
  auto [st, thread] = CopyAndWait(stager, *device, (*staging)->data, kLen);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(thread, std::this_thread::get_id());
  std::vector<char> back(kLen);
  auto again = stager.Acquire(kCuda0, kLen);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(CopyAndWait(stager, (*again)->data, *device, kLen).first.ok());
  memcpy(back.data(), (*again)->data, kLen);
  EXPECT_EQ(0, memcmp(back.data(), (*staging)->data, kLen));
  auto stats = stager.Stats();
  EXPECT_EQ(stats["copies"], 2u);
  EXPECT_EQ(stats["copied_bytes"], 2 * kLen);
  EXPECT_EQ(stats["copy_errors"], 0u);
  EXPECT_TRUE(emulation_->Free(*device, kLen, AllocationKind::kDevice).ok());
}

TEST_F(DeviceStagerTest, ReusesBuffersWithinTheCacheAndFreesBeyondIt) {
  DeviceStager stager(&PlatformRegistry::Get(), 512 << 10);
  char* first = nullptr;
  {
    auto a = stager.Acquire(kCuda0, 100000);  // size class 128 KiB
    ASSERT_TRUE(a.ok());
    first = (*a)->data;
    EXPECT_EQ((*a)->capacity, 128u << 10);
  }
  EXPECT_EQ(stager.Stats()["cached_bytes"], 128u << 10);
  auto b = stager.Acquire(kCuda0, 128 << 10);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->data, first) << "a released buffer of the same size class is reused";
  EXPECT_EQ(stager.Stats()["cached_bytes"], 0u);
  {
    auto big = stager.Acquire(kCuda0, 1 << 20);  // larger than the whole cache: freed on release
    ASSERT_TRUE(big.ok());
    EXPECT_EQ(stager.Stats()["pinned_bytes"], (128u << 10) + (1u << 20));
  }
  EXPECT_EQ(stager.Stats()["pinned_bytes"], 128u << 10);
  EXPECT_EQ(stager.Stats()["cached_bytes"], 0u);
}

TEST_F(DeviceStagerTest, AFailedCopyReportsItsErrorAndAMissingPlatformIsNamed) {
  DeviceStager stager(&PlatformRegistry::Get(), 0);
  auto staging = stager.Acquire(kCuda0, 4096);
  ASSERT_TRUE(staging.ok());
  // An unmapped source: the emulation's checked copy fails; the continuation says so (no crash).
  auto [st, thread] = CopyAndWait(stager, (*staging)->data, reinterpret_cast<void*>(16), 4096);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("device copy"), std::string::npos) << st.message();
  EXPECT_EQ(stager.Stats()["copy_errors"], 1u);

  const MemoryKind rocm{MemoryType::kRocm, 0};
  EXPECT_FALSE(stager.CanStage(rocm));
  auto none = stager.Acquire(rocm, 4096);
  EXPECT_EQ(none.status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_NE(none.status().message().find("rocm:0"), std::string::npos) << none.status().message();
  EXPECT_EQ(stager.Acquire(kCuda0, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(stager.CanStage(MemoryKind{}));  // host memory is never staged
}

TEST_F(DeviceStagerTest, StopWaitsForStartedCopiesAndRefusesLaterOnes) {
  DeviceStager stager(&PlatformRegistry::Get(), 1 << 20);
  constexpr size_t kLen = 8 << 20;
  auto device = emulation_->Allocate(kLen, AllocationKind::kDevice, 0);
  auto staging = stager.Acquire(kCuda0, kLen);
  ASSERT_TRUE(device.ok() && staging.ok());
  std::atomic<int> finished{0};
  for (int i = 0; i < 4; ++i) {
    stager.Copy(kCuda0, *device, (*staging)->data, kLen, [&](const Status& st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      finished.fetch_add(1);
    });
  }
  stager.Stop();
  EXPECT_EQ(finished.load(), 4) << "Stop returned before the continuations of started copies ran";
  Status late;
  bool called = false;
  stager.Copy(kCuda0, *device, (*staging)->data, 16, [&](const Status& st) {
    late = st;
    called = true;
  });
  EXPECT_TRUE(called) << "a copy after Stop is refused at once";
  EXPECT_EQ(late.code(), ErrorCode::kSocket);
  stager.Stop();  // idempotent
  staging->reset();
  EXPECT_TRUE(emulation_->Free(*device, kLen, AllocationKind::kDevice).ok());
}

}  // namespace
}  // namespace mooncake::te::tcp
