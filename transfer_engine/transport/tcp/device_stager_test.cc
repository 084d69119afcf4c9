// DeviceStager on the host emulation platform: the bounded pinned pool (both halves, queueing, wake-ups), copies whose continuations run
// off the caller's thread, errors of a copy and of a missing platform, and Stop.
#include "transfer_engine/transport/tcp/device_stager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <set>
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
  // A buffer granted at once (the pool has room), or the error.
  static StatusOr<StagingRef> AcquireNow(DeviceStager& stager, size_t n, StagingRole role = StagingRole::kInitiator) {
    StatusOr<StagingRef> out = Status(ErrorCode::kTimeout, "not granted at once");
    stager.Acquire(kCuda0, role, n, [&](StatusOr<StagingRef> got) { out = std::move(got); });
    return out;
  }

  std::shared_ptr<Platform> emulation_;
};

TEST_F(DeviceStagerTest, StagesIntoDeviceMemoryAndBackOnItsOwnThread) {
  DeviceStager stager(&PlatformRegistry::Get(), 2 << 20, 512 << 10);
  ASSERT_TRUE(stager.CanStage(kCuda0));
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());
  constexpr size_t kLen = 300000;
  auto device = emulation_->Allocate(kLen, AllocationKind::kDevice, 0);
  ASSERT_TRUE(device.ok());
  auto staging = AcquireNow(stager, kLen);
  ASSERT_TRUE(staging.ok()) << staging.status().ToString();
  EXPECT_GE((*staging)->capacity, kLen);
  for (size_t i = 0; i < kLen; ++i) (*staging)->data[i] = static_cast<char>(i * 7 + 3);
  auto [st, thread] = CopyAndWait(stager, *device, (*staging)->data, kLen);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(thread, std::this_thread::get_id());
  std::vector<char> back(kLen);
  auto again = AcquireNow(stager, kLen);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(CopyAndWait(stager, (*again)->data, *device, kLen).first.ok());
  memcpy(back.data(), (*again)->data, kLen);
  EXPECT_EQ(0, memcmp(back.data(), (*staging)->data, kLen));
  auto stats = stager.Stats();
  EXPECT_EQ(stats["copies"], 2u);
  EXPECT_EQ(stats["copied_bytes"], 2 * kLen);
  EXPECT_EQ(stats["copy_errors"], 0u);
  EXPECT_EQ(stats["pinned_bytes"], 2u << 20);
  EXPECT_TRUE(emulation_->Free(*device, kLen, AllocationKind::kDevice).ok());
}

