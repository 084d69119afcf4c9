// The shared transport conformance suite: data integrity at every size and offset, the batch state machine,
// many small tasks, concurrent submitters, notifications after the data, refusal of withdrawn memory, the
// transport under test carrying every byte, declared capabilities, device memory, peers of another host, and a
// target that vanishes. Each test runs with the target in this process and in a child process.
#include "transfer_engine/transport/conformance/conformance.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/transport/conformance/pattern.h"
#include "transfer_engine/transport/conformance/target.h"
#include "transfer_engine/transport/testing/fault_transport.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::conformance {

void PrintTo(const ConformanceCase& c, std::ostream* os) { *os << c.transport.name << " " << PeerModeName(c.mode); }

std::vector<ConformanceCase> ConformanceCases(const TransportUnderTest& t) {
  return {{t, PeerMode::kInProcess}, {t, PeerMode::kTwoProcess}};
}

std::string ConformanceName(const ::testing::TestParamInfo<ConformanceCase>& info) {
  std::string name = info.param.transport.name;
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name + "_" + PeerModeName(info.param.mode);
}

EngineOptions ConformanceEngineOptions(const TransportUnderTest& t) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  if (t.only_this_transport) {
    o.transports = {t.name};
    o.protocol = t.name;
  }
  if (t.configure) t.configure(o);
  return o;
}

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSize = 16 << 20;
constexpr uint64_t kSourceSeed = 1;
constexpr auto kSyncTimeout = std::chrono::seconds(20);

// Bytes a transport's Stats() says it moved: the sum of the "bytes" of its per-path entries.
uint64_t CarriedBytes(const std::string& stats_json, const std::string& transport) {
  auto j = nlohmann::json::parse(stats_json, nullptr, false);
  if (!j.is_object() || !j.contains(transport) || !j[transport].is_object()) return 0;
  uint64_t sum = 0;
  for (const auto& [path, counters] : j[transport].items()) {
    if (counters.is_object() && counters.contains("bytes") && counters["bytes"].is_number_unsigned()) {
      sum += counters["bytes"].get<uint64_t>();
    }
  }
  return sum;
}

// The initiator (in this process) and the target of one case.
class Pair {
 public:
  // Creates both; on error, `why` says what failed.
  static std::unique_ptr<Pair> Make(const ConformanceCase& c, Status* why, bool other_host = false) {
    std::unique_ptr<Pair> p(new Pair());
    EngineOptions o = ConformanceEngineOptions(c.transport);
    TargetOptions to;
    to.engine = o;
    to.buffer_size = kSize;
    to.fault_transports = testing::RegisteredFaultTransports();
    to.buffer_file = c.transport.target_buffer_file;
    to.buffer_file_offset = c.transport.target_buffer_offset;
    to.other_host = other_host;
    auto target = c.mode == PeerMode::kInProcess ? StartInProcessTarget(to) : StartPeerProcessTarget(to);
    if (!target.ok()) {
      *why = target.status();
      return nullptr;
    }
    p->target = std::move(target.value());
    auto a = TransferEngine::Create(o);
    if (!a.ok()) {
      *why = a.status();
      return nullptr;
    }
    p->a = std::move(a.value());
    p->src.resize(kSize);
    FillPattern(p->src.data(), kSize, kSourceSeed, 0);
    *why = p->a->RegisterMemory(p->src.data(), p->src.size());
    if (!why->ok()) return nullptr;
    auto h = p->a->OpenSegment(p->target->segment_name());
    if (!h.ok()) {
      *why = h.status();
      return nullptr;
    }
    p->peer = *h;
    return p;
  }

  TransferRequest Req(OpCode op, size_t local_off, size_t remote_off, size_t len) {
    TransferRequest r;
    r.opcode = op;
    r.source = src.data() + local_off;
    r.target = peer;
    r.target_address = target->buffer_address() + remote_off;
    r.length = len;
    return r;
  }

