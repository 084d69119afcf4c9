// The engine's API semantics end to end (validation, segments, batches, notifications, managed memory): two
// engines in one process (P2P handshake mode), over the same-host transport and, with only the network
// transport installed, over real TCP sockets. Per-transport behaviour is the shared conformance suite (transport/conformance/).
#include "transfer_engine/api/engine.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstring>
#include <thread>
#include <numeric>
#include <vector>

namespace mooncake::te {
namespace {

std::unique_ptr<TransferEngine> MakeEngine(bool network_only = false) {
  EngineOptions o;
  if (network_only) o.transports = {"tcp"};
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  auto e = TransferEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e.value());
}

class EngineTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    a_ = MakeEngine(GetParam());
    b_ = MakeEngine(GetParam());
    src_.resize(8 << 20);
    dst_.resize(8 << 20);
    std::iota(src_.begin(), src_.end(), 0);
    ASSERT_TRUE(a_->RegisterMemory(src_.data(), src_.size()).ok());
    ASSERT_TRUE(b_->RegisterMemory(dst_.data(), dst_.size()).ok());
    auto h = a_->OpenSegment(b_->segment_name());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    peer_ = *h;
  }

  TransferRequest Req(OpCode op, size_t local_off, size_t remote_off, size_t len) {
    TransferRequest r;
    r.opcode = op;
    r.source = src_.data() + local_off;
    r.target = peer_;
    r.target_address = reinterpret_cast<uint64_t>(dst_.data()) + remote_off;
    r.length = len;
    return r;
  }

  std::unique_ptr<TransferEngine> a_, b_;
  std::vector<uint8_t> src_, dst_;
  SegmentHandle peer_ = kInvalidSegment;
};

TEST_P(EngineTest, BatchOfWritesAndReadsMovesTheBytes) {
  auto batch = a_->AllocateBatch(3);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(a_->Submit(*batch, {Req(OpCode::kWrite, 0, 0, 3 << 20), Req(OpCode::kWrite, 3 << 20, 5 << 20, 1),
                                  Req(OpCode::kWrite, 100, 4 << 20, 0)})
                  .ok());
  auto st = a_->WaitBatch(*batch, std::chrono::seconds(30));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, TransferState::kCompleted);
  EXPECT_EQ(st->transferred_bytes, (3u << 20) + 1);
  EXPECT_EQ(memcmp(src_.data(), dst_.data(), 3 << 20), 0);
  EXPECT_EQ(dst_[5 << 20], src_[3 << 20]);
  EXPECT_EQ(a_->GetTaskStatus(*batch, 1)->state, TransferState::kCompleted);
  EXPECT_EQ(a_->GetTaskStatus(*batch, 3).status().code(), ErrorCode::kInvalidArgument);
  // Each completed task's latency, per (transport, peer): the two that moved bytes (the empty one has no
  // slices and is not timed).
  auto stats = nlohmann::json::parse(a_->StatsJson());
  uint64_t timed = 0;
  for (const auto& [transport, peers] : stats["latency"].items()) {
    if (peers.contains(b_->segment_name())) timed += peers[b_->segment_name()]["count"].get<uint64_t>();
  }
  EXPECT_EQ(timed, 2u) << stats["latency"].dump();
  EXPECT_TRUE(a_->FreeBatch(*batch).ok());
  EXPECT_EQ(a_->GetBatchStatus(*batch).status().code(), ErrorCode::kInvalidArgument);

  memset(src_.data(), 0, 1 << 20);
  auto rb = a_->AllocateBatch(1);
  ASSERT_TRUE(a_->Submit(*rb, {Req(OpCode::kRead, 0, 0, 1 << 20)}).ok());
  EXPECT_EQ(a_->WaitBatch(*rb, std::chrono::seconds(30))->state, TransferState::kCompleted);
  EXPECT_EQ(memcmp(src_.data(), dst_.data(), 1 << 20), 0);
}

