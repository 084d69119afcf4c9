// Fault cases of the rdma transport on the FAKE verbs provider: this process (fake host "hostA", two HCAs) moves
// bytes to a target engine in a child process (the conformance suite's conformance_peer, fake host "hostB",
// which loads libmc_transport_rdma.so), while faults are injected into one HCA.

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/conformance/pattern.h"
#include "transfer_engine/transport/conformance/target.h"
#include "transfer_engine/transport/rdma/testing/fake_env.h"
#include "transfer_engine/transport/rdma/testing/fake_verbs.h"

namespace mooncake::te::rdma {
namespace {

using Clock = std::chrono::steady_clock;
using conformance::Digest;
using conformance::FillPattern;

const std::string kState = [] {
  std::string s = fake::UseFakeVerbs("fake_mlx5_0,fake_mlx5_1");
  setenv("MC_RDMA_FAKE_HOST", "hostA", 1);
  return s;
}();

constexpr size_t kSize = 16 << 20;

EngineOptions Options() {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "rdma";
  o.transports = {"rdma"};
  o.transport_options["rdma.backoff_ms"] = "200";
  return o;
}

StatusOr<std::unique_ptr<conformance::Target>> StartTarget(EngineOptions o = Options()) {
  conformance::TargetOptions to;
  to.engine = std::move(o);
  to.buffer_size = kSize;
  setenv("MC_RDMA_FAKE_HOST", "hostB", 1);  // inherited by the child only
  auto t = conformance::StartPeerProcessTarget(to);
  setenv("MC_RDMA_FAKE_HOST", "hostA", 1);
  return t;
}

class RdmaFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* host : {"hostA", "hostB"}) {
      for (const char* dev : {"fake_mlx5_0", "fake_mlx5_1"}) fake::SetFault(kState, host, dev, "");
    }
  }
  void TearDown() override { SetUp(); }

  // A (this process) and a target; `src` registered with A.
  void Make(EngineOptions a = Options(), EngineOptions t = Options()) {
    auto e = TransferEngine::Create(std::move(a));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    a_ = std::move(e.value());
    src_.resize(kSize);
    FillPattern(src_.data(), kSize, 11, 0);
    ASSERT_TRUE(a_->RegisterMemory(src_.data(), kSize).ok());
    auto target = StartTarget(std::move(t));
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    target_ = std::move(target.value());
    auto h = a_->OpenSegment(target_->segment_name());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = *h;
    base_ = target_->buffer_address();
  }
  // Writes `len` bytes at `off` in 64 KiB requests (several slices per NIC), then checks them at the target.
  Status WriteAndCheck(size_t off, size_t len) {
    std::vector<TransferRequest> reqs;
    for (size_t o = off; o < off + len; o += 65536) {
      reqs.push_back({OpCode::kWrite, src_.data() + o, h_, base_ + o, std::min<size_t>(65536, off + len - o)});
    }
    Status st = a_->TransferSync(reqs, std::chrono::seconds(20));
    if (!st.ok()) return st;
    auto digest = target_->DigestOf(off, len);
    if (!digest.ok()) return digest.status();
    if (*digest != Digest(src_.data() + off, len)) return Status(ErrorCode::kMemory, "data arrived damaged");
    return Status::Ok();
  }
  nlohmann::json Stats() {
    return nlohmann::json::parse(a_->StatsJson(), nullptr, false)["rdma"][target_->segment_name()];
  }
  uint64_t PathFailures(const std::string& nic_prefix) {
    uint64_t sum = 0;
    const nlohmann::json stats = Stats();
    for (const auto& [label, p] : stats["paths"].items()) {
      if (label.rfind(nic_prefix, 0) == 0) sum += p["failures"].get<uint64_t>();
    }
    return sum;
  }

  std::unique_ptr<TransferEngine> a_;
  std::unique_ptr<conformance::Target> target_;
  std::vector<uint8_t> src_;
  SegmentHandle h_{};
  uint64_t base_ = 0;
};

