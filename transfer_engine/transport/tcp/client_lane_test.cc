#include "transfer_engine/transport/tcp/client_lane.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transfer_engine/common/net.h"

namespace mooncake::te::tcp {
namespace {

class CountingOwner : public LaneOwner {
 public:
  void OnLaneRoom(ClientLane*) override { room.fetch_add(1); }
  void OnLaneFailed(ClientLane*, std::vector<Slice*> slices, const Status& why) override {
    for (Slice* s : slices) s->Complete(why);
  }
  std::atomic<int> room{0};
};

// A target that acknowledges every WRITE frame (header + payload) on one accepted connection.
void AckServer(int listen_fd) {
  int fd = accept(listen_fd, nullptr, nullptr);
  if (fd < 0) return;
  auto deadline = net::Clock::now() + std::chrono::seconds(10);
  while (true) {
    uint8_t req[kRequestHeaderSize];
    if (!net::RecvAll(fd, req, sizeof(req), deadline).ok()) break;
    RequestHeader h;
    if (DecodeRequest(req, sizeof(req), 1 << 30, &h) != ParseResult::kOk) break;
    std::vector<char> payload(h.length);
    if (h.length && !net::RecvAll(fd, payload.data(), h.length, deadline).ok()) break;
    ResponseHeader r;
    r.seq = h.seq;
    uint8_t resp[kResponseHeaderSize];
    EncodeResponse(r, resp);
    if (!net::SendAll(fd, resp, sizeof(resp), deadline).ok()) break;
  }
  close(fd);
}

// A lane to a listening socket on 127.0.0.1 (nothing accepts unless a test serves it) on its own I/O loop,
// and one batch with one 4 KiB WRITE task to hand it.
class ClientLaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fd = net::Listen("127.0.0.1", 0, 4);
    ASSERT_TRUE(fd.ok());
    listen_fd_ = *fd;
    ASSERT_TRUE(loop_.Start(nullptr, std::chrono::milliseconds(100)).ok());
    path_.remote_ip = "127.0.0.1";
    path_.port = net::LocalPort(listen_fd_);
    path_.label = "test path";
  }
  void TearDown() override {
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  // Starts the batch's task; returns its only slice.
  Slice* StartWrite() {
    auto task = batch_->AddTask();
    EXPECT_TRUE(task.ok());
    if (!task.ok()) return nullptr;
    batch_->StartTask(*task, CutIntoSlices(OpCode::kWrite, src_.data(), 0x1000, src_.size(), 1 << 20), nullptr);
    return &(*task)->slices()[0];
  }

  int listen_fd_ = -1;
  TcpConfig config_;
  IoLoop loop_{"lane-test"};
  Path path_;
  CountingOwner owner_;
  std::vector<char> src_ = std::vector<char>(4096, 'x');
  std::shared_ptr<Batch> batch_ = std::make_shared<Batch>(1);
};

// Slices that wait for the peer while a caller drives the lane are handed out when the lane reports room:
// a drive that completes slices must say so, or the waiting ones stay queued forever.
TEST_F(ClientLaneTest, DriveThatCompletesSlicesReportsRoom) {
  std::thread server(AckServer, listen_fd_);
  {
    ClientLane lane(config_, &loop_, &path_, &owner_);
    Slice* slice = StartWrite();
    ASSERT_NE(slice, nullptr);
    std::vector<Slice*> slices{slice};
    ASSERT_TRUE(lane.TryDrive(slices));
    ASSERT_TRUE(batch_->WaitUntil(std::chrono::steady_clock::now() + std::chrono::seconds(5)));
    EXPECT_EQ(batch_->task(0).status().state, TransferState::kCompleted) << batch_->task(0).error().ToString();
    EXPECT_GE(owner_.room.load(), 1);
    loop_.Stop();
  }
  shutdown(listen_fd_, SHUT_RDWR);
  server.join();
}

// After the transport stopped its lanes (and loops), a slice handed to a lane late (a Submit racing Stop)
// must still complete, with an error, instead of reconnecting onto a loop that no longer runs.
TEST_F(ClientLaneTest, EnqueueAfterShutdownAbortCompletesWithError) {
  ClientLane lane(config_, &loop_, &path_, &owner_);
  lane.Abort(Status(ErrorCode::kSocket, "shutting down"), /*reroute=*/false);
  loop_.Stop();
  Slice* slice = StartWrite();
  ASSERT_NE(slice, nullptr);
  lane.Enqueue({slice});
  ASSERT_TRUE(batch_->WaitUntil(std::chrono::steady_clock::now() + std::chrono::seconds(2)));
  EXPECT_EQ(batch_->task(0).status().state, TransferState::kFailed);
  EXPECT_FALSE(lane.connected());
}

// The transport never connects (which can block) on an epoll thread; it tells them apart by this flag.
TEST(IoLoopTest, KnowsItsOwnThreads) {
  IoLoop loop("flag-test");
  ASSERT_TRUE(loop.Start(nullptr, std::chrono::milliseconds(100)).ok());
  std::atomic<int> seen{-1};
  loop.Post([&] { seen = IoLoop::OnAnyLoopThread() ? 1 : 0; });
  for (int i = 0; i < 500 && seen < 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(seen.load(), 1);
  EXPECT_FALSE(IoLoop::OnAnyLoopThread());
  loop.Stop();
}

}  // namespace
}  // namespace mooncake::te::tcp
