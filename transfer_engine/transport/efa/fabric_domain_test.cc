// FabricDomain against libfabric's tcp;ofi_rxm provider in this process: RMA between two domains, the bound on
// operations in flight, malformed addresses, deadlines for a peer that never answers, and Stop.

#include "transfer_engine/transport/efa/fabric_domain.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace mooncake::te::efa {
namespace {

using Clock = std::chrono::steady_clock;

class Waiter {
 public:
  std::function<void(const Status&)> Callback() {
    {
      std::lock_guard lock(mu_);
      ++expected_;
    }
    return [this](const Status& st) {
      std::lock_guard lock(mu_);
      (st.ok() ? ok_ : failed_)++;
      if (!st.ok()) last_error_ = st;
      cv_.notify_all();
    };
  }
  bool Wait(std::chrono::seconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return ok_ + failed_ >= expected_; });
  }
  int ok() const { std::lock_guard lock(mu_); return ok_; }
  int failed() const { std::lock_guard lock(mu_); return failed_; }
  Status last_error() const { std::lock_guard lock(mu_); return last_error_; }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int expected_ = 0, ok_ = 0, failed_ = 0;
  Status last_error_;
};

class FabricDomainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto api = LoadFabricApi();
    ASSERT_TRUE(api.ok()) << api.status().ToString();
    api_ = *api;
  }
  std::shared_ptr<FabricDomain> Open(int max_outstanding = 64, int timeout_ms = 10000) {
    FabricDomain::Options o;
    o.provider = "tcp;ofi_rxm";
    o.domain_filter = "lo";
    o.max_outstanding = max_outstanding;
    o.op_timeout = std::chrono::milliseconds(timeout_ms);
    auto d = FabricDomain::Open(api_, o);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? *d : nullptr;
  }
  std::unique_ptr<FabricOp> Op(FabricOp::Kind kind, void* local, size_t len, fi_addr_t dest, uint64_t remote,
                               uint64_t key, Waiter& w) {
    auto op = std::make_unique<FabricOp>();
    op->kind = kind;
    op->local = local;
    op->length = len;
    op->dest = dest;
    op->remote_addr = remote;
    op->remote_key = key;
    op->done = w.Callback();
    return op;
  }
  const FabricApi* api_ = nullptr;
};

TEST_F(FabricDomainTest, RequestsAtMostVersionOneEighteen) {
  EXPECT_LE(api_->RequestVersion(), FI_VERSION(1, 18));
  EXPECT_EQ(api_->RequestVersion(), std::min<uint32_t>(api_->version(), FI_VERSION(1, 18)));
}

TEST_F(FabricDomainTest, UnknownProviderSaysWhy) {
  FabricDomain::Options o;
  o.provider = "no-such-provider";
  auto d = FabricDomain::Open(api_, o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("no-such-provider"), std::string::npos) << d.status().ToString();
}