  Status Sync(std::vector<TransferRequest> reqs) { return a->TransferSync(reqs, kSyncTimeout); }

  uint64_t Carried(const std::string& transport) const { return CarriedBytes(a->StatsJson(), transport); }

  // Declared in destruction order: the initiator first, then the target, then the memory the initiator used.
  std::vector<uint8_t> src;
  std::unique_ptr<Target> target;
  std::unique_ptr<TransferEngine> a;
  SegmentHandle peer = kInvalidSegment;

 private:
  Pair() = default;
};

// Creates the Pair `p` of the current case, or fails the test.
#define MAKE_PAIR(p)                                 \
  Status p##_status;                                 \
  auto p = Pair::Make(GetParam(), &p##_status);      \
  ASSERT_TRUE(p != nullptr) << "setting up the engines failed: " << p##_status.ToString()

}  // namespace

void TransportConformanceTest::SetUp() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info->name();
  test = test.substr(0, test.find('/'));
  const auto& known = GetParam().transport.known_failures;
  auto it = known.find(test + "/" + PeerModeName(GetParam().mode));
  if (it == known.end()) it = known.find(test);
  const char* run = getenv("MC_CONFORMANCE_RUN_KNOWN_FAILURES");
  if (it != known.end() && !(run && std::string(run) == "1")) {
    GTEST_SKIP() << "known failure of '" << GetParam().transport.name << "': " << it->second
                 << " (MC_CONFORMANCE_RUN_KNOWN_FAILURES=1 runs it)";
  }
}

namespace {

TEST_P(TransportConformanceTest, EverySizeAndOffsetArrivesIntact) {
  MAKE_PAIR(p);
  std::mt19937 rng(7);
  uint64_t seed = 100;
  for (size_t len : {size_t{1}, size_t{3}, size_t{4096}, size_t{65535}, size_t{1} << 20, (size_t{5} << 20) + 7}) {
    size_t lo = rng() % (kSize - len), ro = rng() % (kSize - len);
    ASSERT_TRUE(p->Sync({p->Req(OpCode::kWrite, lo, ro, len)}).ok()) << len;
    auto digest = p->target->DigestOf(ro, len);
    ASSERT_TRUE(digest.ok()) << digest.status().ToString();
    ASSERT_EQ(*digest, Digest(p->src.data() + lo, len)) << "write of " << len << " bytes";
    ASSERT_TRUE(p->target->Fill(ro, len, ++seed).ok());
    Status st = p->Sync({p->Req(OpCode::kRead, lo, ro, len)});
    ASSERT_TRUE(st.ok()) << len << ": " << st.ToString();
    ASSERT_TRUE(MatchesPattern(p->src.data() + lo, len, seed, ro)) << "read of " << len << " bytes";
    FillPattern(p->src.data() + lo, len, kSourceSeed, lo);
  }
}

TEST_P(TransportConformanceTest, BatchOfManySmallTasksCompletesTaskByTask) {
  MAKE_PAIR(p);
  constexpr size_t kTasks = 128, kLen = 4096;
  auto batch = p->a->AllocateBatch(kTasks);
  ASSERT_TRUE(batch.ok());
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < kTasks; ++i) reqs.push_back(p->Req(OpCode::kWrite, i * kLen, (kTasks - 1 - i) * kLen, kLen));
  ASSERT_TRUE(p->a->Submit(*batch, reqs).ok());
  auto st = p->a->WaitBatch(*batch, kSyncTimeout);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->state, TransferState::kCompleted);
  EXPECT_EQ(st->transferred_bytes, kTasks * kLen);
  for (size_t i = 0; i < kTasks; ++i) {
    EXPECT_EQ(p->a->GetTaskStatus(*batch, i)->state, TransferState::kCompleted) << i;
    auto digest = p->target->DigestOf((kTasks - 1 - i) * kLen, kLen);
    ASSERT_TRUE(digest.ok()) << digest.status().ToString();
    ASSERT_EQ(*digest, Digest(p->src.data() + i * kLen, kLen)) << "task " << i;
  }
  EXPECT_TRUE(p->a->FreeBatch(*batch).ok());
  EXPECT_EQ(p->a->FreeBatch(*batch).code(), ErrorCode::kInvalidArgument);  // freed handles are gone
}

