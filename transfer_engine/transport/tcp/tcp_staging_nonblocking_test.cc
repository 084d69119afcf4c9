// Staged device memory never blocks tcp's I/O threads: with a test platform whose copies take a second, host
// transfers on the same engines (initiator side) and into the same target (target side) finish while staged
// transfers wait for their copies, and the staged ones still arrive intact afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::tcp {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kCopyDelay = std::chrono::milliseconds(1500);

// Milliseconds since `t` (readable in failure messages).
long long MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// A "rocm" platform for this test only: device memory is plain host memory and every copy takes kCopyDelay
// (on a thread of its own), like a device whose copy engine is busy.
class SlowCopyPlatform final : public Platform {
 public:
  std::string name() const override { return "slow_copy_test"; }
  MemoryType device_type() const override { return MemoryType::kRocm; }
  PlatformProbe Probe() override { return {true, "test platform with 1.5 s copies", 1}; }
  std::optional<MemoryKind> Classify(const void*) override { return std::nullopt; }
  StatusOr<void*> Allocate(size_t length, AllocationKind, int) override {
    void* p = aligned_alloc(4096, (length + 4095) / 4096 * 4096);
    if (!p) return Status(ErrorCode::kMemory, "out of memory");
    return p;
  }
  Status Free(void* ptr, size_t, AllocationKind) override {
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
    copies_started.fetch_add(1);
    auto done = std::async(std::launch::async, [dst, src, length] {
      std::this_thread::sleep_for(kCopyDelay);
      memcpy(dst, src, length);
      return Status::Ok();
    });
    return std::unique_ptr<CopyCompletion>(new Completion(std::move(done)));
  }
  std::atomic<int> copies_started{0};

 private:
  class Completion final : public CopyCompletion {
   public:
    explicit Completion(std::future<Status> f) : f_(std::move(f)) {}
    ~Completion() override {
      if (f_.valid()) f_.wait();
    }
    bool Done() override { return f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
    Status Wait() override { return f_.valid() ? f_.get() : Status::Ok(); }

   private:
    std::future<Status> f_;
  };
};

class StagingNonBlockingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    platform_ = std::make_shared<SlowCopyPlatform>();
    PlatformRegistry::Get().Register(platform_);
    for (auto* e : {&a_, &b_, &c_}) {
      EngineOptions o;
      o.local_server_name = "127.0.0.1";
      o.metadata_conn = "P2PHANDSHAKE";
      o.protocol = "tcp";
      o.transports = {"tcp"};
      // One I/O thread and one connection per peer: a copy waited for on the loop would stall every answer, and
      // multi-slice host transfers (below) need the loop to read their answers.
      o.transport_options = {{"tcp.io_threads", "1"}, {"tcp.lanes_per_peer", "1"}};
      auto made = TransferEngine::Create(o);
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      *e = std::move(*made);
    }
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    c_.reset();
    PlatformRegistry::Get().Unregister("slow_copy_test");
  }

  static Status Write(TransferEngine& from, void* src, TransferEngine& to, void* dst, size_t len, OpCode op) {
    auto h = from.OpenSegment(to.segment_name());
    if (!h.ok()) return h.status();
    TransferRequest r{op, src, *h, reinterpret_cast<uint64_t>(dst), len};
    return from.TransferSync({r}, std::chrono::seconds(30));
  }

  // Whether the platform started a copy beyond the first `count` within 10 s.
  bool CopyStartedSince(int count) {
    auto until = Clock::now() + std::chrono::seconds(10);
    while (platform_->copies_started.load() == count && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return platform_->copies_started.load() > count;
  }

  std::shared_ptr<SlowCopyPlatform> platform_;
  std::unique_ptr<TransferEngine> a_, b_, c_;
};

