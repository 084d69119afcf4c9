// The registration epoch's lease and the synchronous path, between two engines of this process over one
// libfabric provider (EFA_TEST_PROVIDER; BUILD.bazel builds this file for tcp;ofi_rxm and for shm):
// - back-to-back synchronous writes read the target's epoch once per lease, not once per submission;
// - a target with no lease (efa.epoch_lease_us=0) has its epoch read before every submission;
// - the target's UnregisterMemory outlasts every lease on the epoch value it replaces, so a write the
//   initiator submits right after it returns (from a descriptor that still lists the buffer, with a lease
//   taken just before) reads the epoch again and fails, and the target's bytes stay as they were;
// - an operation queued in a domain past its lease is not posted; the write fence's epoch value counts;
// - a synchronous transfer drives only the NICs it posted to.

#include <gtest/gtest.h>

#include <ifaddrs.h>
#include <net/if.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
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

// "lo,<the first other IPv4 interface that is up>", or "" where the host has no other interface.
std::string TwoNics() {
  std::string filter;
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return filter;
  for (struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !(i->ifa_flags & IFF_LOOPBACK)) {
      filter = std::string("lo,") + i->ifa_name;
      break;
    }
  }
  freeifaddrs(list);
  return filter;
}

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

  // `lease_us`: the target's efa.epoch_lease_us ("" for the default); `initiator_options`: more options of
  // the initiator's efa transport; `devices`: both engines' device filter.
  void Open(const std::string& lease_us, size_t size = 1 << 20,
            const std::map<std::string, std::string>& initiator_options = {}, const std::string& devices = "") {
    EngineOptions to = Options(lease_us), io = Options("");
    to.device_filter = io.device_filter = devices;
    for (const auto& [k, v] : initiator_options) io.transport_options[k] = v;
    auto t = TransferEngine::Create(to);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto i = TransferEngine::Create(io);
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

// Operations queued in the initiator's domain behind others (efa.max_wr = 1: one with the provider at a
// time) reach the provider long after the epoch check that vouched for them. One still queued when its lease
// ends is not posted: the epoch is read again, and it is posted under the new lease. So one 128 MiB write,
// which takes many leases of 2 ms (the target's efa.epoch_lease_us = 4000) to drain, reads the epoch
// several times, not once, and its bytes arrive whole.
TEST(EfaLeaseTest, QueuedOperationsAreCheckedAgainOnceTheirLeaseEnds) {
  Pair p;
  constexpr size_t kBig = 128 << 20;
  ASSERT_NO_FATAL_FAILURE(p.Open("4000", kBig, {{"efa.max_wr", "1"}}));
  for (size_t i = 0; i < kBig; i += 4096) p.src[i] = static_cast<uint8_t>(i / 4096 * 13 + 7);
  ASSERT_TRUE(p.Write(0, 4096).ok());  // connects
  const uint64_t reads0 = PeerStats(*p.initiator, p.target->segment_name()).value("epoch_reads", uint64_t{0});
  auto batch = p.initiator->AllocateBatch(1);
  ASSERT_TRUE(batch.ok());
  const auto t0 = Clock::now();
  ASSERT_TRUE(
      p.initiator->Submit(*batch, {{OpCode::kWrite, p.src.data(), p.handle, reinterpret_cast<uint64_t>(p.dst.data()), kBig}})
          .ok());
  auto state = p.initiator->WaitBatch(*batch, std::chrono::seconds(20));
  const auto took = Clock::now() - t0;
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->state, TransferState::kCompleted) << p.initiator->GetTaskError(*batch, 0).ToString();
  (void)p.initiator->FreeBatch(*batch);
  for (size_t i = 0; i < kBig; i += 4096) ASSERT_EQ(p.dst[i], p.src[i]) << i;
  const auto stats = PeerStats(*p.initiator, p.target->segment_name());
  const uint64_t reads = stats.value("epoch_reads", uint64_t{0}) - reads0;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  ASSERT_GE(took, std::chrono::milliseconds(20)) << "the write drained in " << ms << " ms, within a few leases";
  // Posted under the first lease alone, its operations would need one read; 20 ms are ten leases.
  EXPECT_GE(reads, 3u) << ms << " ms; " << stats.dump();
}