TEST_P(TransportConformanceTest, ConcurrentSubmittersDoNotInterfere) {
  MAKE_PAIR(p);
  constexpr int kThreads = 4;
  constexpr size_t kChunk = kSize / kThreads;
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 8 && results[t].ok(); ++round) {
        results[t] = p->Sync({p->Req(OpCode::kWrite, t * kChunk, t * kChunk, kChunk)});
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& r : results) EXPECT_TRUE(r.ok()) << r.ToString();
  auto digest = p->target->DigestOf(0, kSize);
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(*digest, Digest(p->src.data(), kSize));
}

TEST_P(TransportConformanceTest, NotificationArrivesAfterTheData) {
  if (!GetParam().transport.supports_notify) GTEST_SKIP() << "the transport does not support notifications";
  MAKE_PAIR(p);
  Notification n{"kv-ready", "req-7"};
  Status st = p->a->TransferSync({p->Req(OpCode::kWrite, 0, 0, 1 << 20)}, kSyncTimeout, &n);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto got = p->target->WaitNotification(std::chrono::seconds(10), 0, 1 << 20);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->notification.name, "kv-ready");
  EXPECT_EQ(got->notification.message, "req-7");
  EXPECT_EQ(got->digest, Digest(p->src.data(), 1 << 20)) << "the notification arrived before the data";
}

TEST_P(TransportConformanceTest, WithdrawnMemoryIsNeverWritten) {
  MAKE_PAIR(p);
  const ErrorCode expected = GetParam().transport.withdrawn_memory_error;
  ASSERT_TRUE(p->Sync({p->Req(OpCode::kWrite, 0, 0, 64)}).ok());  // the initiator caches the descriptor
  ASSERT_TRUE(p->target->Unregister().ok());
  ASSERT_TRUE(p->target->Fill(0, 64, 0x5a).ok());
  auto before = p->target->DigestOf(0, 64);
  ASSERT_TRUE(before.ok());
  Status st = p->Sync({p->Req(OpCode::kWrite, 64, 0, 64)});
  EXPECT_EQ(st.code(), expected) << st.ToString();
  st = p->Sync({p->Req(OpCode::kRead, 64, 0, 64)});
  EXPECT_EQ(st.code(), expected) << "a read of withdrawn memory: " << st.ToString();
  auto after = p->target->DigestOf(0, 64);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, *before) << "withdrawn memory was written";
  p->a->InvalidateSegment(p->target->segment_name());
  EXPECT_EQ(p->Sync({p->Req(OpCode::kWrite, 64, 0, 64)}).code(), ErrorCode::kAddressNotRegistered);
}

TEST_P(TransportConformanceTest, CountersShowTheTransportCarriedTheData) {
  MAKE_PAIR(p);
  const std::string& name = GetParam().transport.name;
  std::vector<std::string> installed = p->a->InstalledTransports();
  if (GetParam().transport.only_this_transport) {
    EXPECT_EQ(installed, std::vector<std::string>{name});
  } else {
    EXPECT_NE(std::find(installed.begin(), installed.end(), name), installed.end()) << name << " is not installed";
  }
  ASSERT_TRUE(p->Sync({p->Req(OpCode::kWrite, 0, 0, 1 << 20)}).ok());
  ASSERT_TRUE(p->Sync({p->Req(OpCode::kRead, 1 << 20, 0, 1 << 20)}).ok());
  std::string stats = p->a->StatsJson();
  EXPECT_GE(CarriedBytes(stats, name), uint64_t{2} << 20) << stats;
  for (const auto& other : installed) {
    if (other == name) continue;
    EXPECT_EQ(CarriedBytes(stats, other), 0u) << other << " carried bytes: " << stats;
  }
}

