// The engine's retry and failover rules (core/engine.cc RetrySlice / RunRetries), driven through the fault
// transport around real tcp transports, with the target engine in this process and in a child process.
#include "transfer_engine/transport/testing/fault_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/conformance/pattern.h"
#include "transfer_engine/transport/conformance/target.h"

namespace mooncake::te::testing {
namespace {

using conformance::Digest;
using conformance::FillPattern;
using conformance::MatchesPattern;
using conformance::Target;
using Clock = std::chrono::steady_clock;

constexpr size_t kSlice = 1 << 20;    // every transport here cuts 1 MiB slices
constexpr size_t kLen = 4 * kSlice;   // so a 4 MiB request is 4 slices in one post
constexpr size_t kSize = 8 << 20;

std::shared_ptr<FaultController> Controller(const std::string& name) {
  auto c = RegisterFaultTransport(name, "tcp");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  (*c)->Reset();
  return *c;
}

EngineOptions Options(std::vector<std::string> transports) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = transports.front();  // the first is the preferred path
  for (const auto& t : transports) o.transport_options[t + ".slice_size"] = std::to_string(kSlice);
  o.transports = std::move(transports);
  return o;
}

uint64_t CarriedBytes(const TransferEngine& e, const std::string& transport) {
  auto j = nlohmann::json::parse(e.StatsJson(), nullptr, false);
  uint64_t sum = 0;
  if (!j.is_object() || !j.contains(transport)) return 0;
  for (const auto& [path, c] : j[transport].items()) {
    if (c.is_object() && c.contains("bytes") && c["bytes"].is_number_unsigned()) sum += c["bytes"].get<uint64_t>();
  }
  return sum;
}

// RPC requests the target has served (a P2P descriptor refresh is one).
uint64_t Served(Target& t) {
  auto s = t.Stats();
  if (!s.ok()) return 0;
  auto j = nlohmann::json::parse(*s, nullptr, false);
  return j.is_object() ? j["listeners"]["rpc"].value("served", uint64_t{0}) : 0;
}

// An initiator with the given transports and a tcp-only target, in this process or a child.
class FaultTest : public ::testing::TestWithParam<conformance::PeerMode> {
 protected:
  // `other_host`: the child runs in another PID namespace (another host_id); kNotImplemented in `why` without
  // the privilege.
  void Make(std::vector<std::string> transports, int retry_count = 9, bool other_host = false,
            Status* why = nullptr) {
    conformance::TargetOptions to;
    to.engine = Options({"tcp"});
    to.buffer_size = kSize;
    to.other_host = other_host;
    auto t = GetParam() == conformance::PeerMode::kInProcess ? conformance::StartInProcessTarget(to)
                                                              : conformance::StartPeerProcessTarget(to);
    if (why) *why = t.status();
    if (why && t.status().code() == ErrorCode::kNotImplemented) return;
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    target_ = std::move(t.value());
    EngineOptions o = Options(std::move(transports));
    o.config.retry_count = retry_count;
    auto a = TransferEngine::Create(o);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    a_ = std::move(a.value());
    src_.resize(kSize);
    FillPattern(src_.data(), kSize, 1, 0);
    ASSERT_TRUE(a_->RegisterMemory(src_.data(), src_.size()).ok());
    auto h = a_->OpenSegment(target_->segment_name());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    peer_ = *h;
  }

  TransferRequest Req(OpCode op, size_t len, size_t offset = 0) {
    return TransferRequest{op, src_.data() + offset, peer_, target_->buffer_address() + offset, len};
  }
  Status Write(size_t len, std::chrono::nanoseconds timeout = std::chrono::seconds(20)) {
    return a_->TransferSync({Req(OpCode::kWrite, len)}, timeout);
  }
  void ExpectArrived(size_t len) {
    auto d = target_->DigestOf(0, len);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, Digest(src_.data(), len)) << "the bytes did not arrive intact";
  }

  std::vector<uint8_t> src_;
  std::unique_ptr<Target> target_;
  std::unique_ptr<TransferEngine> a_;
  SegmentHandle peer_ = kInvalidSegment;
};

// --- kOtherPath -----------------------------------------------------------------------------------------

TEST_P(FaultTest, FailedPostMovesTheSlicesToAnotherTransport) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp", "tcp"}));
  FaultPlan plan;
  plan.fail_posts = -1;
  c->SetPlan(plan);
  Status st = Write(kLen);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectArrived(kLen);
  ASSERT_TRUE(target_->Fill(0, kLen, 77).ok());
  st = a_->TransferSync({Req(OpCode::kRead, kLen)}, std::chrono::seconds(20));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(MatchesPattern(src_.data(), kLen, 77, 0)) << "the read did not arrive intact";
  FaultCounters n = c->counters();
  EXPECT_EQ(n.posts, 2u);  // one per request: each slice failed once, then went elsewhere
  EXPECT_EQ(n.failed_post_slices, 2 * kLen / kSlice);
  EXPECT_EQ(n.forwarded_slices, 0u);
  EXPECT_EQ(CarriedBytes(*a_, "faulty_tcp"), 0u);
  EXPECT_EQ(CarriedBytes(*a_, "tcp"), 2 * kLen);
}