// Where writes are confirmed by a trailing epoch read (efa.delivery_complete = 0), that read's value counts:
// the target is unregistering the very region a 64 MiB write lands in (posted under a lease taken before),
// so the epoch moved on before the confirmation; the write is not reported done (the refreshed descriptor
// lacks the range).
TEST(EfaLeaseTest, AStaleEpochAtTheWriteFenceFailsTheWrites) {
  Pair p;
  constexpr size_t kSize = 64 << 20;
  ASSERT_NO_FATAL_FAILURE(p.Open("1000000", kSize, {{"efa.delivery_complete", "0"}}));
  ASSERT_TRUE(p.Write(0, 4096).ok());  // takes the lease (500 ms): the big write is posted without a read
  auto batch = p.initiator->AllocateBatch(1);
  ASSERT_TRUE(batch.ok());
  // The epoch moves on at once; the unregistration itself returns after the target's 1 s lease, and the
  // write below, from the cached descriptor and under the lease, lands meanwhile (what a lease allows).
  std::thread unregister([&] { EXPECT_TRUE(p.target->UnregisterMemory(p.dst.data()).ok()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(p.initiator
                  ->Submit(*batch, {{OpCode::kWrite, p.src.data(), p.handle, reinterpret_cast<uint64_t>(p.dst.data()),
                                     kSize}})
                  .ok());
  auto state = p.initiator->WaitBatch(*batch, std::chrono::seconds(10));
  unregister.join();
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->state, TransferState::kFailed) << "a write into a region withdrawn meanwhile was reported done";
  EXPECT_EQ(p.initiator->GetTaskError(*batch, 0).code(), ErrorCode::kAddressNotRegistered)
      << p.initiator->GetTaskError(*batch, 0).ToString();
  (void)p.initiator->FreeBatch(*batch);
}

// A synchronous transfer drives (reaps on its own thread) only the NICs it posted to: with two NICs per
// engine, 4 KiB writes (one slice, one path each) drive one domain each, not both.
TEST(EfaLeaseTest, ASynchronousTransferDrivesOnlyTheNicsItUses) {
  static const std::string nics = TwoNics();
  if (std::string(EFA_TEST_PROVIDER) == "shm" || nics.empty()) GTEST_SKIP() << "needs two tcp NICs";
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.Open("1000000", 1 << 20, {}, nics));
  constexpr int kWrites = 20;
  auto drives = [&] {
    uint64_t n = 0;
    std::set<std::string> seen;
    const nlohmann::json stats = PeerStats(*p.initiator, p.target->segment_name());
    for (const auto& path : stats.value("paths", nlohmann::json::array())) {
      if (seen.insert(path.value("local", "")).second) n += path.value("local_drives", uint64_t{0});
    }
    return std::make_pair(n, seen.size());
  };
  ASSERT_TRUE(p.Write(0, 4096).ok());
  auto [before, nics_seen] = drives();
  ASSERT_EQ(nics_seen, 2u) << PeerStats(*p.initiator, p.target->segment_name()).dump();
  for (int i = 1; i <= kWrites; ++i) ASSERT_TRUE(p.Write(i * 4096, 4096).ok()) << i;
  const uint64_t after = drives().first;
  EXPECT_EQ(after - before, static_cast<uint64_t>(kWrites))
      << "domains driven by " << kWrites << " one-slice synchronous writes; "
      << PeerStats(*p.initiator, p.target->segment_name()).dump();
  for (int i = 0; i <= kWrites * 4096; ++i) ASSERT_EQ(p.dst[i], 0x5a) << i;
}

}  // namespace
}  // namespace mooncake::te::efa