TEST_P(EngineTest, SubmitIsAllOrNothing) {
  auto batch = a_->AllocateBatch(4);
  ASSERT_TRUE(batch.ok());
  std::vector<uint8_t> unregistered(64);
  TransferRequest bad_local = Req(OpCode::kWrite, 0, 0, 64);
  bad_local.source = unregistered.data();
  TransferRequest bad_remote = Req(OpCode::kWrite, 0, dst_.size() - 8, 64);  // runs past the peer buffer
  TransferRequest bad_segment = Req(OpCode::kWrite, 0, 0, 64);
  bad_segment.target = 12345;
  EXPECT_EQ(a_->Submit(*batch, {Req(OpCode::kWrite, 0, 0, 64), bad_local}).code(), ErrorCode::kAddressNotRegistered);
  EXPECT_EQ(a_->Submit(*batch, {bad_remote}).code(), ErrorCode::kAddressNotRegistered);
  EXPECT_EQ(a_->Submit(*batch, {bad_segment}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(a_->GetBatchStatus(*batch)->state, TransferState::kWaiting);  // nothing was started
  std::vector<TransferRequest> five(5, Req(OpCode::kWrite, 0, 0, 8));
  EXPECT_EQ(a_->Submit(*batch, five).code(), ErrorCode::kTooManyRequests);
}

TEST_P(EngineTest, RequestOverAdjacentRegistrationsIsSplitAtTheirBoundary) {
  // Two registrations back to back (the halves of one allocation): a request over both is split between them;
  // one that runs past the second is still refused.
  std::vector<uint8_t> pair(2 << 20, 0);
  ASSERT_TRUE(b_->RegisterMemory(pair.data(), 1 << 20).ok());
  ASSERT_TRUE(b_->RegisterMemory(pair.data() + (1 << 20), 1 << 20).ok());
  TransferRequest r = Req(OpCode::kWrite, 7, 0, (1 << 20) + 4096);
  r.target_address = reinterpret_cast<uint64_t>(pair.data()) + (1 << 20) - 4096;
  ASSERT_TRUE(a_->TransferSync({r}, std::chrono::seconds(30)).ok());
  EXPECT_EQ(memcmp(pair.data() + (1 << 20) - 4096, src_.data() + 7, (1 << 20) + 4096), 0);
  TransferRequest past = Req(OpCode::kWrite, 0, 0, 8192);
  past.target_address = reinterpret_cast<uint64_t>(pair.data()) + (2 << 20) - 4096;
  EXPECT_EQ(a_->TransferSync({past}, std::chrono::seconds(30)).code(), ErrorCode::kAddressNotRegistered);
}

TEST_P(EngineTest, SegmentsNotificationsAndProbe) {
  EXPECT_EQ(a_->OpenSegment("").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(*a_->OpenSegment("/" + b_->segment_name()), peer_);
  EXPECT_EQ(*a_->OpenSegment(a_->segment_name()), kLocalSegment);
  EXPECT_FALSE(a_->OpenSegment("127.0.0.1:1").ok());  // nobody there
  auto buffers = a_->GetSegmentBuffers(b_->segment_name());
  ASSERT_TRUE(buffers.ok());
  ASSERT_EQ(buffers->size(), 1u);
  EXPECT_EQ(buffers->front().addr, reinterpret_cast<uint64_t>(dst_.data()));
  EXPECT_TRUE(a_->Probe(b_->segment_name()).ok());
  ASSERT_TRUE(a_->SendNotify(b_->segment_name(), {"name", "msg"}).ok());
  auto got = b_->TakeNotifications();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "msg");
  EXPECT_TRUE(b_->TakeNotifications().empty());
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Tcp" : "SameHost"; });

TEST_P(EngineTest, ManagedMemoryIsRegisteredAndPublished) {
  auto p = b_->AllocateManaged(1 << 20);
  ASSERT_TRUE(p.ok());
  memset(*p, 0x42, 1 << 20);
  auto batch = a_->AllocateBatch(1);
  TransferRequest r = Req(OpCode::kRead, 0, 0, 4096);
  r.target_address = reinterpret_cast<uint64_t>(*p);  // not in a_'s cached descriptor: refreshed on demand
  ASSERT_TRUE(a_->Submit(*batch, {r}).ok());
  EXPECT_EQ(a_->WaitBatch(*batch, std::chrono::seconds(30))->state, TransferState::kCompleted);
  EXPECT_EQ(src_[4095], 0x42);
  EXPECT_TRUE(b_->FreeManaged(*p, 1 << 20).ok());
}

TEST(EngineCreateTest, BadOptionsFailWithAReason) {
  EngineOptions o;
  o.local_server_name = "";
  EXPECT_EQ(TransferEngine::Create(o).status().code(), ErrorCode::kInvalidArgument);
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "zookeeper://x:1";
  auto e = TransferEngine::Create(o);
  EXPECT_EQ(e.status().code(), ErrorCode::kMetadata);
  EXPECT_NE(e.status().message().find("built-in"), std::string::npos);
}

}  // namespace
}  // namespace mooncake::te

namespace mooncake::te {
namespace {

// Threads submitting to one batch each get their own task slots: every request is counted and completes.
TEST_P(EngineTest, ConcurrentSubmitsToOneBatch) {
  constexpr size_t kThreads = 4, kSubmits = 100, kPerSubmit = 32;
  auto batch = a_->AllocateBatch(kThreads * kSubmits * kPerSubmit);
  ASSERT_TRUE(batch.ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<TransferRequest> reqs;
      for (size_t i = 0; i < kPerSubmit; ++i) reqs.push_back(Req(OpCode::kWrite, (t * kPerSubmit + i) * 64, (t * kPerSubmit + i) * 64, i % 2 ? 64 : 0));
      for (size_t s = 0; s < kSubmits; ++s) {
        if (!a_->Submit(*batch, reqs).ok()) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto st = a_->WaitBatch(*batch, std::chrono::seconds(20));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, TransferState::kCompleted);
  EXPECT_EQ(st->transferred_bytes, kThreads * kSubmits * (kPerSubmit / 2) * 64);
  EXPECT_TRUE(a_->GetTaskStatus(*batch, kThreads * kSubmits * kPerSubmit - 1).ok());
  EXPECT_TRUE(a_->FreeBatch(*batch).ok());
}

}  // namespace
}  // namespace mooncake::te

#include "transfer_engine/core/rpc.h"

namespace mooncake::te {
namespace {

// The RPC port takes frames from anyone: a metadata request whose segment_name is not a string is answered,
// not a crash of the engine.
TEST(EngineRpcTest, MetadataRequestWithNonStringSegmentName) {
  auto e = MakeEngine();
  RpcFrame f;
  f.type = RpcType::kMetadata;
  f.body = R"({"segment_name": 42})";
  auto reply = RpcCall("127.0.0.1", e->rpc_port(), f, std::chrono::milliseconds(5000), 1 << 20);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_NE(reply->body.find("buffers"), std::string::npos) << reply->body;
}

}  // namespace
}  // namespace mooncake::te

#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include "transfer_engine/common/net.h"

namespace mooncake::te {
namespace {

nlohmann::json Stats(const TransferEngine& e) { return nlohmann::json::parse(e.StatsJson()); }

Status Probe(const TransferEngine& e) {
  RpcFrame f;
  f.type = RpcType::kProbe;
  f.body = "{}";
  auto reply = RpcCall("127.0.0.1", e.rpc_port(), f, std::chrono::milliseconds(3000), 1 << 20);
  if (!reply.ok()) return reply.status();
  if (reply->body.find("success") == std::string::npos) return Status(ErrorCode::kRejectHandshake, reply->body);
  return Status::Ok();
}

// Slow and idle clients cannot lock peers out of the RPC port: with more connections open than the server
// keeps (idle ones, and ones trickling a request byte by byte), a new peer still gets its answer at once.
TEST(EngineRpcTest, ManySlowConnectionsDoNotLockOutNewPeers) {
  auto e = MakeEngine();
  std::vector<int> fds;
  for (size_t i = 0; i < RpcServer::kMaxConnections + 44; ++i) {
    auto fd = net::Connect("127.0.0.1", e->rpc_port(), std::chrono::milliseconds(2000));
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    fds.push_back(*fd);
  }
  for (size_t i = 0; i < 100; ++i) {  // 100 of them send the first bytes of a frame and then stall
    uint8_t partial[3] = {5, 0, 0};
    ASSERT_EQ(send(fds[fds.size() - 1 - i], partial, sizeof(partial), MSG_NOSIGNAL), 3);
  }
  for (int round = 0; round < 20; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(Probe(*e).ok()) << "round " << round;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  }
  auto rpc = Stats(*e)["listeners"]["rpc"];
  EXPECT_LE(rpc["open"].get<size_t>(), RpcServer::kMaxConnections);
  EXPECT_GE(rpc["evicted"].get<uint64_t>(), 44u);
  EXPECT_GE(rpc["served"].get<uint64_t>(), 20u);
  for (int fd : fds) close(fd);
}

// A connection that never completes its request is closed after the serve budget.
TEST(EngineRpcTest, IdleConnectionIsClosedAfterTheBudget) {
  auto e = MakeEngine();
  auto fd = net::Connect("127.0.0.1", e->rpc_port(), std::chrono::milliseconds(2000));
  ASSERT_TRUE(fd.ok());
  uint8_t partial[2] = {9, 0};
  ASSERT_EQ(send(*fd, partial, sizeof(partial), MSG_NOSIGNAL), 2);
  auto t0 = std::chrono::steady_clock::now();
  char c;
  timeval tv{RpcServer::kServeBudget.count() + 3, 0};
  setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(recv(*fd, &c, 1, 0), 0);  // closed by the server, not by our receive timeout
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, RpcServer::kServeBudget - std::chrono::milliseconds(500));
  EXPECT_LT(waited, RpcServer::kServeBudget + std::chrono::seconds(2));
  EXPECT_EQ(Stats(*e)["listeners"]["rpc"]["timed_out"].get<uint64_t>(), 1u);
  close(*fd);
  EXPECT_TRUE(Probe(*e).ok());
}

// Notifications nobody takes are bounded in bytes (MC_NOTIFY_QUEUE_BYTES) as well as in count: the ones that
// do not fit are refused (the sender is told) and counted; the queued ones are kept.
TEST(EngineRpcTest, NotificationQueueIsBoundedInBytes) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.config.notify_queue_bytes = 4 << 20;
  auto receiver = TransferEngine::Create(o);
  ASSERT_TRUE(receiver.ok());
  auto sender = MakeEngine();
  const std::string big(512 << 10, 'n');
  int accepted = 0, refused = 0;
  for (int i = 0; i < 20; ++i) {
    Status st = sender->SendNotify((*receiver)->segment_name(), {"n" + std::to_string(i), big});
    (st.ok() ? accepted : refused)++;
  }
  EXPECT_EQ(accepted, 7);  // 7 x (512 KiB + 2) fit in 4 MiB, an 8th does not
  EXPECT_EQ(refused, 13);
  auto n = Stats(**receiver)["notifications"];
  EXPECT_EQ(n["dropped"].get<uint64_t>(), 13u);
  EXPECT_LE(n["queued_bytes"].get<size_t>(), 4u << 20);
  auto got = (*receiver)->TakeNotifications();
  ASSERT_EQ(got.size(), 7u);
  EXPECT_EQ(got.front().name, "n0");  // the oldest are kept
  EXPECT_TRUE(sender->SendNotify((*receiver)->segment_name(), {"after", "small"}).ok());  // room again
  EXPECT_EQ((*receiver)->TakeNotifications().size(), 1u);
}

}  // namespace
}  // namespace mooncake::te