TEST_F(StagingNonBlockingTest, HostTransfersPassStagedOnesWaitingForTheirCopies) {
  constexpr size_t kDev = 1 << 20, kHost = 2 << 20;  // host transfers: two slices, so never driven by the caller
  std::vector<char> dev_a(kDev, 'd'), dev_b(kDev, 0), host_a(kHost, 'h'), host_b(kHost, 0), host_c(kHost, 'c');
  ASSERT_TRUE(a_->RegisterMemory(dev_a.data(), kDev, "rocm:0").ok());  // "device" memory of the slow platform
  ASSERT_TRUE(a_->RegisterMemory(host_a.data(), kHost).ok());
  ASSERT_TRUE(b_->RegisterMemory(dev_b.data(), kDev, "rocm:0").ok());
  ASSERT_TRUE(b_->RegisterMemory(host_b.data(), kHost).ok());
  ASSERT_TRUE(c_->RegisterMemory(host_c.data(), kHost).ok());
  ASSERT_TRUE(Write(*a_, host_a.data(), *b_, host_b.data(), kHost, OpCode::kWrite).ok());  // connections made
  ASSERT_TRUE(Write(*c_, host_c.data(), *b_, host_b.data(), kHost, OpCode::kWrite).ok());

  // Initiator side: a's device WRITE waits for its staging copy; a's host transfer must not wait behind it.
  auto start = Clock::now();
  auto staged = std::async(std::launch::async,
                           [&] { return Write(*a_, dev_a.data(), *b_, dev_b.data(), kDev, OpCode::kWrite); });
  ASSERT_TRUE(CopyStartedSince(0)) << staged.get().ToString();
  ASSERT_TRUE(Write(*a_, host_a.data(), *b_, host_b.data(), kHost, OpCode::kWrite).ok());
  EXPECT_LT(MsSince(start), kCopyDelay.count() / 2) << "a host transfer waited for a staging copy";
  ASSERT_TRUE(staged.get().ok());
  EXPECT_GE(MsSince(start), 2 * kCopyDelay.count()) << "two copies (a's to staging, b's to its device) ran";
  EXPECT_EQ(dev_b[kDev - 1], 'd');

  // Target side: b stages a READ of its device memory (a copy that takes kCopyDelay) for a; meanwhile c's write
  // into b's host memory is answered by b's I/O threads.
  memset(dev_b.data(), 'r', kDev);
  const int before = platform_->copies_started.load();
  start = Clock::now();
  auto read = std::async(std::launch::async,
                         [&] { return Write(*a_, host_a.data(), *b_, dev_b.data(), kDev, OpCode::kRead); });
  ASSERT_TRUE(CopyStartedSince(before)) << read.get().ToString();
  ASSERT_TRUE(Write(*c_, host_c.data(), *b_, host_b.data(), kHost, OpCode::kWrite).ok());
  EXPECT_LT(MsSince(start), kCopyDelay.count() / 2) << "the target's I/O thread waited for a staging copy";
  ASSERT_TRUE(read.get().ok());
  EXPECT_EQ(host_a[0], 'r');
  EXPECT_EQ(host_b[0], 'c');

  // Initiator side, READ: the payload for a's device memory arrives on a's loop, which starts the copy into the
  // device and goes on; a's host transfer is answered meanwhile.
  memset(host_b.data(), 'x', kHost);
  const int before_read = platform_->copies_started.load();
  start = Clock::now();
  auto dev_read = std::async(std::launch::async,
                             [&] { return Write(*a_, dev_a.data(), *b_, host_b.data(), kDev, OpCode::kRead); });
  ASSERT_TRUE(CopyStartedSince(before_read)) << dev_read.get().ToString();
  ASSERT_TRUE(Write(*a_, host_a.data(), *b_, host_b.data(), kHost, OpCode::kWrite).ok());
  EXPECT_LT(MsSince(start), kCopyDelay.count() / 2) << "the initiator's I/O thread waited for a staging copy";
  ASSERT_TRUE(dev_read.get().ok());
  EXPECT_GE(MsSince(start), kCopyDelay.count());
  EXPECT_TRUE(dev_a[0] == 'x' || dev_a[0] == 'r') << "the READ landed in a's device memory";
  EXPECT_TRUE(a_->UnregisterMemory(dev_a.data()).ok());
  EXPECT_TRUE(b_->UnregisterMemory(dev_b.data()).ok());
}

}  // namespace
}  // namespace mooncake::te::tcp
