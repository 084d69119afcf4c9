// The bounded staging pool between engines: device transfers far larger than MC_TCP_STAGING_POOL_BYTES, and many
// at once from several peers, complete with the right bytes while no engine pins more than its pool; pinned memory
// is allocated and freed only off the I/O threads; a target's failed device copy reaches the initiator as its own
// error (kMemory), not as an address rejection; a pool too small for two slices stages smaller slices.
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::tcp {
namespace {

constexpr size_t kPool = 1 << 20;    // per engine: 512 KiB per role
constexpr size_t kSlice = 64 << 10;  // 8 chunks per role

std::string ThreadName() {
  char name[32] = {0};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// A "rocm" platform for this test only: device memory is plain host memory, copies run in order on one worker
// thread; it records which threads allocate and free pinned memory and how much is pinned, and can fail copies.
class RecordingPlatform final : public Platform {
 public:
  RecordingPlatform() : worker_([this] { Run(); }) {}
  ~RecordingPlatform() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  std::string name() const override { return "recording_test"; }
  MemoryType device_type() const override { return MemoryType::kRocm; }
  PlatformProbe Probe() override { return {true, "test platform recording pinned allocations", 1}; }
  std::optional<MemoryKind> Classify(const void*) override { return std::nullopt; }
  StatusOr<void*> Allocate(size_t length, AllocationKind kind, int) override {
    void* p = aligned_alloc(4096, (length + 4095) / 4096 * 4096);
    if (!p) return Status(ErrorCode::kMemory, "out of memory");
    if (kind == AllocationKind::kPinnedHost) {
      std::lock_guard lock(mu_);
      pinned_threads.insert(ThreadName());
      pinned += length;
      peak_pinned = std::max(peak_pinned, pinned);
    }
    return p;
  }
  Status Free(void* ptr, size_t length, AllocationKind kind) override {
    if (kind == AllocationKind::kPinnedHost) {
      std::lock_guard lock(mu_);
      pinned_threads.insert(ThreadName());
      pinned -= length;
    }
    free(ptr);
    return Status::Ok();
  }
  StatusOr<std::string> ExportIpc(void*, size_t) override { return Status(ErrorCode::kNotImplemented, "no IPC"); }
  StatusOr<void*> ImportIpc(const std::string&, int, size_t) override {
    return Status(ErrorCode::kNotImplemented, "no IPC");
  }
  Status CloseIpc(void*, size_t) override { return Status(ErrorCode::kNotImplemented, "no IPC"); }
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t length, int,
                                                      void*) override {
    auto c = std::make_shared<CopyDone>();
    {
      std::lock_guard lock(mu_);
      jobs_.push_back({dst, src, length, fail_copies.load(), c});
    }
    cv_.notify_all();
    return std::unique_ptr<CopyCompletion>(new Completion(c));
  }

  std::atomic<bool> fail_copies{false};
  std::mutex mu_;
  std::set<std::string> pinned_threads;  // names of the threads that allocated or freed pinned memory
  size_t pinned = 0, peak_pinned = 0;

 private:
  struct CopyDone {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status st;
  };
  struct Job {
    void* dst;
    const void* src;
    size_t length;
    bool fail;
    std::shared_ptr<CopyDone> done;
  };
  class Completion final : public CopyCompletion {
   public:
    explicit Completion(std::shared_ptr<CopyDone> d) : d_(std::move(d)) {}
    bool Done() override {
      std::lock_guard lock(d_->mu);
      return d_->done;
    }
    Status Wait() override {
      std::unique_lock lock(d_->mu);
      d_->cv.wait(lock, [this] { return d_->done; });
      return d_->st;
    }

   private:
    std::shared_ptr<CopyDone> d_;
  };
  void Run() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      Job j = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      Status st = j.fail ? Status(ErrorCode::kMemory, "recording_test: injected copy failure") : Status::Ok();
      if (!j.fail) memcpy(j.dst, j.src, j.length);
      {
        std::lock_guard dl(j.done->mu);
        j.done->done = true;
        j.done->st = st;
      }
      j.done->cv.notify_all();
      lock.lock();
    }
  }
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread worker_;
};

class StagingPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    platform_ = std::make_shared<RecordingPlatform>();
    PlatformRegistry::Get().Register(platform_);
  }
  void TearDown() override {
    engines_.clear();
    PlatformRegistry::Get().Unregister("recording_test");
  }
  TransferEngine& MakeEngine(size_t slice, size_t pool = kPool) {
    EngineOptions o;
    o.local_server_name = "127.0.0.1";
    o.metadata_conn = "P2PHANDSHAKE";
    o.protocol = "tcp";
    o.transports = {"tcp"};
    o.transport_options = {{"tcp.staging_pool_bytes", std::to_string(pool)},
                           {"tcp.slice_size", std::to_string(slice)}};
    auto made = TransferEngine::Create(o);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    engines_.push_back(std::move(*made));
    return *engines_.back();
  }
  static Status Move(TransferEngine& from, void* local, TransferEngine& to, void* remote, size_t len, OpCode op) {
    auto h = from.OpenSegment(to.segment_name());
    if (!h.ok()) return h.status();
    TransferRequest r{op, local, *h, reinterpret_cast<uint64_t>(remote), len};
    return from.TransferSync({r}, std::chrono::seconds(60));
  }
  static nlohmann::json Staging(TransferEngine& e) {
    return nlohmann::json::parse(e.StatsJson())["listeners"]["tcp"]["staging"];
  }
  static void Fill(std::vector<char>& v, int seed) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>((i * 131 + seed) >> 3);
  }

  std::shared_ptr<RecordingPlatform> platform_;
  std::vector<std::unique_ptr<TransferEngine>> engines_;
};

TEST_F(StagingPoolTest, TransfersFarLargerThanThePoolFlowThroughItInChunks) {
  // a's slices (256 KiB) are four of b's chunks (64 KiB): b pipelines each frame through its pool in chunks.
  TransferEngine& a = MakeEngine(256 << 10);
  TransferEngine& b = MakeEngine(kSlice);
  constexpr size_t kLen = 24 << 20;  // 24 times either pool
  std::vector<char> dev_a(kLen), dev_b(kLen, 0), back(kLen, 0);
  Fill(dev_a, 1);
  ASSERT_TRUE(a.RegisterMemory(dev_a.data(), kLen, "rocm:0").ok());
  ASSERT_TRUE(a.RegisterMemory(back.data(), kLen, "rocm:0").ok());
  ASSERT_TRUE(b.RegisterMemory(dev_b.data(), kLen, "rocm:0").ok());
  ASSERT_TRUE(Move(a, dev_a.data(), b, dev_b.data(), kLen, OpCode::kWrite).ok());
  EXPECT_TRUE(dev_b == dev_a) << "device to device WRITE through both pools";
  ASSERT_TRUE(Move(a, back.data(), b, dev_b.data(), kLen, OpCode::kRead).ok());
  EXPECT_TRUE(back == dev_a) << "device to device READ through both pools";
  for (TransferEngine* e : {&a, &b}) {
    auto st = Staging(*e);
    EXPECT_EQ(st["pool_bytes"], kPool);
    EXPECT_LE(st["pinned_bytes"].get<size_t>(), kPool) << st.dump();
    EXPECT_LE(st["peak_in_use_bytes"].get<size_t>(), kPool) << st.dump();
    EXPECT_GT(st["peak_in_use_bytes"].get<size_t>(), 0u) << st.dump();
  }
  EXPECT_GT(Staging(a)["acquire_waits"].get<uint64_t>(), 0u) << "the initiator queued for its pool";
  {
    std::lock_guard lock(platform_->mu_);
    EXPECT_LE(platform_->peak_pinned, 2 * kPool) << "two engines, one pool each";
  }
}