#include <arpa/inet.h>
#include <netinet/in.h>

namespace mooncake::te {
namespace {

// RPC requests are answered only once the engine is initialized: a peer hammering the (fixed) RPC port
// while Init runs gets either nothing yet or the finished engine's descriptor, never a half-built one.
TEST(EngineRpcTest, NoRequestIsServedBeforeInitFinishes) {
  int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&any), sizeof(any)), 0);
  socklen_t len = sizeof(any);
  getsockname(probe, reinterpret_cast<sockaddr*>(&any), &len);
  uint16_t port = ntohs(any.sin_port);
  close(probe);
  std::atomic<bool> done{false};
  std::atomic<int> answers{0}, bad{0};
  std::string first_bad;
  std::thread hammer([&] {
    while (!done.load()) {
      RpcFrame f;
      f.type = RpcType::kMetadata;
      f.body = "{}";
      auto reply = RpcCall("127.0.0.1", port, f, std::chrono::milliseconds(2000), 1 << 20);
      if (!reply.ok()) continue;
      ++answers;
      auto j = nlohmann::json::parse(reply->body, nullptr, false);
      bool whole = j.is_object() && j.value("name", "") == "127.0.0.1:" + std::to_string(port) &&
                   j.contains("instance") && j.contains("buffers");
      if (!whole && bad++ == 0) first_bad = reply->body;
    }
  });
  EngineOptions o;
  o.local_server_name = "127.0.0.1:" + std::to_string(port);
  o.metadata_conn = "P2PHANDSHAKE";
  o.config.legacy_rpc_port_binding = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto e = TransferEngine::Create(o);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  done = true;
  hammer.join();
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_GT(answers.load(), 0);
  EXPECT_EQ(bad.load(), 0) << first_bad;
}

}  // namespace
}  // namespace mooncake::te