TEST_P(TransportConformanceTest, DeclaredCapabilitiesMatchTheFlags) {
  if (GetParam().mode != PeerMode::kInProcess) GTEST_SKIP() << "independent of the peer: checked InProcess";
  const TransportUnderTest& t = GetParam().transport;
  const TransportPlugin* plugin = TransportRegistry::Get().FindByProtocol(t.name);
  ASSERT_NE(plugin, nullptr) << "no transport named '" << t.name << "' is registered";
  ASSERT_EQ(plugin->name, t.name);
  ASSERT_TRUE(plugin->create);
  std::unique_ptr<Transport> transport = plugin->create();
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(transport->name(), t.name);
  TransportCapabilities caps = transport->capabilities();
  EXPECT_EQ(caps.same_host, t.same_host);
  EXPECT_EQ(caps.remote_hosts, t.remote_hosts);
  EXPECT_TRUE(caps.Moves(MemoryType::kHost, MemoryType::kHost));
  for (MemoryType kind : t.device_memory) EXPECT_TRUE(caps.Moves(kind, kind)) << MemoryTypeName(kind);
  EXPECT_GT(transport->slice_size(), 0u);
}

TEST_P(TransportConformanceTest, DeviceMemoryArrivesIntact) {
  const TransportUnderTest& t = GetParam().transport;
  if (t.device_memory.empty()) GTEST_SKIP() << "the transport declares no device memory kind";
  if (GetParam().mode != PeerMode::kInProcess) GTEST_SKIP() << "the peer process registers host memory only";
  EngineOptions o = ConformanceEngineOptions(t);
  std::string skipped;
  for (MemoryType kind : t.device_memory) {
    auto platform = PlatformRegistry::Get().ForType(kind);
    if (!platform) {
      skipped += std::string(skipped.empty() ? "" : ", ") + MemoryTypeName(kind);
      continue;
    }
    constexpr size_t kLen = 1 << 20;
    auto a = TransferEngine::Create(o);
    auto b = TransferEngine::Create(o);
    ASSERT_TRUE(a.ok() && b.ok());
    auto local = platform->Allocate(kLen, AllocationKind::kDevice, 0);
    auto remote = platform->Allocate(kLen, AllocationKind::kDevice, 0);
    ASSERT_TRUE(local.ok() && remote.ok()) << MemoryTypeName(kind);
    std::string location = MemoryKind{kind, 0}.ToString();
    std::vector<uint8_t> staging(kLen);
    FillPattern(staging.data(), kLen, 9, 0);
    auto copy = [&](void* dst, const void* src) {
      auto c = platform->CopyAsync(dst, src, kLen, 0);
      return c.ok() ? (*c)->Wait() : c.status();
    };
    ASSERT_TRUE(copy(*local, staging.data()).ok());
    ASSERT_TRUE((*a)->RegisterMemory(*local, kLen, location).ok());
    ASSERT_TRUE((*b)->RegisterMemory(*remote, kLen, location).ok());
    auto h = (*a)->OpenSegment((*b)->segment_name());
    ASSERT_TRUE(h.ok());
    TransferRequest r{OpCode::kWrite, *local, *h, reinterpret_cast<uint64_t>(*remote), kLen};
    Status st = (*a)->TransferSync({r}, kSyncTimeout);
    EXPECT_TRUE(st.ok()) << location << ": " << st.ToString();
    std::fill(staging.begin(), staging.end(), 0);
    ASSERT_TRUE(copy(staging.data(), *remote).ok());
    EXPECT_TRUE(MatchesPattern(staging.data(), kLen, 9, 0)) << location << " memory arrived damaged";
    EXPECT_GE(CarriedBytes((*a)->StatsJson(), t.name), kLen);
    a->reset();
    b->reset();
    EXPECT_TRUE(platform->Free(*local, kLen, AllocationKind::kDevice).ok());
    EXPECT_TRUE(platform->Free(*remote, kLen, AllocationKind::kDevice).ok());
  }
  if (!skipped.empty()) GTEST_SKIP() << "no usable platform on this host for " << skipped << " memory";
}