TEST_F(StagingPoolTest, APoolSmallerThanTwoSlicesStagesSmallerSlices) {
  // 128 KiB (the least allowed): 64 KiB per side, far less than a 1 MiB slice; and 2 x 1 MiB, where a slice with a
  // merged tail (1.25 MiB) would not fit either. Device transfers work, through slices cut to fit.
  for (size_t pool : {size_t{128} << 10, size_t{2} << 20}) {
    TransferEngine& a = MakeEngine(1 << 20, pool);
    TransferEngine& b = MakeEngine(1 << 20, pool);
    constexpr size_t kLen = (4 << 20) + (200 << 10);  // four slices and a tail that merges into the last
    std::vector<char> dev_a(kLen), dev_b(kLen, 0), back(kLen, 0);
    Fill(dev_a, 7);
    ASSERT_TRUE(a.RegisterMemory(dev_a.data(), kLen, "rocm:0").ok());
    ASSERT_TRUE(a.RegisterMemory(back.data(), kLen, "rocm:0").ok());
    ASSERT_TRUE(b.RegisterMemory(dev_b.data(), kLen, "rocm:0").ok());
    Status wrote = Move(a, dev_a.data(), b, dev_b.data(), kLen, OpCode::kWrite);
    ASSERT_TRUE(wrote.ok()) << "pool " << pool << ": " << wrote.ToString();
    EXPECT_TRUE(dev_b == dev_a) << "pool " << pool;
    Status read = Move(a, back.data(), b, dev_b.data(), kLen, OpCode::kRead);
    ASSERT_TRUE(read.ok()) << "pool " << pool << ": " << read.ToString();
    EXPECT_TRUE(back == dev_a) << "pool " << pool;
    auto st = Staging(a);
    EXPECT_EQ(st["pool_bytes"], pool);
    EXPECT_LE(st["peak_in_use_bytes"].get<size_t>(), pool) << st.dump();
    EXPECT_EQ(st["copy_errors"], 0u) << st.dump();
    engines_.clear();
  }
}

TEST_F(StagingPoolTest, ThePoolIsFreedWithTheLastDeviceRegionAndComesBackWithTheNext) {
  TransferEngine& a = MakeEngine(kSlice);
  TransferEngine& b = MakeEngine(kSlice);
  constexpr size_t kLen = 1 << 20;
  std::vector<char> dev(kLen), host(kLen, 0);
  Fill(dev, 3);
  ASSERT_TRUE(b.RegisterMemory(host.data(), kLen, "cpu").ok());
  for (int round = 1; round <= 2; ++round) {
    ASSERT_TRUE(a.RegisterMemory(dev.data(), kLen, "rocm:0").ok());
    ASSERT_TRUE(Move(a, dev.data(), b, host.data(), kLen, OpCode::kWrite).ok());
    EXPECT_TRUE(host == dev);
    EXPECT_GT(Staging(a)["pinned_bytes"].get<size_t>(), 0u);
    ASSERT_TRUE(a.UnregisterMemory(dev.data()).ok());
    // Freed on a stager thread, not the caller's: wait (bounded) for it.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (Staging(a)["pinned_bytes"].get<size_t>() != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto st = Staging(a);
    EXPECT_EQ(st["pinned_bytes"].get<size_t>(), 0u) << st.dump();
    EXPECT_EQ(st["pools_freed"].get<uint64_t>(), static_cast<uint64_t>(round)) << st.dump();
  }
}

TEST_F(StagingPoolTest, ConcurrentTransfersFromSeveralPeersStayWithinTheTargetsPool) {
  TransferEngine& target = MakeEngine(kSlice);
  constexpr size_t kLen = 4 << 20;
  constexpr int kPeers = 3;
  std::vector<char> dev_t(kPeers * kLen, 0);
  ASSERT_TRUE(target.RegisterMemory(dev_t.data(), dev_t.size(), "rocm:0").ok());
  std::vector<TransferEngine*> peers;
  std::vector<std::vector<char>> src(kPeers, std::vector<char>(kLen)), host(kPeers, std::vector<char>(kLen, 0));
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(&MakeEngine(kSlice));
    Fill(src[i], 10 + i);
    ASSERT_TRUE(peers[i]->RegisterMemory(src[i].data(), kLen, "rocm:0").ok());
    ASSERT_TRUE(peers[i]->RegisterMemory(host[i].data(), kLen).ok());
  }
  std::vector<std::future<Status>> running;
  for (int i = 0; i < kPeers; ++i) {
    running.push_back(std::async(std::launch::async, [&, i] {
      for (int round = 0; round < 2; ++round) {
        Status st = Move(*peers[i], src[i].data(), target, dev_t.data() + i * kLen, kLen, OpCode::kWrite);
        if (!st.ok()) return st;
        st = Move(*peers[i], host[i].data(), target, dev_t.data() + i * kLen, kLen, OpCode::kRead);  // host <- device
        if (!st.ok()) return st;
      }
      return Status::Ok();
    }));
  }
  for (auto& r : running) ASSERT_TRUE(r.get().ok());
  for (int i = 0; i < kPeers; ++i) {
    EXPECT_EQ(0, memcmp(dev_t.data() + i * kLen, src[i].data(), kLen)) << "peer " << i;
    EXPECT_TRUE(host[i] == src[i]) << "peer " << i;
  }
  auto st = Staging(target);
  EXPECT_LE(st["pinned_bytes"].get<size_t>(), kPool) << st.dump();
  EXPECT_LE(st["peak_in_use_bytes"].get<size_t>(), kPool) << st.dump();
  std::lock_guard lock(platform_->mu_);
  EXPECT_LE(platform_->peak_pinned, (kPeers + 1) * kPool);
}

