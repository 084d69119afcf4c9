// Fault cases of the efa transport over libfabric's tcp;ofi_rxm provider, between this process and a target
// engine in a child process (the conformance suite's conformance_peer, which loads libmc_transport_efa.so).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/conformance/pattern.h"
#include "transfer_engine/transport/conformance/target.h"

namespace mooncake::te::efa {
namespace {

using Clock = std::chrono::steady_clock;
using conformance::Digest;
using conformance::FillPattern;

bool SetUpEnvironment() {
  setenv("FI_PROVIDER", "tcp;ofi_rxm", 1);
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir && workspace) {
    std::string dir = std::string(srcdir) + "/" + workspace + "/transfer_engine/transport/efa";
    setenv("MC_PLUGIN_DIR", dir.c_str(), 1);
  }
  return true;
}
const bool kEnvironment = SetUpEnvironment();

constexpr size_t kSize = 64 << 20;

EngineOptions Options() {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "efa";
  o.transports = {"efa"};
  o.transport_options["efa.op_timeout_ms"] = "3000";
  return o;
}

StatusOr<std::unique_ptr<conformance::Target>> StartTarget() {
  conformance::TargetOptions to;
  to.engine = Options();
  to.buffer_size = kSize;
  return conformance::StartPeerProcessTarget(to);
}

// The target is SIGKILLed while 256 MiB of writes to it are in flight: every batch ends (none hangs), at least
// one of them fails, all within the bound; then the same engine moves bytes to a new target.
TEST(EfaFaultTest, PeerKilledMidTransferFailsInBoundedTime) {
  auto a = TransferEngine::Create(Options());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<uint8_t> src(kSize);
  FillPattern(src.data(), kSize, 3, 0);
  ASSERT_TRUE((*a)->RegisterMemory(src.data(), kSize).ok());

  auto target = StartTarget();
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  auto h = (*a)->OpenSegment((*target)->segment_name());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const uint64_t base = (*target)->buffer_address();
  ASSERT_TRUE((*a)->TransferSync({{OpCode::kWrite, src.data(), *h, base, 4096}}, std::chrono::seconds(10)).ok());

  constexpr int kBatches = 4;
  constexpr size_t kTask = 1 << 20;
  std::vector<BatchId> batches;
  for (int b = 0; b < kBatches; ++b) {
    auto id = (*a)->AllocateBatch(kSize / kTask);
    ASSERT_TRUE(id.ok());
    std::vector<TransferRequest> reqs;
    for (size_t off = 0; off < kSize; off += kTask) {
      reqs.push_back({b % 2 ? OpCode::kRead : OpCode::kWrite, src.data() + off, *h, base + off, kTask});
    }
    ASSERT_TRUE((*a)->Submit(*id, reqs).ok());
    batches.push_back(*id);
  }
  (*target)->Vanish();
  const auto killed = Clock::now();
  int failed = 0;
  for (BatchId id : batches) {
    auto st = (*a)->WaitBatch(id, std::chrono::seconds(20));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_TRUE(st->state == TransferState::kCompleted || st->state == TransferState::kFailed)
        << "batch still " << static_cast<int>(st->state) << " after 20 s";
    if (st->state == TransferState::kFailed) ++failed;
    EXPECT_TRUE((*a)->FreeBatch(id).ok());
  }
  const auto took = Clock::now() - killed;
  EXPECT_GE(failed, 1) << "every batch succeeded although the target was killed right after submission";
  EXPECT_LT(took, std::chrono::seconds(10)) << "failing took "
                                            << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                                            << " ms";

  // The engine is still usable: a new target gets the bytes.
  auto fresh = StartTarget();
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  auto h2 = (*a)->OpenSegment((*fresh)->segment_name());
  ASSERT_TRUE(h2.ok());
  Status st = (*a)->TransferSync({{OpCode::kWrite, src.data(), *h2, (*fresh)->buffer_address(), 1 << 20}},
                                 std::chrono::seconds(10));
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto digest = (*fresh)->DigestOf(0, 1 << 20);
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(*digest, Digest(src.data(), 1 << 20));
}

// A descriptor that names a range outside the target's registrations never reaches the provider: the engine
// and the transport refuse it, and the target's bytes beyond its buffer are untouched.
TEST(EfaFaultTest, RangeOutsideTheTargetsBufferIsRefused) {
  auto a = TransferEngine::Create(Options());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<uint8_t> src(1 << 20);
  ASSERT_TRUE((*a)->RegisterMemory(src.data(), src.size()).ok());
  auto target = StartTarget();
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  auto h = (*a)->OpenSegment((*target)->segment_name());
  ASSERT_TRUE(h.ok());
  const uint64_t end = (*target)->buffer_address() + (*target)->buffer_size();
  Status st = (*a)->TransferSync({{OpCode::kWrite, src.data(), *h, end - 4096, 8192}}, std::chrono::seconds(10));
  EXPECT_EQ(st.code(), ErrorCode::kAddressNotRegistered) << st.ToString();
  // The connection is intact (a wrong key on tcp;ofi_rxm would have killed it silently).
  st = (*a)->TransferSync({{OpCode::kWrite, src.data(), *h, end - 4096, 4096}}, std::chrono::seconds(10));
  EXPECT_TRUE(st.ok()) << st.ToString();
}

}  // namespace
}  // namespace mooncake::te::efa