TEST_F(DeviceStagerTest, ThePoolIsBoundedAndAcquiresQueueForReleasedChunks) {
  DeviceStager stager(&PlatformRegistry::Get(), 1 << 20, 128 << 10);  // 4 chunks of 128 KiB per role
  ASSERT_EQ(stager.role_bytes(), 512u << 10);
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());  // once
  EXPECT_EQ(stager.Stats()["pinned_bytes"], 1u << 20);
  auto a = AcquireNow(stager, 256 << 10);  // two adjacent chunks
  auto b = AcquireNow(stager, 256 << 10);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->capacity, 256u << 10);
  // The initiator half is used up: the next one waits, and is granted on a stager thread once a is released.
  std::promise<std::pair<char*, bool>> granted;
  stager.Acquire(kCuda0, StagingRole::kInitiator, 100000, [&](StatusOr<StagingRef> got) {
    granted.set_value({got.ok() ? (*got)->data : nullptr, DeviceStager::OnStagerThread()});
  });
  auto fut = granted.get_future();
  EXPECT_EQ(fut.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // The target half is separate: it still has room; when it runs out, a wake-up is arranged instead.
  std::vector<StagingRef> target;
  std::atomic<int> woken{0};
  for (int i = 0; i < 5; ++i) {
    auto t = stager.TryAcquireOrNotify(kCuda0, StagingRole::kTarget, [&] { woken.fetch_add(1); });
    ASSERT_TRUE(t.ok());
    if (*t) target.push_back(*t);
  }
  EXPECT_EQ(target.size(), 4u);
  char* first = (*a)->data;
  a->reset();
  auto [data, on_stager] = fut.get();
  EXPECT_EQ(data, first);
  EXPECT_TRUE(on_stager);
  target.pop_back();
  for (int i = 0; i < 100 && woken.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(woken.load(), 1);
  auto stats = stager.Stats();
  EXPECT_EQ(stats["pinned_bytes"], 1u << 20) << "nothing is allocated beyond the pool";
  EXPECT_LE(stats["peak_in_use_bytes"].get<size_t>(), 1u << 20);
  EXPECT_EQ(stats["acquire_waits"], 1u);
  EXPECT_EQ(stats["target_pauses"], 1u);
  EXPECT_EQ(AcquireNow(stager, (512 << 10) + 1).status().code(), ErrorCode::kInvalidArgument);
}

TEST_F(DeviceStagerTest, AFailedCopyReportsItsErrorAndAMissingPlatformIsNamed) {
  DeviceStager stager(&PlatformRegistry::Get(), 1 << 20, 64 << 10);
  EXPECT_EQ(AcquireNow(stager, 4096).status().code(), ErrorCode::kDeviceNotFound) << "no pool before Prepare";
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());
  auto staging = AcquireNow(stager, 4096);
  ASSERT_TRUE(staging.ok());
  // An unmapped source: the emulation's checked copy fails; the continuation says so (no crash).
  auto [st, thread] = CopyAndWait(stager, (*staging)->data, reinterpret_cast<void*>(16), 4096);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("device copy"), std::string::npos) << st.message();
  EXPECT_EQ(stager.Stats()["copy_errors"], 1u);

  const MemoryKind rocm{MemoryType::kRocm, 0};
  EXPECT_FALSE(stager.CanStage(rocm));
  EXPECT_EQ(stager.Prepare(rocm).code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(AcquireNow(stager, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(stager.CanStage(MemoryKind{}));  // host memory is never staged
}

TEST_F(DeviceStagerTest, StopWaitsForStartedCopiesAndRefusesLaterOnes) {
  DeviceStager stager(&PlatformRegistry::Get(), 16 << 20, 8 << 20);
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());
  constexpr size_t kLen = 8 << 20;
  auto device = emulation_->Allocate(kLen, AllocationKind::kDevice, 0);
  auto staging = AcquireNow(stager, kLen);
  ASSERT_TRUE(device.ok() && staging.ok());
  std::atomic<int> finished{0};
  for (int i = 0; i < 4; ++i) {
    stager.Copy(kCuda0, *device, (*staging)->data, kLen, [&](const Status& st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      finished.fetch_add(1);
    });
  }
  Status queued;
  stager.Acquire(kCuda0, StagingRole::kInitiator, kLen, [&](StatusOr<StagingRef> got) { queued = got.status(); });
  stager.Stop();
  EXPECT_EQ(finished.load(), 4) << "Stop returned before the continuations of started copies ran";
  EXPECT_EQ(queued.code(), ErrorCode::kSocket) << "a queued acquire is refused at Stop";
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

// The host emulation under its own name, watched: pinned allocations and frees (and whether a stager thread freed),
// the stream of each copy, the streams alive. Everything is forwarded.
class WatchedEmulation final : public Platform {
 public:
  explicit WatchedEmulation(std::shared_ptr<Platform> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "host_emulation"; }
  MemoryType device_type() const override { return inner_->device_type(); }
  PlatformProbe Probe() override { return inner_->Probe(); }
  std::optional<MemoryKind> Classify(const void* p) override { return inner_->Classify(p); }
  StatusOr<void*> Allocate(size_t n, AllocationKind k, int d) override {
    if (k == AllocationKind::kPinnedHost) pinned_allocs.fetch_add(1);
    return inner_->Allocate(n, k, d);
  }
  Status Free(void* p, size_t n, AllocationKind k) override {
    if (k == AllocationKind::kPinnedHost) {
      pinned_frees.fetch_add(1);
      if (!DeviceStager::OnStagerThread()) frees_elsewhere.fetch_add(1);
    }
    return inner_->Free(p, n, k);
  }
  StatusOr<std::string> ExportIpc(void* p, size_t n) override { return inner_->ExportIpc(p, n); }
  StatusOr<void*> ImportIpc(const std::string& h, int pid, size_t n) override { return inner_->ImportIpc(h, pid, n); }
  Status CloseIpc(void* p, size_t n) override { return inner_->CloseIpc(p, n); }
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t n, int device,
                                                      void* stream) override {
    {
      std::unique_lock lock(mu_);
      copy_streams_.push_back(stream);
      ++starts_entered_;
      cv_.notify_all();
      cv_.wait(lock, [this] { return !hold_starts_; });  // a slow start (a driver call), while held
    }
    return inner_->CopyAsync(dst, src, n, device, stream);
  }
  // While held, CopyAsync does not return (it has been entered; see WaitForStarts) until Release.
  void HoldStarts() {
    std::lock_guard lock(mu_);
    hold_starts_ = true;
  }
  void ReleaseStarts() {
    {
      std::lock_guard lock(mu_);
      hold_starts_ = false;
    }
    cv_.notify_all();
  }
  bool WaitForStarts(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return starts_entered_ >= n; });
  }
  StatusOr<void*> CreateStream(int device) override {
    auto s = inner_->CreateStream(device);
    if (s.ok()) live_streams.fetch_add(1);
    return s;
  }
  Status DestroyStream(void* s) override {
    Status st = inner_->DestroyStream(s);
    if (st.ok()) live_streams.fetch_sub(1);
    return st;
  }
  std::vector<void*> copy_streams() {
    std::lock_guard lock(mu_);
    return copy_streams_;
  }

  std::atomic<int> pinned_allocs{0}, pinned_frees{0}, frees_elsewhere{0}, live_streams{0};

 private:
  std::shared_ptr<Platform> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<void*> copy_streams_;
  bool hold_starts_ = false;
  int starts_entered_ = 0;
};