TEST_P(TransportConformanceTest, ReachesAnEngineOfAnotherHost) {
  const TransportUnderTest& t = GetParam().transport;
  if (!t.remote_hosts) GTEST_SKIP() << "the transport does not reach other hosts";
  if (GetParam().mode != PeerMode::kTwoProcess) GTEST_SKIP() << "another host is emulated by a second process";
  Status why;
  auto p = Pair::Make(GetParam(), &why, /*other_host=*/true);
  if (!p && why.code() == ErrorCode::kNotImplemented) GTEST_SKIP() << why.message();
  ASSERT_TRUE(p != nullptr) << "setting up the engines failed: " << why.ToString();
  ASSERT_TRUE(p->Sync({p->Req(OpCode::kWrite, 0, 4096, 1 << 20)}).ok());
  auto digest = p->target->DigestOf(4096, 1 << 20);
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(*digest, Digest(p->src.data(), 1 << 20));
  ASSERT_TRUE(p->target->Fill(0, 1 << 20, 5).ok());
  ASSERT_TRUE(p->Sync({p->Req(OpCode::kRead, 0, 0, 1 << 20)}).ok());
  EXPECT_TRUE(MatchesPattern(p->src.data(), 1 << 20, 5, 0));
  EXPECT_GE(p->Carried(t.name), uint64_t{2} << 20);
}

TEST_P(TransportConformanceTest, DoesNotClaimAnEngineOfAnotherHost) {
  const TransportUnderTest& t = GetParam().transport;
  if (!t.same_host_only()) GTEST_SKIP() << "the transport is not same-host only";
  if (GetParam().mode != PeerMode::kTwoProcess) GTEST_SKIP() << "another host is emulated by a second process";
  Status why;
  auto p = Pair::Make(GetParam(), &why, /*other_host=*/true);
  if (!p && why.code() == ErrorCode::kNotImplemented) GTEST_SKIP() << why.message();
  ASSERT_TRUE(p != nullptr) << "setting up the engines failed: " << why.ToString();
  Status st = p->Sync({p->Req(OpCode::kWrite, 0, 0, 65536)});
  if (t.only_this_transport) {
    EXPECT_EQ(st.code(), ErrorCode::kNotImplemented) << "nothing else could reach it: " << st.ToString();
  } else if (st.ok()) {  // another transport moved it
    auto digest = p->target->DigestOf(0, 65536);
    ASSERT_TRUE(digest.ok());
    EXPECT_EQ(*digest, Digest(p->src.data(), 65536));
  }
  EXPECT_EQ(p->Carried(t.name), 0u) << p->a->StatsJson();
}

TEST_P(TransportConformanceTest, TargetThatVanishedFailsInBoundedTime) {
  MAKE_PAIR(p);
  ASSERT_TRUE(p->Sync({p->Req(OpCode::kWrite, 0, 0, 65536)}).ok());  // connections and descriptor cached
  p->target->Vanish();
  auto start = Clock::now();
  Status st = p->Sync({p->Req(OpCode::kWrite, 0, 0, 65536)});
  auto took = Clock::now() - start;
  EXPECT_FALSE(st.ok()) << "a write into an engine that is gone succeeded";
  EXPECT_LT(took, std::chrono::seconds(15)) << st.ToString();
  st = p->Sync({p->Req(OpCode::kRead, 0, 0, 65536)});
  EXPECT_FALSE(st.ok()) << "a read from an engine that is gone succeeded";
}

}  // namespace
}  // namespace mooncake::te::conformance