TEST_F(FabricDomainTest, FilterThatMatchesNoDomainSaysWhich) {
  FabricDomain::Options o;
  o.provider = "tcp;ofi_rxm";
  o.domain_filter = "nope0";
  auto d = FabricDomain::Open(api_, o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_NE(d.status().message().find("lo"), std::string::npos) << "the domains seen: " << d.status().ToString();
}

TEST_F(FabricDomainTest, WritesAndReadsBetweenDomainsWithUniqueKeysAndBoundedOutstanding) {
  auto a = Open(/*max_outstanding=*/4), b = Open();
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(b->info().prov_key);  // tcp: the transport requests the keys
  std::vector<char> src(1 << 20), dst(1 << 20), back(1 << 20);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  auto src_mr = a->Register(src.data(), src.size(), FabricDomain::RemoteAccess::kNone);
  auto back_mr = a->Register(back.data(), back.size(), FabricDomain::RemoteAccess::kNone);
  auto dst_mr = b->Register(dst.data(), dst.size(), FabricDomain::RemoteAccess::kReadWrite);
  ASSERT_TRUE(src_mr.ok() && back_mr.ok() && dst_mr.ok());
  EXPECT_NE((*src_mr)->key(), (*back_mr)->key());
  auto peer = a->Insert(b->info().address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const uint64_t base = b->info().virt_addr ? reinterpret_cast<uint64_t>(dst.data()) : 0;
  Waiter writes;
  constexpr int kOps = 64;
  constexpr size_t kPiece = (1 << 20) / kOps;
  for (int i = 0; i < kOps; ++i) {
    auto op = Op(FabricOp::Kind::kWrite, src.data() + i * kPiece, kPiece, *peer, base + i * kPiece,
                 (*dst_mr)->key(), writes);
    op->local_desc = (*src_mr)->desc();
    a->Post(std::move(op));
    EXPECT_LE(a->in_flight(), 4u);
  }
  ASSERT_TRUE(writes.Wait(std::chrono::seconds(20)));
  EXPECT_EQ(writes.ok(), kOps) << writes.last_error().ToString();
  EXPECT_EQ(memcmp(src.data(), dst.data(), src.size()), 0);
  Waiter reads;
  a->Post(Op(FabricOp::Kind::kRead, back.data(), back.size(), *peer, base, (*dst_mr)->key(), reads));
  ASSERT_TRUE(reads.Wait(std::chrono::seconds(20)));
  EXPECT_EQ(reads.ok(), 1) << reads.last_error().ToString();
  EXPECT_EQ(memcmp(src.data(), back.data(), src.size()), 0);
}

TEST_F(FabricDomainTest, MalformedAddressesAreRefused) {
  auto a = Open();
  ASSERT_TRUE(a);
  for (const char* bad : {"", "abc", "zz", "0x12"}) {
    auto r = a->Insert(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "' was accepted";
  }
  EXPECT_FALSE(a->Insert(std::string(2000, 'a')).ok());
}

TEST_F(FabricDomainTest, OperationsToAPeerThatIsGoneEndInBoundedTime) {
  auto a = Open(64, /*timeout_ms=*/1500);
  std::string gone;
  {
    auto b = Open();
    ASSERT_TRUE(a && b);
    gone = b->info().address;
  }  // b's endpoint is closed: nothing answers at its address any more
  std::vector<char> buf(4096);
  auto mr = a->Register(buf.data(), buf.size(), FabricDomain::RemoteAccess::kNone);
  ASSERT_TRUE(mr.ok());
  auto peer = a->Insert(gone);
  ASSERT_TRUE(peer.ok());
  std::atomic<int> timeouts{0};
  a->set_on_timeout([&](fi_addr_t) { timeouts++; });
  Waiter w;
  auto start = Clock::now();
  for (int i = 0; i < 8; ++i) a->Post(Op(FabricOp::Kind::kWrite, buf.data(), buf.size(), *peer, 0, 1, w));
  ASSERT_TRUE(w.Wait(std::chrono::seconds(10))) << "operations to a closed endpoint did not end";
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(w.failed(), 8);
}

TEST_F(FabricDomainTest, RemovedAddressesFailTheirQueuedAndLaterOperations) {
  auto a = Open(/*max_outstanding=*/1, /*timeout_ms=*/20000);
  std::string gone;
  {
    auto b = Open();
    ASSERT_TRUE(a && b);
    gone = b->info().address;
  }
  std::vector<char> buf(4096);
  auto mr = a->Register(buf.data(), buf.size(), FabricDomain::RemoteAccess::kNone);
  ASSERT_TRUE(mr.ok());
  auto peer = a->Insert(gone);
  ASSERT_TRUE(peer.ok());
  Waiter w;
  auto start = Clock::now();
  for (int i = 0; i < 6; ++i) a->Post(Op(FabricOp::Kind::kWrite, buf.data(), buf.size(), *peer, 0, 1, w));
  a->Remove(*peer);
  a->Remove(*peer);  // idempotent
  a->Post(Op(FabricOp::Kind::kWrite, buf.data(), buf.size(), *peer, 0, 1, w));  // refused, not posted
  ASSERT_TRUE(w.Wait(std::chrono::seconds(15))) << "operations to a removed address did not end";
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << "they waited for their timeout";
  EXPECT_EQ(w.failed(), 7);
}

TEST_F(FabricDomainTest, StopCompletesEverythingOnceAndRefusesLaterWork) {
  auto a = Open();
  ASSERT_TRUE(a);
  std::vector<char> buf(4096);
  a->Stop();
  a->Stop();  // idempotent
  Waiter w;
  a->Post(Op(FabricOp::Kind::kWrite, buf.data(), buf.size(), 0, 0, 1, w));
  ASSERT_TRUE(w.Wait(std::chrono::seconds(1)));
  EXPECT_EQ(w.failed(), 1);
  EXPECT_FALSE(a->Register(buf.data(), buf.size(), FabricDomain::RemoteAccess::kNone).ok());
}

// Between BeginDrive and EndDrive the caller reaps its own completions (their `done` runs on its thread): the
// progress thread keeps out of the completion queue instead of taking them and handing them over.
TEST_F(FabricDomainTest, DriverReapsItsCompletionsOnItsOwnThread) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  std::vector<char> src(4096, 'x'), dst(4096);
  auto src_mr = a->Register(src.data(), src.size(), FabricDomain::RemoteAccess::kNone);
  auto dst_mr = b->Register(dst.data(), dst.size(), FabricDomain::RemoteAccess::kReadWrite);
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  auto peer = a->Insert(b->info().address);
  ASSERT_TRUE(peer.ok());
  const uint64_t base = b->info().virt_addr ? reinterpret_cast<uint64_t>(dst.data()) : 0;
  const auto me = std::this_thread::get_id();
  int elsewhere = 0;
  for (int i = 0; i < 50; ++i) {
    a->BeginDrive();
    std::atomic<bool> done{false};
    std::thread::id who;
    Status result;
    auto op = std::make_unique<FabricOp>();
    op->kind = FabricOp::Kind::kWrite;
    op->local = src.data();
    op->length = src.size();
    op->local_desc = (*src_mr)->desc();
    op->dest = *peer;
    op->remote_addr = base;
    op->remote_key = (*dst_mr)->key();
    op->done = [&](const Status& st) {
      who = std::this_thread::get_id();
      result = st;
      done.store(true);
    };
    a->Post(std::move(op));
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (!done.load() && Clock::now() < until) a->Poll(/*wait_ms=*/1);
    a->EndDrive();
    ASSERT_TRUE(done.load()) << i;
    ASSERT_TRUE(result.ok()) << result.ToString();
    if (who != me) ++elsewhere;
  }
  EXPECT_EQ(elsewhere, 0) << "completions reaped by the progress thread while a caller drove the domain";
}

// What a driver leaves outstanding completes on the progress thread.
TEST_F(FabricDomainTest, EndDriveLeavesOutstandingOperationsToTheProgressThread) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  std::vector<char> src(4096, 'y'), dst(4096);
  auto src_mr = a->Register(src.data(), src.size(), FabricDomain::RemoteAccess::kNone);
  auto dst_mr = b->Register(dst.data(), dst.size(), FabricDomain::RemoteAccess::kReadWrite);
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  auto peer = a->Insert(b->info().address);
  ASSERT_TRUE(peer.ok());
  Waiter w;
  a->BeginDrive();
  auto op = Op(FabricOp::Kind::kWrite, src.data(), src.size(), *peer,
               b->info().virt_addr ? reinterpret_cast<uint64_t>(dst.data()) : 0, (*dst_mr)->key(), w);
  op->local_desc = (*src_mr)->desc();
  a->Post(std::move(op));
  a->EndDrive();  // never polled
  ASSERT_TRUE(w.Wait(std::chrono::seconds(5)));
  EXPECT_EQ(w.ok(), 1) << w.last_error().ToString();
  EXPECT_EQ(dst[0], 'y');
}

// Polling providers (shm): an operation posted while the progress threads nap idle (efa.idle_poll_us, here
// 200 ms) is served at once, not after the nap: the initiator's thread is woken by the post, and the
// target's, which must progress a peer's RMA, polls briefly again once peers are active (FI_RMA_EVENT).
TEST_F(FabricDomainTest, PollingDomainsServeSmallWritesWithoutIdleNaps) {
  FabricDomain::Options o;
  o.provider = "shm";
  o.idle_poll_us = 200000;
  auto a = FabricDomain::Open(api_, o), b = FabricDomain::Open(api_, o);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << " " << b.status().ToString();
  ASSERT_FALSE((*a)->info().cq_wait);
  EXPECT_TRUE((*b)->info().remote_events) << "shm offers FI_RMA_EVENT";
  std::vector<char> src(4096, 'z'), dst(4096);
  auto src_mr = (*a)->Register(src.data(), src.size(), FabricDomain::RemoteAccess::kNone);
  auto dst_mr = (*b)->Register(dst.data(), dst.size(), FabricDomain::RemoteAccess::kReadWrite);
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  auto peer = (*a)->Insert((*b)->info().address);
  ASSERT_TRUE(peer.ok());
  const uint64_t base = (*b)->info().virt_addr ? reinterpret_cast<uint64_t>(dst.data()) : 0;
  auto write = [&] {
    Waiter w;
    auto op = Op(FabricOp::Kind::kWrite, src.data(), src.size(), *peer, base, (*dst_mr)->key(), w);
    op->local_desc = (*src_mr)->desc();
    (*a)->Post(std::move(op));
    EXPECT_TRUE(w.Wait(std::chrono::seconds(10)));
    EXPECT_EQ(w.ok(), 1) << w.last_error().ToString();
  };
  write();  // the target may still be in an idle nap
  constexpr int kWrites = 20;
  const auto t0 = Clock::now();
  for (int i = 0; i < kWrites; ++i) write();
  const auto took = Clock::now() - t0;
  // Idle naps would cost 100-400 ms per write (4-8 s in all).
  EXPECT_LT(took, std::chrono::milliseconds(1000))
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms for " << kWrites << " writes";
  EXPECT_EQ(dst[4095], 'z');
}

// An operation posted outside a drive right after one ended is reaped at once, not after the progress
// thread's linger (FabricDomain::kDriveLinger, 1 ms): back-to-back asynchronous transfers after a
// synchronous one keep their latency.
TEST_F(FabricDomainTest, AnOperationPostedRightAfterADriveIsNotHeldByTheLinger) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  std::vector<char> src(4096, 'l'), dst(4096);
  auto src_mr = a->Register(src.data(), src.size(), FabricDomain::RemoteAccess::kNone);
  auto dst_mr = b->Register(dst.data(), dst.size(), FabricDomain::RemoteAccess::kReadWrite);
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  auto peer = a->Insert(b->info().address);
  ASSERT_TRUE(peer.ok());
  const uint64_t base = b->info().virt_addr ? reinterpret_cast<uint64_t>(dst.data()) : 0;
  constexpr int kWrites = 40;
  Clock::duration total{};
  for (int i = -1; i < kWrites; ++i) {  // the first write (i = -1: connection setup) is not counted
    a->BeginDrive();
    a->EndDrive();  // nothing outstanding: the progress thread lingers
    Waiter w;
    auto op = Op(FabricOp::Kind::kWrite, src.data(), src.size(), *peer, base, (*dst_mr)->key(), w);
    op->local_desc = (*src_mr)->desc();
    const auto t0 = Clock::now();
    a->Post(std::move(op));
    ASSERT_TRUE(w.Wait(std::chrono::seconds(5)));
    if (i >= 0) total += Clock::now() - t0;
    ASSERT_EQ(w.ok(), 1) << w.last_error().ToString();
  }
  // Held by the linger, each would take most of 1 ms (about 40 ms in all); here a 4 KiB write takes tens of us.
  EXPECT_LT(total, std::chrono::milliseconds(16))
      << std::chrono::duration_cast<std::chrono::microseconds>(total).count() / kWrites << " us per write";
}