TEST_P(FaultTest, ErrorCompletionOnOnePathMovesOnlyThoseSlices) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp", "tcp"}));
  FaultPlan plan;
  plan.fail_every_nth = 2;
  c->SetPlan(plan);
  auto batch = a_->AllocateBatch(1);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(a_->Submit(*batch, {Req(OpCode::kWrite, 2 * kLen)}).ok());
  auto s = a_->WaitBatch(*batch, std::chrono::seconds(20));
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->state, TransferState::kCompleted) << a_->GetTaskError(*batch, 0).ToString();
  EXPECT_EQ(s->transferred_bytes, 2 * kLen);
  ExpectArrived(2 * kLen);
  FaultCounters n = c->counters();
  EXPECT_EQ(n.forwarded_slices, 2 * kLen / kSlice);
  EXPECT_EQ(n.failed_completions, kLen / kSlice);  // every 2nd
  EXPECT_EQ(n.slices, 2 * kLen / kSlice);          // none came back to the failing path
  EXPECT_EQ(CarriedBytes(*a_, "tcp"), kLen);       // the failed half, moved again
}

TEST_P(FaultTest, WithNoOtherTransportTheTaskFailsWithTheFirstError) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp"}));
  FaultPlan plan;
  plan.fail_posts = -1;
  c->SetPlan(plan);
  Status st = Write(kLen);
  EXPECT_EQ(st.code(), ErrorCode::kSocket) << st.ToString();
  EXPECT_NE(st.message().find("injected by fault transport 'faulty_tcp': post to"), std::string::npos)
      << st.ToString();
  EXPECT_EQ(c->counters().slices, kLen / kSlice) << "a slice was moved again with no other transport";

  plan = FaultPlan{};
  plan.fail_every_nth = 1;  // every completion fails
  c->SetPlan(plan);
  auto batch = a_->AllocateBatch(1);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(a_->Submit(*batch, {Req(OpCode::kWrite, kSlice)}).ok());
  auto s = a_->WaitBatch(*batch, std::chrono::seconds(20));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->state, TransferState::kFailed);
  Status e = a_->GetTaskError(*batch, 0);
  EXPECT_EQ(e.code(), ErrorCode::kSocket) << e.ToString();
  EXPECT_NE(e.message().find("error completion"), std::string::npos) << e.ToString();
}

TEST_P(FaultTest, AnotherPathMustReachThePeer) {
  if (GetParam() != conformance::PeerMode::kTwoProcess) GTEST_SKIP() << "another host needs a second process";
  auto c = Controller("faulty_tcp");
  Status why;
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp", "shm"}, 9, /*other_host=*/true, &why));
  if (why.code() == ErrorCode::kNotImplemented) GTEST_SKIP() << why.message();
  ASSERT_TRUE(a_ != nullptr);
  FaultPlan plan;
  plan.fail_posts = -1;
  c->SetPlan(plan);
  Status st = Write(kSlice);
  EXPECT_EQ(st.code(), ErrorCode::kSocket) << st.ToString();
  EXPECT_NE(st.message().find("no other transport can reach the peer"), std::string::npos) << st.ToString();
  EXPECT_EQ(CarriedBytes(*a_, "shm"), 0u) << "shm moved a slice to an engine of another host";
  EXPECT_EQ(c->counters().slices, 1u);
}

TEST_P(FaultTest, PathChangesAreBoundedByTheRetryCount) {
  std::vector<std::string> names = {"faulty_a", "faulty_b", "faulty_c", "faulty_d"};
  std::vector<std::shared_ptr<FaultController>> cs;
  FaultPlan plan;
  plan.fail_posts = -1;
  for (const auto& n : names) {
    cs.push_back(Controller(n));
    cs.back()->SetPlan(plan);
  }
  auto posted = [&] {
    uint64_t sum = 0;
    for (auto& c : cs) sum += c->counters().slices;
    return sum;
  };
  ASSERT_NO_FATAL_FAILURE(Make(names, /*retry_count=*/2));  // MC_RETRY_CNT=2: two path changes
  Status st = Write(kSlice);
  EXPECT_EQ(st.code(), ErrorCode::kSocket) << st.ToString();
  EXPECT_EQ(posted(), 3u) << "the first path and two more";
  EXPECT_EQ(cs[3]->counters().slices, 0u) << "a fourth path was tried";
}

