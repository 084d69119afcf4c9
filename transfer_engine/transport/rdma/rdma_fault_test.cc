// Fault cases of the rdma transport on the FAKE verbs provider: this process (fake host "hostA", two HCAs) moves
// bytes to a target engine in a child process (the conformance suite's conformance_peer, fake host "hostB",
// which loads libmc_transport_rdma.so), while faults are injected into one HCA.

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
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
