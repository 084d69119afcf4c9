#include "transfer_engine/core/batch.h"

#include <gtest/gtest.h>

#include <thread>

namespace mooncake::te {
namespace {

std::vector<Slice> Slices(int n, size_t len) {
  std::vector<Slice> out(n);
  for (auto& s : out) s.length = len;
  return out;
}

TEST(BatchTest, CompletesWhenAllSlicesDo) {
  auto b = std::make_shared<Batch>(2);
  auto t0 = b->AddTask();
  auto t1 = b->AddTask();
  ASSERT_TRUE(t0.ok() && t1.ok());
  EXPECT_EQ(b->AddTask().status().code(), ErrorCode::kTooManyRequests);
  b->StartTask(*t0, Slices(3, 10), nullptr);
  b->StartTask(*t1, Slices(1, 5), nullptr);
  EXPECT_EQ(b->status().state, TransferState::kPending);
  for (auto& s : (*t0)->slices()) s.Complete(Status::Ok());
  EXPECT_EQ((*t0)->status().state, TransferState::kCompleted);
  EXPECT_EQ((*t0)->status().transferred_bytes, 30u);
  EXPECT_FALSE(b->finished());
  (*t1)->slices()[0].Complete(Status::Ok());
  EXPECT_TRUE(b->finished());
  EXPECT_EQ(b->status().state, TransferState::kCompleted);
  EXPECT_EQ(b->status().transferred_bytes, 35u);
}

TEST(BatchTest, OneFailedSliceFailsTheTaskAndKeepsTheFirstError) {
  auto b = std::make_shared<Batch>(1);
  Task* t = *b->AddTask();
  b->StartTask(t, Slices(3, 10), nullptr);
  t->slices()[0].Complete(Status::Ok());
  t->slices()[1].Complete(Status(ErrorCode::kRemoteRejected, "first"));
  EXPECT_EQ(t->status().state, TransferState::kPending);  // not terminal until every slice reported
  t->slices()[2].Complete(Status(ErrorCode::kSocket, "second"));
  EXPECT_EQ(t->status().state, TransferState::kFailed);
  EXPECT_EQ(t->error().message(), "first");
  EXPECT_EQ(b->status().state, TransferState::kFailed);
}

TEST(BatchTest, TimeoutStateAndEmptyTask) {
  auto b = std::make_shared<Batch>(2);
  Task* t = *b->AddTask();
  b->StartTask(t, Slices(1, 10), nullptr);
  t->slices()[0].Complete(Status(ErrorCode::kTimeout, "slow"));
  EXPECT_EQ(t->status().state, TransferState::kTimeout);
  Task* empty = *b->AddTask();
  b->StartTask(empty, {}, nullptr);
  EXPECT_EQ(empty->status().state, TransferState::kCompleted);
  EXPECT_EQ(b->status().state, TransferState::kTimeout);
}

TEST(BatchTest, WaitBlocksUntilCompletionAndCallbackRunsOnce) {
  auto b = std::make_shared<Batch>(1);
  Task* t = *b->AddTask();
  b->StartTask(t, Slices(1, 1), nullptr);
  int calls = 0;
  b->OnFinished([&](const Batch&) { ++calls; });
  EXPECT_FALSE(b->WaitUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
  std::thread completer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    t->slices()[0].Complete(Status::Ok());
  });
  EXPECT_TRUE(b->WaitUntil(std::chrono::steady_clock::now() + std::chrono::seconds(5)));
  completer.join();
  EXPECT_EQ(calls, 1);
  int late = 0;
  b->OnFinished([&](const Batch&) { ++late; });  // registered after completion: runs at once
  EXPECT_EQ(late, 1);
}

TEST(BatchTest, InFlightTasksKeepTheBatchAliveAfterTheHandleIsDropped) {
  auto b = std::make_shared<Batch>(1);
  std::weak_ptr<Batch> weak = b;
  Task* t = *b->AddTask();
  b->StartTask(t, Slices(1, 8), nullptr);
  Slice* s = &t->slices()[0];
  b.reset();
  EXPECT_FALSE(weak.expired());
  s->Complete(Status::Ok());
  EXPECT_TRUE(weak.expired());
}

TEST(SlicingTest, CutsMergesTailAndCoversEveryByte) {
  char base[1];
  auto check = [&](size_t len, size_t slice, std::vector<size_t> expected) {
    auto slices = CutIntoSlices(OpCode::kRead, base, 1000, len, slice);
    std::vector<size_t> lens;
    size_t off = 0;
    for (const auto& s : slices) {
      EXPECT_EQ(s.local, base + off);
      EXPECT_EQ(s.remote, 1000 + off);
      EXPECT_EQ(s.opcode, OpCode::kRead);
      lens.push_back(s.length);
      off += s.length;
    }
    EXPECT_EQ(off, len);
    EXPECT_EQ(lens, expected) << len << "/" << slice;
  };
  check(0, 64, {});
  check(10, 64, {10});
  check(64, 64, {64});
  check(80, 64, {80});       // tail 16 <= 64/4: merged
  check(84, 64, {64, 20});   // tail 20 > 16: its own slice
  check(256, 64, {64, 64, 64, 64});
}

}  // namespace
}  // namespace mooncake::te