TEST_P(FaultTest, PathChangesStopWhenEveryTransportFailedTheSlice) {
  std::vector<std::string> names = {"faulty_a", "faulty_b", "faulty_c"};
  std::vector<std::shared_ptr<FaultController>> cs;
  FaultPlan plan;
  plan.fail_posts = -1;
  for (const auto& n : names) {
    cs.push_back(Controller(n));
    cs.back()->SetPlan(plan);
  }
  ASSERT_NO_FATAL_FAILURE(Make(names, /*retry_count=*/9));
  Status st = Write(kSlice);
  EXPECT_EQ(st.code(), ErrorCode::kSocket) << st.ToString();
  for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(cs[i]->counters().slices, 1u) << names[i];
  EXPECT_NE(st.message().find("no other transport can reach the peer"), std::string::npos) << st.ToString();
}

// MC_RETRY_CNT=0 should mean "no path change" (README: path changes a slice may make before its transfer fails).
// Disabled: RetrySlice bounds engine_attempts by max(1, retry_count), so 0 still allows one change.
TEST_P(FaultTest, RetryCountZeroMeansNoPathChange) {
  auto a = Controller("faulty_a");
  auto b = Controller("faulty_b");
  FaultPlan plan;
  plan.fail_posts = -1;
  a->SetPlan(plan);
  b->SetPlan(plan);
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_a", "faulty_b"}, /*retry_count=*/0));
  EXPECT_EQ(Write(kSlice).code(), ErrorCode::kSocket);
  EXPECT_EQ(a->counters().slices, 1u);
  EXPECT_EQ(b->counters().slices, 0u) << "the slice changed path although MC_RETRY_CNT=0";
}

// --- kRefreshPeer ---------------------------------------------------------------------------------------

TEST_P(FaultTest, RefreshWithAChangedDescriptorMovesTheSlicesAgain) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp"}));
  ASSERT_TRUE(Write(4096).ok());  // the descriptor is cached
  ASSERT_TRUE(target_->RegisterExtra(65536).ok());  // and now differs from the target's
  c->Reset();
  FaultPlan plan;
  plan.vanish_posts = 1;
  c->SetPlan(plan);
  uint64_t served = Served(*target_);
  Status st = Write(kLen);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectArrived(kLen);
  FaultCounters n = c->counters();
  EXPECT_EQ(n.vanished_slices, kLen / kSlice);
  EXPECT_EQ(n.forwarded_slices, kLen / kSlice);  // each moved again exactly once
  EXPECT_EQ(n.slices, 2 * kLen / kSlice);
  EXPECT_EQ(Served(*target_) - served, 1u) << "one descriptor refresh for the whole wave";
}

TEST_P(FaultTest, RefreshWaveFetchesOnceAndMovesEachSliceAtMostOnce) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp"}));
  ASSERT_TRUE(Write(4096).ok());  // the descriptor is cached
  c->Reset();
  FaultPlan plan;
  plan.vanish_posts = -1;  // the peer keeps looking gone: no retry storm
  c->SetPlan(plan);
  uint64_t served = Served(*target_);
  auto start = Clock::now();
  Status st = Write(kLen);
  EXPECT_EQ(st.code(), ErrorCode::kPeerUnreachable) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  FaultCounters n = c->counters();
  EXPECT_LE(n.slices, 2 * kLen / kSlice) << "a slice was moved again more than once after refreshes";
  EXPECT_EQ(Served(*target_) - served, 1u) << "one descriptor refresh for the whole wave";
}

// A refresh that returns the same descriptor still moves each slice once more, on fresh connections (a peer
// that dropped our connections, e.g. evicted under a connection flood, is reached again), and only once.
TEST_P(FaultTest, RefreshWithAnUnchangedDescriptorMovesEachSliceOnceMore) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp"}));
  ASSERT_TRUE(Write(4096).ok());  // the descriptor is cached
  c->Reset();
  FaultPlan plan;
  plan.vanish_posts = -1;
  c->SetPlan(plan);
  Status st = Write(kLen);
  EXPECT_EQ(st.code(), ErrorCode::kPeerUnreachable) << st.ToString();
  EXPECT_EQ(c->counters().slices, 2 * kLen / kSlice) << "each slice is moved exactly once more after a refresh";
}

TEST_P(FaultTest, APeerThatReallyVanishedFailsAfterOneRefresh) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp", "tcp"}));
  ASSERT_TRUE(Write(4096).ok());  // the descriptor is cached
  c->Reset();
  FaultPlan plan;
  plan.vanish_posts = -1;
  plan.on_vanish = [this] { target_->Vanish(); };  // destroyed / SIGKILLed before the slices fail
  c->SetPlan(plan);
  auto start = Clock::now();
  Status st = Write(kLen);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(st.code(), ErrorCode::kPeerUnreachable) << st.ToString();
  EXPECT_NE(st.message().find("refreshing the peer's descriptor failed"), std::string::npos) << st.ToString();
  EXPECT_EQ(c->counters().slices, kLen / kSlice) << "moved again to a peer that is gone";
  EXPECT_EQ(CarriedBytes(*a_, "tcp"), 0u) << "kRefreshPeer is not kOtherPath: no other transport is tried";
}

