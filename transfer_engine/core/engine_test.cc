// The engine's API semantics end to end (validation, segments, batches, notifications, managed memory): two
// engines in one process (P2P handshake mode), over the same-host transport and, with force_tcp, over real TCP
// sockets. Per-transport behaviour is the shared conformance suite (transport/conformance/).
#include "transfer_engine/api/engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace mooncake::te {
namespace {

std::unique_ptr<TransferEngine> MakeEngine(bool force_tcp = false) {
  EngineOptions o;
  o.config.force_tcp = force_tcp;
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