TEST_F(StagingPoolTest, PinnedMemoryIsNeverAllocatedOrFreedOnAnIoThread) {
  {
    TransferEngine& a = MakeEngine(kSlice);
    TransferEngine& b = MakeEngine(kSlice);
    constexpr size_t kLen = 2 << 20;
    std::vector<char> host_a(kLen), dev_b(kLen, 0), back(kLen, 0);
    Fill(host_a, 3);
    ASSERT_TRUE(a.RegisterMemory(host_a.data(), kLen).ok());
    ASSERT_TRUE(a.RegisterMemory(back.data(), kLen).ok());
    ASSERT_TRUE(b.RegisterMemory(dev_b.data(), kLen, "rocm:0").ok());
    // Only the target stages here: its I/O threads receive into, and send from, pinned memory.
    ASSERT_TRUE(Move(a, host_a.data(), b, dev_b.data(), kLen, OpCode::kWrite).ok());
    ASSERT_TRUE(Move(a, back.data(), b, dev_b.data(), kLen, OpCode::kRead).ok());
    EXPECT_TRUE(back == host_a);
    engines_.clear();  // frees the pools
  }
  std::lock_guard lock(platform_->mu_);
  EXPECT_EQ(platform_->pinned, 0u) << "every pool was freed";
  ASSERT_FALSE(platform_->pinned_threads.empty());
  for (const std::string& name : platform_->pinned_threads) {
    EXPECT_EQ(name.rfind("mc-tcp-io", 0), std::string::npos) << "pinned memory allocated or freed on " << name;
  }
}

TEST_F(StagingPoolTest, ATargetsFailedDeviceCopyIsReportedAsSuchNotAsARejection) {
  TransferEngine& a = MakeEngine(kSlice);
  TransferEngine& b = MakeEngine(kSlice);
  constexpr size_t kLen = 256 << 10;
  std::vector<char> host_a(kLen, 'h'), dev_b(kLen, 'd');
  ASSERT_TRUE(a.RegisterMemory(host_a.data(), kLen).ok());
  ASSERT_TRUE(b.RegisterMemory(dev_b.data(), kLen, "rocm:0").ok());
  ASSERT_TRUE(Move(a, host_a.data(), b, dev_b.data(), kLen, OpCode::kWrite).ok());  // connections made
  platform_->fail_copies = true;  // only b copies: a's memory is host memory
  for (OpCode op : {OpCode::kWrite, OpCode::kRead}) {
    Status st = Move(a, host_a.data(), b, dev_b.data(), kLen, op);
    EXPECT_EQ(st.code(), ErrorCode::kMemory) << st.ToString();
    EXPECT_NE(st.message().find("device copy failed"), std::string::npos) << st.ToString();
  }
  platform_->fail_copies = false;
  EXPECT_TRUE(Move(a, host_a.data(), b, dev_b.data(), kLen, OpCode::kRead).ok()) << "the connection lives on";
  EXPECT_GT(Staging(b)["copy_errors"].get<uint64_t>(), 0u);
}

}  // namespace
}  // namespace mooncake::te::tcp
