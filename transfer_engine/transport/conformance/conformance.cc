// The shared transport conformance suite: data integrity at every size and offset, batch state machine,
// many small tasks, concurrency, notifications after the data, refusal of withdrawn memory, and counters.
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "transfer_engine/transport/conformance/conformance.h"

namespace mooncake::te::conformance {
namespace {

constexpr size_t kSize = 16 << 20;

class Pair {
 public:
  explicit Pair(const TransportUnderTest& t) : src(kSize), dst(kSize) {
    for (auto* e : {&a, &b}) {
      EngineOptions o;
      o.local_server_name = "127.0.0.1";
      o.metadata_conn = "P2PHANDSHAKE";
      t.configure(o);
      auto created = TransferEngine::Create(o);
      EXPECT_TRUE(created.ok()) << created.status().ToString();
      *e = std::move(created.value());
    }
    std::mt19937 rng(1);
    for (auto& c : src) c = static_cast<uint8_t>(rng());
    EXPECT_TRUE(a->RegisterMemory(src.data(), src.size()).ok());
    EXPECT_TRUE(b->RegisterMemory(dst.data(), dst.size()).ok());
    auto h = a->OpenSegment(b->segment_name());
    EXPECT_TRUE(h.ok());
    peer = *h;
  }

  TransferRequest Req(OpCode op, size_t local_off, size_t remote_off, size_t len) const {
    TransferRequest r;
    r.opcode = op;
    r.source = const_cast<uint8_t*>(src.data()) + local_off;
    r.target = peer;
    r.target_address = reinterpret_cast<uint64_t>(dst.data()) + remote_off;
    r.length = len;
    return r;
  }

  Status Sync(std::vector<TransferRequest> reqs) { return a->TransferSync(reqs, std::chrono::seconds(60)); }

  std::unique_ptr<TransferEngine> a, b;
  std::vector<uint8_t> src, dst;
  SegmentHandle peer = kInvalidSegment;
};

TEST_P(TransportConformanceTest, EverySizeAndOffsetArrivesIntact) {
  Pair p(GetParam());
  std::mt19937 rng(7);
  for (size_t len : {size_t{1}, size_t{3}, size_t{4096}, size_t{65535}, size_t{1} << 20, (size_t{5} << 20) + 7}) {
    size_t lo = rng() % (kSize - len), ro = rng() % (kSize - len);
    ASSERT_TRUE(p.Sync({p.Req(OpCode::kWrite, lo, ro, len)}).ok()) << len;
    ASSERT_EQ(memcmp(p.src.data() + lo, p.dst.data() + ro, len), 0) << len;
    std::vector<uint8_t> expect(p.dst.begin() + ro, p.dst.begin() + ro + len);
    memset(p.src.data() + lo, 0, len);
    ASSERT_TRUE(p.Sync({p.Req(OpCode::kRead, lo, ro, len)}).ok()) << len;
    ASSERT_EQ(memcmp(p.src.data() + lo, expect.data(), len), 0) << len;
  }
}

TEST_P(TransportConformanceTest, BatchOfManySmallTasksCompletesTaskByTask) {
  Pair p(GetParam());
  constexpr size_t kTasks = 128, kLen = 4096;
  auto batch = p.a->AllocateBatch(kTasks);
  ASSERT_TRUE(batch.ok());
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < kTasks; ++i) reqs.push_back(p.Req(OpCode::kWrite, i * kLen, (kTasks - 1 - i) * kLen, kLen));
  ASSERT_TRUE(p.a->Submit(*batch, reqs).ok());
  auto st = p.a->WaitBatch(*batch, std::chrono::seconds(60));
  ASSERT_EQ(st->state, TransferState::kCompleted);
  EXPECT_EQ(st->transferred_bytes, kTasks * kLen);
  for (size_t i = 0; i < kTasks; ++i) {
    EXPECT_EQ(p.a->GetTaskStatus(*batch, i)->state, TransferState::kCompleted);
    ASSERT_EQ(memcmp(p.src.data() + i * kLen, p.dst.data() + (kTasks - 1 - i) * kLen, kLen), 0) << i;
  }
  EXPECT_TRUE(p.a->FreeBatch(*batch).ok());
}

TEST_P(TransportConformanceTest, ConcurrentSubmittersDoNotInterfere) {
  Pair p(GetParam());
  constexpr int kThreads = 4;
  constexpr size_t kChunk = kSize / kThreads;
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 8 && results[t].ok(); ++round) {
        results[t] = p.Sync({p.Req(OpCode::kWrite, t * kChunk, t * kChunk, kChunk)});
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& r : results) EXPECT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(memcmp(p.src.data(), p.dst.data(), kSize), 0);
}

TEST_P(TransportConformanceTest, NotificationArrivesAfterTheData) {
  Pair p(GetParam());
  Notification n{"kv-ready", "req-7"};
  ASSERT_TRUE(p.a->TransferSync({p.Req(OpCode::kWrite, 0, 0, 1 << 20)}, std::chrono::seconds(60), &n).ok());
  std::vector<Notification> got;
  for (int i = 0; i < 500 && got.empty(); ++i) {
    got = p.b->TakeNotifications();
    if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "req-7");
  EXPECT_EQ(memcmp(p.src.data(), p.dst.data(), 1 << 20), 0);
}

TEST_P(TransportConformanceTest, WithdrawnMemoryIsNeverWritten) {
  Pair p(GetParam());
  ASSERT_TRUE(p.Sync({p.Req(OpCode::kWrite, 0, 0, 64)}).ok());  // the initiator caches the descriptor
  ASSERT_TRUE(p.b->UnregisterMemory(p.dst.data()).ok());
  memset(p.dst.data(), 0x5a, 64);
  Status st = p.Sync({p.Req(OpCode::kWrite, 64, 0, 64)});
  EXPECT_EQ(st.code(), GetParam().withdrawn_memory_error) << st.ToString();
  for (int i = 0; i < 64; ++i) ASSERT_EQ(p.dst[i], 0x5a);
  p.a->InvalidateSegment(p.b->segment_name());
  EXPECT_EQ(p.Sync({p.Req(OpCode::kWrite, 64, 0, 64)}).code(), ErrorCode::kAddressNotRegistered);
}

TEST_P(TransportConformanceTest, CountersShowTheTransportCarriedTheData) {
  Pair p(GetParam());
  ASSERT_TRUE(p.Sync({p.Req(OpCode::kWrite, 0, 0, 1 << 20)}).ok());
  std::string stats = p.a->StatsJson();
  EXPECT_NE(stats.find("\"" + GetParam().name + "\":{\""), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"bytes\":1048576"), std::string::npos) << stats;
}

}  // namespace

std::string ConformanceName(const ::testing::TestParamInfo<TransportUnderTest>& info) { return info.param.name; }

}  // namespace mooncake::te::conformance