class DeviceStagerPoolLifeTest : public DeviceStagerTest {
 protected:
  void SetUp() override {
    DeviceStagerTest::SetUp();
    watched_ = std::make_shared<WatchedEmulation>(emulation_);
    PlatformRegistry::Get().Register(watched_);  // replaces the plain one (same name)
  }
  // Waits up to 5 s for the stager's pinned bytes to reach `bytes`.
  static bool PinnedBecomes(DeviceStager& stager, size_t bytes) {
    for (int i = 0; i < 500; ++i) {
      if (stager.Stats()["pinned_bytes"].get<size_t>() == bytes) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  std::shared_ptr<WatchedEmulation> watched_;
};

TEST_F(DeviceStagerPoolLifeTest, ThePoolGoesOffTheCallersThreadAfterTheLastRegionAndComesBack) {
  DeviceStager stager(&PlatformRegistry::Get(), 1 << 20, 64 << 10, 2);
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());  // two regions of the platform
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());
  EXPECT_EQ(watched_->pinned_allocs.load(), 2);  // one pool: both halves
  EXPECT_EQ(stager.Stats()["streams"], 2u);
  EXPECT_EQ(watched_->live_streams.load(), 2);

  auto held = AcquireNow(stager, 4096);
  ASSERT_TRUE(held.ok());
  stager.Unprepare(kCuda0);  // one region left
  stager.Unprepare(kCuda0);  // none, but a buffer is still out: the pool stays
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(stager.Stats()["pinned_bytes"], 1u << 20);
  EXPECT_EQ(watched_->pinned_frees.load(), 0);
  held->reset();  // the last use: freed now, by a stager thread
  ASSERT_TRUE(PinnedBecomes(stager, 0)) << stager.Stats().dump();
  EXPECT_EQ(watched_->pinned_frees.load(), 2);
  EXPECT_EQ(watched_->frees_elsewhere.load(), 0) << "pinned memory was freed off the stager's threads";
  EXPECT_EQ(stager.Stats()["pools_freed"], 1u);
  EXPECT_EQ(stager.Stats()["streams"], 0u);
  EXPECT_EQ(watched_->live_streams.load(), 0);
  EXPECT_EQ(AcquireNow(stager, 4096).status().code(), ErrorCode::kDeviceNotFound);

  // The next registration makes a new pool (and streams), which stages as before.
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());
  EXPECT_EQ(watched_->pinned_allocs.load(), 4);
  EXPECT_EQ(stager.Stats()["pinned_bytes"], 1u << 20);
  auto device = emulation_->Allocate(4096, AllocationKind::kDevice, 0);
  ASSERT_TRUE(device.ok());
  auto staging = AcquireNow(stager, 4096);
  ASSERT_TRUE(staging.ok()) << staging.status().ToString();
  memset((*staging)->data, 0x6b, 4096);
  EXPECT_TRUE(CopyAndWait(stager, *device, (*staging)->data, 4096).first.ok());
  EXPECT_EQ(static_cast<unsigned char*>(*device)[4095], 0x6b);
  staging->reset();
  stager.Unprepare(MemoryKind{MemoryType::kRocm, 0});  // never prepared: ignored
  stager.Unprepare(kCuda0);
  ASSERT_TRUE(PinnedBecomes(stager, 0));
  EXPECT_EQ(watched_->pinned_frees.load(), 4);
  EXPECT_EQ(watched_->frees_elsewhere.load(), 0);
  EXPECT_TRUE(emulation_->Free(*device, 4096, AllocationKind::kDevice).ok());
}