// --- slow completion and timeouts -----------------------------------------------------------------------

TEST_P(FaultTest, SlowCompletionStillCompletesWithinTheTransferTimeout) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp"}));
  FaultPlan plan;
  plan.delay = std::chrono::milliseconds(300);
  c->SetPlan(plan);
  auto start = Clock::now();
  Status st = Write(kLen, a_->config().transfer_timeout);
  auto took = Clock::now() - start;
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, a_->config().transfer_timeout);
  ExpectArrived(kLen);
  EXPECT_EQ(c->counters().delayed_posts, 1u);

  auto batch = a_->AllocateBatch(1);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(a_->Submit(*batch, {Req(OpCode::kWrite, kSlice)}).ok());
  auto s = a_->WaitBatch(*batch, std::chrono::milliseconds(50));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->state, TransferState::kPending) << "still held back";
  s = a_->WaitBatch(*batch, std::chrono::seconds(10));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->state, TransferState::kCompleted);
}

TEST_P(FaultTest, ATimeoutIsReportedAsTimeout) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp"}));
  FaultPlan plan;
  plan.delay = std::chrono::seconds(2);
  c->SetPlan(plan);
  auto start = Clock::now();
  Status st = Write(kSlice, std::chrono::milliseconds(200));  // the caller's timeout passes first
  EXPECT_EQ(st.code(), ErrorCode::kTimeout) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));

  plan.delay = std::chrono::milliseconds(100);
  plan.time_out_after_delay = true;  // the transport gives the slices up itself
  c->SetPlan(plan);
  auto batch = a_->AllocateBatch(1);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(a_->Submit(*batch, {Req(OpCode::kWrite, kLen, kSlice)}).ok());
  auto s = a_->WaitBatch(*batch, std::chrono::seconds(10));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->state, TransferState::kTimeout);
  EXPECT_EQ(a_->GetTaskStatus(*batch, 0)->state, TransferState::kTimeout);
  EXPECT_EQ(a_->GetTaskError(*batch, 0).code(), ErrorCode::kTimeout);
  EXPECT_EQ(Write(kSlice).code(), ErrorCode::kTimeout);
}

TEST_P(FaultTest, StoppingFailsWhatIsHeldBack) {
  auto c = Controller("faulty_tcp");
  ASSERT_NO_FATAL_FAILURE(Make({"faulty_tcp"}));
  FaultPlan plan;
  plan.delay = std::chrono::seconds(30);
  c->SetPlan(plan);
  auto batch = a_->AllocateBatch(1);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(a_->Submit(*batch, {Req(OpCode::kWrite, kSlice)}).ok());
  auto start = Clock::now();
  a_.reset();  // must not wait for the delay
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

INSTANTIATE_TEST_SUITE_P(Modes, FaultTest,
                         ::testing::Values(conformance::PeerMode::kInProcess, conformance::PeerMode::kTwoProcess),
                         [](const ::testing::TestParamInfo<conformance::PeerMode>& i) {
                           return std::string(conformance::PeerModeName(i.param));
                         });

// --- registration -----------------------------------------------------------------------------------------

TEST(FaultRegistrationTest, NamesAreCheckedAndControllersShared) {
  auto a = RegisterFaultTransport("faulty_reg", "tcp");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto again = RegisterFaultTransport("faulty_reg", "tcp");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(a->get(), again->get());
  EXPECT_EQ(RegisterFaultTransport("faulty_reg", "shm").status().code(), ErrorCode::kAddressOverlapped);
  EXPECT_EQ(RegisterFaultTransport("faulty_x", "no_such_transport").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(RegisterFaultTransport("tcp", "tcp").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(RegisterFaultTransport("shm", "tcp").status().code(), ErrorCode::kAddressOverlapped);  // a real one
  const TransportPlugin* p = TransportRegistry::Get().FindByProtocol("faulty_reg");
  ASSERT_NE(p, nullptr);
  auto t = p->create();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name(), "faulty_reg");
  EXPECT_TRUE(t->capabilities().remote_hosts);  // tcp's
  bool listed = false;
  for (const auto& [name, inner] : RegisteredFaultTransports()) listed |= name == "faulty_reg" && inner == "tcp";
  EXPECT_TRUE(listed);
}

}  // namespace
}  // namespace mooncake::te::testing
