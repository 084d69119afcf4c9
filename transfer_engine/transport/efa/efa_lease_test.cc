// The registration epoch's lease and the synchronous path, between two engines of this process over one
// libfabric provider (EFA_TEST_PROVIDER; BUILD.bazel builds this file for tcp;ofi_rxm and for shm):
// - back-to-back synchronous writes read the target's epoch once per lease, not once per submission;
// - a target with no lease (efa.epoch_lease_us=0) has its epoch read before every submission;
// - the target's UnregisterMemory outlasts every lease on the epoch value it replaces, so a write the
//   initiator submits right after it returns (from a descriptor that still lists the buffer, with a lease
//   taken just before) reads the epoch again and fails, and the target's bytes stay as they were.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"

#ifndef EFA_TEST_PROVIDER
#error "EFA_TEST_PROVIDER must name a libfabric provider"
#endif

namespace mooncake::te::efa {
namespace {

using Clock = std::chrono::steady_clock;

bool SetUpEnvironment() {
  setenv("FI_PROVIDER", EFA_TEST_PROVIDER, 1);
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir && workspace) {
    std::string dir = std::string(srcdir) + "/" + workspace + "/transfer_engine/transport/efa";
    setenv("MC_PLUGIN_DIR", dir.c_str(), 1);
  }
  return true;
}
const bool kEnvironment = SetUpEnvironment();

EngineOptions Options(const std::string& lease_us) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "efa";
  o.transports = {"efa"};
  o.transport_options["efa.op_timeout_ms"] = "3000";
  if (!lease_us.empty()) o.transport_options["efa.epoch_lease_us"] = lease_us;
  return o;
}

// The initiator's efa counters for the target `segment`.
nlohmann::json PeerStats(const TransferEngine& e, const std::string& segment) {
  auto j = nlohmann::json::parse(e.StatsJson());
  if (!j.contains("efa") || !j["efa"].contains(segment)) return nlohmann::json::object();
  return j["efa"][segment];
}

struct Pair {
  std::unique_ptr<TransferEngine> initiator, target;
  std::vector<uint8_t> src, dst;
  SegmentHandle handle = kInvalidSegment;

  // `lease_us`: the target's efa.epoch_lease_us ("" for the default).
  void Open(const std::string& lease_us, size_t size = 1 << 20) {
    auto t = TransferEngine::Create(Options(lease_us));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto i = TransferEngine::Create(Options(""));
    ASSERT_TRUE(i.ok()) << i.status().ToString();
    target = std::move(t.value());
    initiator = std::move(i.value());
    src.assign(size, 0x5a);
    dst.assign(size, 0x11);
    ASSERT_TRUE(initiator->RegisterMemory(src.data(), src.size()).ok());
    ASSERT_TRUE(target->RegisterMemory(dst.data(), dst.size()).ok());
    auto h = initiator->OpenSegment(target->segment_name());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    handle = *h;
  }
  Status Write(size_t offset, size_t length) {
    return initiator->TransferSync(
        {{OpCode::kWrite, src.data() + offset, handle, reinterpret_cast<uint64_t>(dst.data()) + offset, length}},
        std::chrono::seconds(10));
  }
};

TEST(EfaLeaseTest, BackToBackWritesReadTheEpochOncePerLease) {
  Pair p;
  // A lease longer than the loop: one epoch read in all.
  ASSERT_NO_FATAL_FAILURE(p.Open("1000000"));
  constexpr int kWrites = 20;
  const auto t0 = Clock::now();
  for (int i = 0; i < kWrites; ++i) ASSERT_TRUE(p.Write(i * 4096, 4096).ok()) << i;
  const auto took = Clock::now() - t0;
  auto stats = PeerStats(*p.initiator, p.target->segment_name());
  ASSERT_TRUE(stats.contains("epoch_reads")) << stats.dump();
  if (took < std::chrono::milliseconds(400)) {  // the lease (half of 1 s) covered the whole loop
    EXPECT_EQ(stats["epoch_reads"].get<uint64_t>(), 1u) << stats.dump();
    EXPECT_EQ(stats["epoch_lease_hits"].get<uint64_t>(), static_cast<uint64_t>(kWrites - 1)) << stats.dump();
  }
  EXPECT_LT(stats["epoch_reads"].get<uint64_t>(), static_cast<uint64_t>(kWrites)) << stats.dump();
  for (int i = 0; i < kWrites * 4096; ++i) ASSERT_EQ(p.dst[i], 0x5a) << i;
}

TEST(EfaLeaseTest, WithoutALeaseEverySubmissionReadsTheEpoch) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.Open("0"));
  constexpr int kWrites = 20;
  for (int i = 0; i < kWrites; ++i) ASSERT_TRUE(p.Write(i * 4096, 4096).ok()) << i;
  auto stats = PeerStats(*p.initiator, p.target->segment_name());
  EXPECT_EQ(stats.value("epoch_reads", uint64_t{0}), static_cast<uint64_t>(kWrites)) << stats.dump();
  EXPECT_EQ(stats.value("epoch_lease_hits", uint64_t{1}), 0u) << stats.dump();
}

TEST(EfaLeaseTest, UnregisteredMemoryIsNotWrittenUnderALease) {
  Pair p;
  // 400 ms: the initiator may rely on an epoch value for 200 ms after reading it.
  ASSERT_NO_FATAL_FAILURE(p.Open("400000"));
  ASSERT_TRUE(p.Write(0, 4096).ok());  // takes the lease
  ASSERT_EQ(p.dst[0], 0x5a);
  std::fill(p.dst.begin(), p.dst.end(), 0x11);
  const auto t0 = Clock::now();
  ASSERT_TRUE(p.target->UnregisterMemory(p.dst.data()).ok());
  const auto took = Clock::now() - t0;
  // The withdrawal waited out every lease on the old epoch value (without that wait, this engine would post
  // the next write under its lease while the region is withdrawn and still registered).
  EXPECT_GE(took, std::chrono::milliseconds(400));
  // The initiator's cached descriptor still lists the buffer, and its lease was taken well under 200 ms
  // before the unregistration began; but the lease has run out by now, so the epoch is read again.
  Status st = p.Write(4096, 4096);
  EXPECT_FALSE(st.ok()) << "a write to unregistered memory succeeded";
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3)) << st.ToString();  // refused, not timed out
  for (size_t i = 0; i < p.dst.size(); ++i) ASSERT_EQ(p.dst[i], 0x11) << "byte " << i << " was written";
}

}  // namespace
}  // namespace mooncake::te::efa