TEST_F(RdmaFaultTest, OneNicsErrorCompletionsMoveTheWorkToTheOther) {
  Make();
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());  // both NICs connected
  ASSERT_TRUE(fake::SetFault(kState, "hostA", "fake_mlx5_0", "wc_error"));
  Status st = WriteAndCheck(0, kSize);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(PathFailures("fake_mlx5_0"), 1u) << Stats().dump();
  EXPECT_EQ(PathFailures("fake_mlx5_1"), 0u) << Stats().dump();
  EXPECT_GE(Stats()["retries"].get<uint64_t>(), 1u);
  // Reads too.
  ASSERT_TRUE(target_->Fill(0, 1 << 20, 4).ok());
  std::vector<TransferRequest> reads;
  for (size_t o = 0; o < (1 << 20); o += 65536) reads.push_back({OpCode::kRead, src_.data() + o, h_, base_ + o, 65536});
  ASSERT_TRUE(a_->TransferSync(reads, std::chrono::seconds(20)).ok());
  EXPECT_TRUE(conformance::MatchesPattern(src_.data(), 1 << 20, 4, 0));
}

TEST_F(RdmaFaultTest, QpErrorResetsOnlyThatEndpointWhichReconnects) {
  Make();
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  ASSERT_TRUE(fake::SetFault(kState, "hostA", "fake_mlx5_0", "qp_error=1"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the fake applies it within 20 ms (unloaded)
  Status st = WriteAndCheck(0, kSize);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(PathFailures("fake_mlx5_0"), 1u) << Stats().dump();
  EXPECT_EQ(PathFailures("fake_mlx5_1"), 0u) << Stats().dump();
  // After the backoff (200 ms) the endpoint is made again and carries traffic.
  bool reconnected = false;
  for (auto until = Clock::now() + std::chrono::seconds(10); !reconnected && Clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    ASSERT_TRUE(WriteAndCheck(0, 4 << 20).ok());
    const nlohmann::json stats = Stats();
    for (const auto& [label, p] : stats["paths"].items()) {
      if (label.rfind("fake_mlx5_0", 0) == 0 && p["state"] == "connected" && p["bytes"].get<uint64_t>() > 0) {
        reconnected = true;
      }
    }
  }
  EXPECT_TRUE(reconnected) << Stats().dump();
}

TEST_F(RdmaFaultTest, PeerPortDownTimesOutThenUsesThePeersOtherNic) {
  Make();
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  ASSERT_TRUE(fake::SetFault(kState, "hostB", "fake_mlx5_1", "port_down"));
  auto start = Clock::now();
  Status st = WriteAndCheck(0, 4 << 20);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  uint64_t to_nic1 = 0;
  const nlohmann::json stats = Stats();
  for (const auto& [label, p] : stats["paths"].items()) {
    if (label.size() > 11 && label.compare(label.size() - 11, 11, "fake_mlx5_1") == 0) {
      to_nic1 += p["failures"].get<uint64_t>();
    }
  }
  EXPECT_GE(to_nic1, 1u) << Stats().dump();
}

TEST_F(RdmaFaultTest, EveryNicFailingEndsTheTransferInBoundedTime) {
  Make();
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  ASSERT_TRUE(fake::SetFault(kState, "hostA", "fake_mlx5_0", "wc_error"));
  ASSERT_TRUE(fake::SetFault(kState, "hostA", "fake_mlx5_1", "wc_error"));
  auto start = Clock::now();
  Status st = WriteAndCheck(0, 1 << 20);
  EXPECT_FALSE(st.ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << st.ToString();
  // Healed, and after the backoff (bounded by the rail pause), the same engine moves bytes again.
  SetUp();
  auto until = Clock::now() + std::chrono::seconds(15);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    st = WriteAndCheck(0, 1 << 20);
  } while (!st.ok() && Clock::now() < until);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(RdmaFaultTest, ChunkedRegistrationsMoveBytesAcrossChunkBoundaries) {
  EngineOptions o = Options();
  o.transport_options["rdma.max_mr_size"] = std::to_string(1 << 20);
  Make(o, o);
  auto buffers = a_->GetSegmentBuffers(target_->segment_name());
  ASSERT_TRUE(buffers.ok());
  // Unaligned ranges cross both the local and the remote 1 MiB chunk boundaries.
  std::vector<TransferRequest> reqs = {{OpCode::kWrite, src_.data() + 1000, h_, base_ + (1 << 20) - 5000, 3 << 20}};
  ASSERT_TRUE(a_->TransferSync(reqs, std::chrono::seconds(20)).ok());
  auto digest = target_->DigestOf((1 << 20) - 5000, 3 << 20);
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(*digest, Digest(src_.data() + 1000, 3 << 20));
  ASSERT_TRUE(target_->Fill(0, kSize, 8).ok());
  reqs = {{OpCode::kRead, src_.data() + 77, h_, base_ + (2 << 20) - 1, 2 << 20}};
  ASSERT_TRUE(a_->TransferSync(reqs, std::chrono::seconds(20)).ok());
  EXPECT_TRUE(conformance::MatchesPattern(src_.data() + 77, 2 << 20, 8, (2 << 20) - 1));
}

TEST_F(RdmaFaultTest, DeviceFilterLimitsTheNics) {
  EngineOptions o = Options();
  o.device_filter = "fake_mlx5_1";
  Make(o);
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  const nlohmann::json stats = Stats();
  ASSERT_FALSE(stats["paths"].empty());
  for (const auto& [label, p] : stats["paths"].items()) {
    EXPECT_EQ(label.rfind("fake_mlx5_1", 0), 0u) << label << " uses a NIC outside the allow-list";
  }
}

// One WR meets a remote access error (its range was withdrawn) while others wait behind it on the same QP: only
// it fails, with its error; the flushed ones move again after the endpoint's reset without using up their retry
// budget (none here: retry_cnt 0).
TEST_F(RdmaFaultTest, ARemoteAccessErrorFailsOnlyTheOffendingWorkRequest) {
  EngineOptions o = Options();
  o.device_filter = "fake_mlx5_0";  // one QP: the flushed WRs are behind the offending one
  o.transport_options["rdma.retry_cnt"] = "0";
  auto e = TransferEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  a_ = std::move(e.value());
  src_.resize(kSize);
  FillPattern(src_.data(), kSize, 21, 0);
  ASSERT_TRUE(a_->RegisterMemory(src_.data(), kSize).ok());
  auto target = StartTarget(o);
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  target_ = std::move(target.value());
  auto extra = target_->RegisterExtra(1 << 20);
  ASSERT_TRUE(extra.ok()) << extra.status().ToString();
  auto h = a_->OpenSegment(target_->segment_name());  // the descriptor lists both buffers
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(target_->Unregister().ok());  // the main buffer's keys go; our descriptor still has them
  std::vector<TransferRequest> reqs = {{OpCode::kWrite, src_.data(), *h, target_->buffer_address(), 65536}};
  for (size_t i = 0; i < 15; ++i) {
    reqs.push_back({OpCode::kWrite, src_.data() + (i + 1) * 65536, *h, *extra + i * 65536, 65536});
  }
  auto batch = a_->AllocateBatch(reqs.size());
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(a_->Submit(*batch, reqs).ok());
  auto done = a_->WaitBatch(*batch, std::chrono::seconds(20));
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  Status first = a_->GetTaskError(*batch, 0);
  EXPECT_FALSE(first.ok()) << "the write into the withdrawn buffer succeeded";
  EXPECT_TRUE(first.code() == ErrorCode::kAddressNotRegistered || first.code() == ErrorCode::kRemoteRejected)
      << first.ToString();
  for (size_t i = 1; i < reqs.size(); ++i) {
    Status st = a_->GetTaskError(*batch, i);
    EXPECT_TRUE(st.ok()) << "task " << i << " was flushed and not moved again: " << st.ToString();
  }
  // The engine would hide a flushed WR that was charged (it fails with kRefreshPeer and the engine moves it again
  // on a fresh descriptor): the counters show it. Only the offending slice failed, and nothing was retried.
  const nlohmann::json stats = Stats();
  EXPECT_EQ(stats["errors"], 1u) << "a flushed work request was charged: " << stats.dump();
  EXPECT_EQ(stats["retries"], 0u) << stats.dump();
  ASSERT_TRUE(a_->FreeBatch(*batch).ok());
  // What landed in the extra buffer, read back.
  std::vector<TransferRequest> back = {{OpCode::kRead, src_.data() + (8 << 20), *h, *extra, 15 * 65536}};
  ASSERT_TRUE(a_->TransferSync(back, std::chrono::seconds(20)).ok());
  EXPECT_EQ(Digest(src_.data() + (8 << 20), 15 * 65536), Digest(src_.data() + 65536, 15 * 65536));
}

EngineOptions OneNic(EngineOptions o = Options()) {
  o.device_filter = "fake_mlx5_0";
  return o;
}

// Paths of the segment in state "connected".
size_t Connected(const nlohmann::json& stats) {
  size_t n = 0;
  for (const auto& [label, p] : stats["paths"].items()) n += p["state"] == "connected";
  return n;
}

// The failing WR was the only one in flight, so the endpoint destroyed its QP with the failure itself: it stops
// being routed then (its route, and the endpoint the route holds, are not left behind).
TEST_F(RdmaFaultTest, AFailureWithNothingElseInFlightLeavesNoRouteBehind) {
  EngineOptions o = OneNic();
  o.transport_options["rdma.retry_cnt"] = "0";
  Make(o, o);
  ASSERT_TRUE(WriteAndCheck(0, 65536).ok());
  ASSERT_EQ(Stats()["qps"], 1u) << Stats().dump();
  ASSERT_TRUE(fake::SetFault(kState, "hostA", "fake_mlx5_0", "wc_error"));
  for (int i = 0; i < 3; ++i) {  // one WR at a time: each fails alone
    EXPECT_FALSE(a_->TransferSync({{OpCode::kWrite, src_.data(), h_, base_, 65536}}, std::chrono::seconds(10)).ok());
  }
  SetUp();  // healed: after the backoff the transfer goes through on a new QP
  Status st;
  auto until = Clock::now() + std::chrono::seconds(15);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    st = WriteAndCheck(0, 65536);
  } while (!st.ok() && Clock::now() < until);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const nlohmann::json stats = Stats();
  EXPECT_EQ(Connected(stats), 1u) << stats.dump();
  EXPECT_EQ(stats["qps"], 1u) << "routes of destroyed QPs were left behind: " << stats.dump();
}

// With one NIC pair, a QP error flushes the WRs in flight behind the one it fails: they (and the failed one's
// retry) wait for the endpoint's backoff and move on its new QP, rather than finding no usable pair and failing
// to the engine (kRefreshPeer: it would refresh the peer and tear down its endpoints).
TEST_F(RdmaFaultTest, WithOneNicPairTheWorkBehindAFailureWaitsForTheReconnect) {
  Make(OneNic(), OneNic());
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  ASSERT_TRUE(fake::SetFault(kState, "hostA", "fake_mlx5_0", "qp_error=1"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the fake applies it within 20 ms (unloaded)
  Status st = WriteAndCheck(0, 4 << 20);
  EXPECT_TRUE(st.ok()) << st.ToString();
  const nlohmann::json stats = Stats();
  EXPECT_GE(PathFailures("fake_mlx5_0"), 1u) << stats.dump();
  EXPECT_EQ(stats["errors"], 0u) << "slices failed to the engine instead of waiting: " << stats.dump();
  EXPECT_GE(stats["retries"].get<uint64_t>(), 1u) << stats.dump();
  EXPECT_EQ(Connected(stats), 1u) << stats.dump();
}

// The target keeps one responder QP. A second requester's connection evicts the first's confirmed one (the table
// never stays full of entries whose requesters may be gone); the first gets an error completion and reconnects.
TEST_F(RdmaFaultTest, AFullResponderTableEvictsAConfirmedEntryAndItsRequesterReconnects) {
  EngineOptions t = OneNic();
  t.transport_options["rdma.responder_capacity"] = "1";
  Make(OneNic(), t);
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  auto c = TransferEngine::Create(OneNic());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> other(1 << 20);
  FillPattern(other.data(), other.size(), 41, 0);
  ASSERT_TRUE((*c)->RegisterMemory(other.data(), other.size()).ok());
  auto hc = (*c)->OpenSegment(target_->segment_name());
  ASSERT_TRUE(hc.ok()) << hc.status().ToString();
  Status st = (*c)->TransferSync({{OpCode::kWrite, other.data(), *hc, base_ + (8 << 20), other.size()}},
                                 std::chrono::seconds(20));
  ASSERT_TRUE(st.ok()) << "a full table of confirmed entries refused a newcomer: " << st.ToString();
  auto digest = target_->DigestOf(8 << 20, other.size());
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(*digest, Digest(other.data(), other.size()));
  // Our QP's responder end is gone: our next transfer meets an error completion, reconnects, and completes.
  st = WriteAndCheck(0, 1 << 20);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(PathFailures("fake_mlx5_0"), 1u) << "our connection was not the one evicted: " << Stats().dump();
  EXPECT_EQ(Stats()["errors"], 0u) << Stats().dump();
}

// The responder QPs the target keeps for its peers.
uint64_t ResponderQps(conformance::Target& t) {
  auto s = t.Stats();
  if (!s.ok()) return ~0ULL;
  nlohmann::json j = nlohmann::json::parse(*s, nullptr, false);
  const nlohmann::json& n = j["listeners"]["rdma"]["responder_qps"];
  return n.is_number_unsigned() ? n.get<uint64_t>() : ~0ULL;
}

// A requester that forgets the peer (its QPs retired) tells the peer's responder ("rdma.close"): the responder
// QPs go at once instead of waiting in the table for an eviction.
TEST_F(RdmaFaultTest, RetiredQpsAreClosedAtTheResponder) {
  Make(OneNic(), OneNic());
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  ASSERT_EQ(ResponderQps(*target_), 1u);
  a_->InvalidateSegment(target_->segment_name());  // ForgetPeer: the idle endpoint closes its QP now
  auto until = Clock::now() + std::chrono::seconds(5);
  while (ResponderQps(*target_) != 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(ResponderQps(*target_), 0u) << "the responder kept the QP of a closed connection";
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());  // a fresh connection
  EXPECT_EQ(ResponderQps(*target_), 1u);
}

// QPs of this process in the fake's state directory (each QP has a record there until it is destroyed).
size_t OwnQps() {
  size_t n = 0;
  DIR* d = opendir((kState + "/qp").c_str());
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;
    std::ifstream in(kState + "/qp/" + e->d_name);
    long pid = 0;
    if (in >> pid && pid == getpid()) n++;
  }
  closedir(d);
  return n;
}

uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// The peer restarts under the same name with other NICs (another fake host: other GIDs, QPNs and keys): the
// endpoints to its dead QPs are detected and rebuilt from its fresh descriptor, and the transfer completes.
TEST_F(RdmaFaultTest, APeerRestartedWithOtherNicsGetsFreshEndpoints) {
  auto e = TransferEngine::Create(Options());
  ASSERT_TRUE(e.ok());
  a_ = std::move(e.value());
  src_.resize(kSize);
  FillPattern(src_.data(), kSize, 31, 0);
  ASSERT_TRUE(a_->RegisterMemory(src_.data(), kSize).ok());
  const uint16_t port = FreePort();
  ASSERT_NE(port, 0);
  EngineOptions t = Options();
  t.local_server_name = "127.0.0.1:" + std::to_string(port);
  setenv("MC_LEGACY_RPC_PORT_BINDING", "1", 1);  // the target binds that port (inherited by the children)
  auto first = StartTarget(t);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  target_ = std::move(first.value());
  const std::string name = target_->segment_name();
  auto h = a_->OpenSegment(name);
  ASSERT_TRUE(h.ok());
  h_ = *h;
  base_ = target_->buffer_address();
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  const size_t qps = OwnQps();
  ASSERT_GT(qps, 0u);
  target_->Vanish();
  setenv("MC_RDMA_FAKE_HOST", "hostC", 1);
  conformance::TargetOptions to;
  to.engine = t;
  to.buffer_size = kSize;
  auto second = conformance::StartPeerProcessTarget(to);
  setenv("MC_RDMA_FAKE_HOST", "hostA", 1);
  unsetenv("MC_LEGACY_RPC_PORT_BINDING");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  target_ = std::move(second.value());
  ASSERT_EQ(target_->segment_name(), name);
  base_ = target_->buffer_address();
  auto start = Clock::now();
  Status st = WriteAndCheck(0, 1 << 20);  // through the handle opened on the first instance
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  // The endpoints to the first instance were closed, not left connected to its dead QPs.
  EXPECT_LE(OwnQps(), qps) << "QPs to the vanished instance are still open";
}

// The peer restarts under the same name on the same host (the same NIC names and GIDs; a new instance, new
// QPNs and keys, its buffer elsewhere): the next transfer through the handle opened on the first instance
// completes on fresh endpoints, and the endpoints to the dead QPs are closed. Nothing per peer outlives
// the instance (the peer is keyed by its instance id; a new instance under the name retires the old one).
TEST_F(RdmaFaultTest, APeerRestartedOnTheSameHostGetsFreshEndpoints) {
  auto e = TransferEngine::Create(Options());
  ASSERT_TRUE(e.ok());
  a_ = std::move(e.value());
  src_.resize(kSize);
  FillPattern(src_.data(), kSize, 37, 0);
  ASSERT_TRUE(a_->RegisterMemory(src_.data(), kSize).ok());
  const uint16_t port = FreePort();
  ASSERT_NE(port, 0);
  EngineOptions t = Options();
  t.local_server_name = "127.0.0.1:" + std::to_string(port);
  setenv("MC_LEGACY_RPC_PORT_BINDING", "1", 1);  // the target binds that port (inherited by the children)
  auto first = StartTarget(t);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  target_ = std::move(first.value());
  const std::string name = target_->segment_name();
  auto h = a_->OpenSegment(name);
  ASSERT_TRUE(h.ok());
  h_ = *h;
  base_ = target_->buffer_address();
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  const size_t qps = OwnQps();
  ASSERT_GT(qps, 0u);
  target_->Vanish();
  auto second = StartTarget(t);  // hostB again
  unsetenv("MC_LEGACY_RPC_PORT_BINDING");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  target_ = std::move(second.value());
  ASSERT_EQ(target_->segment_name(), name);
  base_ = target_->buffer_address();
  auto start = Clock::now();
  Status st = WriteAndCheck(0, 1 << 20);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_LE(OwnQps(), qps) << "QPs to the vanished instance are still open";
  // And the one after it goes straight through.
  start = Clock::now();
  st = WriteAndCheck(1 << 20, 1 << 20);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

// One peer's retry hangs in a handshake (the peer process is stopped, so its RPC never answers): another peer's
// retries still run at once.
TEST_F(RdmaFaultTest, APeerWhoseHandshakeHangsDoesNotDelayOtherPeersRetries) {
  Make();  // F: the target of Make, warmed on both rails
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  setenv("MC_RDMA_FAKE_HOST", "hostC", 1);
  conformance::TargetOptions to;
  to.engine = Options();
  to.buffer_size = kSize;
  auto slow = conformance::StartPeerProcessTarget(to);
  setenv("MC_RDMA_FAKE_HOST", "hostA", 1);
  ASSERT_TRUE(slow.ok()) << slow.status().ToString();
  auto hs = a_->OpenSegment((*slow)->segment_name());
  ASSERT_TRUE(hs.ok());
  const uint64_t slow_base = (*slow)->buffer_address();
  // One WR: only the first rail (our fake_mlx5_0) connects to S.
  ASSERT_TRUE(a_->TransferSync({{OpCode::kWrite, src_.data(), *hs, slow_base, 65536}}, std::chrono::seconds(10)).ok());
  const std::string where = (*slow)->where();
  const pid_t slow_pid = static_cast<pid_t>(atoi(where.c_str() + where.rfind(' ') + 1));
  ASSERT_GT(slow_pid, 0) << where;
  ASSERT_EQ(kill(slow_pid, SIGSTOP), 0);
  // Every QP of our fake_mlx5_0 fails: S's retry moves to the second rail, which needs a handshake (hangs);
  // F's retries move to its connected second rail.
  ASSERT_TRUE(fake::SetFault(kState, "hostA", "fake_mlx5_0", "qp_error=1"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Status slow_st;
  std::thread to_slow([&] {
    // Two WRs, one per rail: the second rail's handshake hangs on this thread; the first rail's WR fails and its
    // retry, on S's strand of the pool, waits for that handshake too.
    slow_st = a_->TransferSync({{OpCode::kWrite, src_.data(), *hs, slow_base, 131072}}, std::chrono::seconds(30));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // S's retry is in its handshake now
  auto start = Clock::now();
  Status st = WriteAndCheck(0, 1 << 20);
  auto took = Clock::now() - start;
  kill(slow_pid, SIGCONT);
  to_slow.join();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(PathFailures("fake_mlx5_0"), 1u) << Stats().dump();
  EXPECT_LT(took, std::chrono::seconds(2))
      << "F's retries waited for S's handshake: "
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  (void)slow_st;  // S's write may or may not make it after its handshake timed out
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Connected and idle, the completion threads sleep on their channels: the process uses (almost) no CPU.
TEST_F(RdmaFaultTest, IdleEngineDoesNotSpin) {
  Make();
  ASSERT_TRUE(WriteAndCheck(0, 1 << 20).ok());
  const double before = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double used = CpuSeconds() - before;
  EXPECT_LT(used, 0.2) << "an idle engine used " << used << " s of CPU in 2 s";
}

}  // namespace
}  // namespace mooncake::te::rdma