// A domain whose own caller drove it a moment ago keeps serving its peers' RMA (their progress is its
// progress thread's, tcp and shm alike): a target that runs a synchronous call every 200 us, so that its
// progress thread lingers all the time, still completes an initiator's writes promptly.
TEST_F(FabricDomainTest, ADomainThatLingersAfterDrivesStillServesPeersRma) {
  for (const char* provider : {"tcp;ofi_rxm", "shm"}) {
    SCOPED_TRACE(provider);
    FabricDomain::Options o;
    o.provider = provider;
    if (std::string(provider) != "shm") o.domain_filter = "lo";
    o.op_timeout = std::chrono::milliseconds(3000);
    auto ia = FabricDomain::Open(api_, o), ib = FabricDomain::Open(api_, o);
    ASSERT_TRUE(ia.ok() && ib.ok()) << ia.status().ToString() << " " << ib.status().ToString();
    auto a = *ia, b = *ib;
    std::vector<char> src(4096, 't'), dst(4096);
    auto src_mr = a->Register(src.data(), src.size(), FabricDomain::RemoteAccess::kNone);
    auto dst_mr = b->Register(dst.data(), dst.size(), FabricDomain::RemoteAccess::kReadWrite);
    ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
    auto peer = a->Insert(b->info().address);
    ASSERT_TRUE(peer.ok());
    const uint64_t base = b->info().virt_addr ? reinterpret_cast<uint64_t>(dst.data()) : 0;
    std::atomic<bool> done{false};
    std::thread target([&] {
      while (!done.load()) {
        b->BeginDrive();
        b->EndDrive();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    constexpr int kWrites = 20;
    int ok = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < kWrites; ++i) {
      Waiter w;
      auto op = Op(FabricOp::Kind::kWrite, src.data(), src.size(), *peer, base, (*dst_mr)->key(), w);
      op->local_desc = (*src_mr)->desc();
      a->Post(std::move(op));
      if (!w.Wait(std::chrono::seconds(5))) break;
      if (w.ok() != 1) break;
      ++ok;
    }
    const auto took = Clock::now() - t0;
    done.store(true);
    target.join();
    EXPECT_EQ(ok, kWrites) << "the target's progress stalled while it lingered";
    EXPECT_LT(took, std::chrono::milliseconds(1000))
        << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
    EXPECT_EQ(dst[4095], 't');
  }
}

// An operation whose post_by has passed is never posted: it fails with NotPostedInTime and nothing of it
// reaches the target; one without post_by, queued behind it, is posted.
TEST_F(FabricDomainTest, AnOperationPastItsPostByIsNotPosted) {
  auto a = Open(/*max_outstanding=*/1), b = Open();
  ASSERT_TRUE(a && b);
  std::vector<char> big(1 << 20, 'b'), small(4096, 's'), dst(1 << 20, '.'), dst2(4096, '.');
  auto big_mr = a->Register(big.data(), big.size(), FabricDomain::RemoteAccess::kNone);
  auto small_mr = a->Register(small.data(), small.size(), FabricDomain::RemoteAccess::kNone);
  auto dst_mr = b->Register(dst.data(), dst.size(), FabricDomain::RemoteAccess::kReadWrite);
  auto dst2_mr = b->Register(dst2.data(), dst2.size(), FabricDomain::RemoteAccess::kReadWrite);
  ASSERT_TRUE(big_mr.ok() && small_mr.ok() && dst_mr.ok() && dst2_mr.ok());
  auto peer = a->Insert(b->info().address);
  ASSERT_TRUE(peer.ok());
  const bool virt = b->info().virt_addr;
  Waiter first, late, last;
  auto op = Op(FabricOp::Kind::kWrite, big.data(), big.size(), *peer, virt ? reinterpret_cast<uint64_t>(dst.data()) : 0,
               (*dst_mr)->key(), first);
  op->local_desc = (*big_mr)->desc();
  a->Post(std::move(op));
  Status late_status;
  op = Op(FabricOp::Kind::kWrite, small.data(), small.size(), *peer,
          virt ? reinterpret_cast<uint64_t>(dst2.data()) : 0, (*dst2_mr)->key(), late);
  op->local_desc = (*small_mr)->desc();
  op->post_by = Clock::now() + std::chrono::microseconds(50);  // queued behind 1 MiB: not posted by then
  auto inner = std::move(op->done);
  op->done = [&late_status, inner](const Status& st) {
    late_status = st;
    inner(st);
  };
  a->Post(std::move(op));
  op = Op(FabricOp::Kind::kWrite, big.data(), 4096, *peer, virt ? reinterpret_cast<uint64_t>(dst.data()) : 0,
          (*dst_mr)->key(), last);
  op->local_desc = (*big_mr)->desc();
  a->Post(std::move(op));
  ASSERT_TRUE(first.Wait(std::chrono::seconds(5)) && late.Wait(std::chrono::seconds(5)) &&
              last.Wait(std::chrono::seconds(5)));
  EXPECT_EQ(first.ok(), 1);
  EXPECT_EQ(last.ok(), 1);
  EXPECT_EQ(late.failed(), 1);
  EXPECT_TRUE(IsNotPostedInTime(late_status)) << late_status.ToString();
  EXPECT_EQ(dst2[0], '.');
  EXPECT_EQ(dst2[4095], '.');
  EXPECT_EQ(dst[0], 'b');
}

}  // namespace
}  // namespace mooncake::te::efa
