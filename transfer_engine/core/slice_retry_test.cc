// SliceRetrier on a pool of retry threads: a peer whose descriptor refresh hangs holds only its own segment's
// retries; one segment's retries never run on two threads at once.
#include "transfer_engine/core/slice_retry.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "transfer_engine/core/batch.h"

namespace mooncake::te {
namespace {

using namespace std::chrono_literals;

bool Terminal(const Task& t) {
  TransferState s = t.status().state;
  return s == TransferState::kCompleted || s == TransferState::kFailed || s == TransferState::kTimeout;
}

bool WaitTerminal(const Task& t, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!Terminal(t)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(SliceRetrierTest, AHungPeerRefreshDoesNotDelayAnotherPeersRetry) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  int slow_inside = 0, slow_max_inside = 0, slow_refreshes = 0;

  SliceRetrier::Services s;
  s.descriptor = [&](const std::string& name, bool refresh) -> StatusOr<std::shared_ptr<const SegmentDescriptor>> {
    if (name == "slow" && refresh) {
      std::unique_lock lock(mu);
      slow_refreshes++;
      slow_max_inside = std::max(slow_max_inside, ++slow_inside);
      cv.wait_for(lock, 20s, [&] { return release; });  // the hung peer (bounded so a broken test ends)
      --slow_inside;
      return Status(ErrorCode::kMetadata, "slow peer gone");
    }
    auto d = std::make_shared<SegmentDescriptor>();
    d->name = name;  // registers nothing: the retried slice fails with kAddressNotRegistered
    return std::shared_ptr<const SegmentDescriptor>(d);
  };
  s.forget = [](const std::string&) {};
  TransportSet transports;
  MemoryRegistry memory;
  WorkQueue worker(4);
  s.transports = &transports;
  s.memory = &memory;
  s.worker = &worker;
  SliceRetrier retrier(std::move(s));

  auto batch = std::make_shared<Batch>(3);
  std::vector<char> buf(4096);
  Task* tasks[3];
  const char* segments[3] = {"slow", "slow", "fast"};
  for (int i = 0; i < 3; ++i) {
    auto t = batch->AddTask();
    ASSERT_TRUE(t.ok());
    tasks[i] = *t;
    tasks[i]->route.segment = segments[i];
    batch->StartTask(tasks[i], CutIntoSlices(OpCode::kWrite, buf.data(), 0x1000, 64, 1 << 20), nullptr);
  }
  Status lost(ErrorCode::kSocket, "connection reset");
  // The slow peer's first slice is retried (its refresh hangs); a later slice of it has to wait its turn.
  ASSERT_TRUE(retrier.OnFailure(&tasks[0]->slices()[0], lost, SliceRetry::kRefreshPeer));
  for (auto deadline = std::chrono::steady_clock::now() + 10s;;) {
    {
      std::lock_guard lock(mu);
      if (slow_inside == 1) break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the slow peer's refresh never started";
    std::this_thread::sleep_for(5ms);
  }
  // Handed out after that refresh started: it asks for a refresh of its own, on the same segment.
  tasks[1]->slices()[0].handed_out = std::chrono::steady_clock::now();
  ASSERT_TRUE(retrier.OnFailure(&tasks[1]->slices()[0], lost, SliceRetry::kRefreshPeer));
  ASSERT_TRUE(retrier.OnFailure(&tasks[2]->slices()[0], lost, SliceRetry::kRefreshPeer));

  // The other peer's retry finishes while the slow one still hangs.
  EXPECT_TRUE(WaitTerminal(*tasks[2], 5s)) << "a hung peer's refresh delayed another peer's retry";
  EXPECT_EQ(tasks[2]->error().code(), ErrorCode::kAddressNotRegistered) << tasks[2]->error().ToString();
  EXPECT_FALSE(Terminal(*tasks[0]));
  EXPECT_FALSE(Terminal(*tasks[1]));

  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  EXPECT_TRUE(WaitTerminal(*tasks[0], 10s));
  EXPECT_TRUE(WaitTerminal(*tasks[1], 10s));
  worker.Stop();
  std::lock_guard lock(mu);
  EXPECT_EQ(slow_max_inside, 1) << "one segment's retries ran on two threads at once";
  EXPECT_EQ(slow_refreshes, 2);  // in order: the second slice's own refresh after the first
  EXPECT_NE(tasks[0]->error().message().find("slow peer gone"), std::string::npos) << tasks[0]->error().ToString();
}

}  // namespace
}  // namespace mooncake::te