TEST_F(DeviceStagerPoolLifeTest, CopiesOfUnrelatedTransfersTakeDifferentStreams) {
  DeviceStager stager(&PlatformRegistry::Get(), 1 << 20, 64 << 10, 3);
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());
  auto device = emulation_->Allocate(3 * 4096, AllocationKind::kDevice, 0);
  ASSERT_TRUE(device.ok());
  std::vector<StagingRef> bufs;
  std::vector<std::future<Status>> done;
  std::vector<std::promise<Status>> promises(3);
  for (int i = 0; i < 3; ++i) {
    auto b = AcquireNow(stager, 4096);
    ASSERT_TRUE(b.ok());
    memset((*b)->data, 'a' + i, 4096);
    bufs.push_back(*b);
    done.push_back(promises[i].get_future());
    stager.Copy(kCuda0, static_cast<char*>(*device) + i * 4096, (*b)->data, 4096,
                [&promises, i](const Status& st) { promises[i].set_value(st); });
  }
  for (auto& f : done) EXPECT_TRUE(f.get().ok());
  auto used = watched_->copy_streams();
  ASSERT_EQ(used.size(), 3u);
  EXPECT_EQ(std::set<void*>(used.begin(), used.end()).size(), 3u) << "each copy on a stream of its own";
  EXPECT_EQ(std::count(used.begin(), used.end(), nullptr), 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(static_cast<char*>(*device)[i * 4096 + 100], 'a' + i);
  EXPECT_EQ(stager.Stats()["streams_per_device"], 3);
  EXPECT_TRUE(emulation_->Free(*device, 3 * 4096, AllocationKind::kDevice).ok());
}

TEST_F(DeviceStagerPoolLifeTest, ASlowCopyStartHoldsUpNoOtherUserAndStopStillWaitsForIt) {
  DeviceStager stager(&PlatformRegistry::Get(), 1 << 20, 64 << 10, 1);
  ASSERT_TRUE(stager.Prepare(kCuda0).ok());
  auto device = emulation_->Allocate(4096, AllocationKind::kDevice, 0);
  ASSERT_TRUE(device.ok());
  auto staging = AcquireNow(stager, 4096);
  ASSERT_TRUE(staging.ok());
  memset((*staging)->data, 0x5a, 4096);
  std::promise<Status> copied;
  watched_->HoldStarts();
  std::thread starter([&] {
    stager.Copy(kCuda0, *device, (*staging)->data, 4096, [&](const Status& st) { copied.set_value(st); });
  });
  ASSERT_TRUE(watched_->WaitForStarts(1));
  // The copy's platform call is in progress: every other use of the stager goes on meanwhile.
  auto others = std::async(std::launch::async, [&] {
    auto b = AcquireNow(stager, 4096);
    auto t = stager.TryAcquireOrNotify(kCuda0, StagingRole::kTarget, [] {});
    return b.ok() && t.ok() && *t != nullptr && stager.Stats()["in_use_bytes"] == 3u * (64 << 10);  // a chunk each
  });
  const bool went_on = others.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  // Stop, called while the copy is still starting, must wait for it and run its continuation before returning.
  auto stopped = std::async(std::launch::async, [&] { stager.Stop(); });
  const bool stop_waited = stopped.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout;
  watched_->ReleaseStarts();
  starter.join();
  stopped.get();
  EXPECT_TRUE(went_on) << "Acquire, TryAcquireOrNotify and Stats waited for another caller's copy to start";
  EXPECT_TRUE(others.get());
  EXPECT_TRUE(stop_waited) << "Stop returned while a copy was starting";
  auto done = copied.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(0)), std::future_status::ready) << "Stop returned before its continuation";
  EXPECT_TRUE(done.get().ok());
  EXPECT_EQ(static_cast<unsigned char*>(*device)[4095], 0x5a);
  staging->reset();
  EXPECT_TRUE(emulation_->Free(*device, 4096, AllocationKind::kDevice).ok());
}

TEST_F(DeviceStagerTest, SlicesAreCutToFitWhatOneSideOfThePoolHolds) {
  DeviceStager big(&PlatformRegistry::Get(), 128 << 20, 1 << 20);
  EXPECT_EQ(big.SliceFitting(1 << 20), 1u << 20);
  DeviceStager small(&PlatformRegistry::Get(), 128 << 10, 1 << 20);  // 64 KiB per side
  const size_t fit = small.SliceFitting(1 << 20);
  EXPECT_EQ(fit % 4096, 0u);
  EXPECT_LE(fit + fit / 4, small.role_bytes());
  EXPECT_GT(fit + 4096 + (fit + 4096) / 4, small.role_bytes()) << "the largest that fits";
  DeviceStager exact(&PlatformRegistry::Get(), 2 << 20, 1 << 20);  // one slice per side: a merged tail overflows
  EXPECT_LT(exact.SliceFitting(1 << 20), 1u << 20);
}

}  // namespace
}  // namespace mooncake::te::tcp
