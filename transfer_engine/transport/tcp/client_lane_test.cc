#include "transfer_engine/transport/tcp/client_lane.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
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

// Slices that wait for the peer while a caller drives the lane are handed out when the lane reports room:
// a drive that completes slices must say so, or the waiting ones stay queued forever.
TEST(ClientLaneTest, DriveThatCompletesSlicesReportsRoom) {
  auto listen_fd = net::Listen("127.0.0.1", 0, 4);
  ASSERT_TRUE(listen_fd.ok());
  std::thread server(AckServer, *listen_fd);
  EngineConfig config;
  IoLoop loop("lane-test");
  ASSERT_TRUE(loop.Start(nullptr, std::chrono::milliseconds(100)).ok());
  Path path;
  path.remote_ip = "127.0.0.1";
  path.port = net::LocalPort(*listen_fd);
  path.label = "test path";
  CountingOwner owner;
  std::vector<char> src(4096, 'x');
  auto batch = std::make_shared<Batch>(1);
  {
    ClientLane lane(config, &loop, &path, &owner);
    auto task = batch->AddTask();
    ASSERT_TRUE(task.ok());
    batch->StartTask(*task, CutIntoSlices(OpCode::kWrite, src.data(), 0x1000, src.size(), 1 << 20), nullptr);
    std::vector<Slice*> slices{&(*task)->slices()[0]};
    ASSERT_TRUE(lane.TryDrive(slices));
    ASSERT_TRUE(batch->WaitUntil(std::chrono::steady_clock::now() + std::chrono::seconds(5)));
    EXPECT_EQ(batch->task(0).status().state, TransferState::kCompleted) << batch->task(0).error().ToString();
    EXPECT_GE(owner.room.load(), 1);
    loop.Stop();
  }
  shutdown(*listen_fd, SHUT_RDWR);
  server.join();
  close(*listen_fd);
}

// After the transport stopped its lanes (and loops), a slice handed to a lane late (a Submit racing Stop)
// must still complete, with an error, instead of reconnecting onto a loop that no longer runs.
TEST(ClientLaneTest, EnqueueAfterShutdownAbortCompletesWithError) {
  auto listen_fd = net::Listen("127.0.0.1", 0, 4);
  ASSERT_TRUE(listen_fd.ok());
  EngineConfig config;
  IoLoop loop("lane-test");
  ASSERT_TRUE(loop.Start(nullptr, std::chrono::milliseconds(100)).ok());
  Path path;
  path.remote_ip = "127.0.0.1";
  path.port = net::LocalPort(*listen_fd);
  path.label = "test path";
  CountingOwner owner;
  std::vector<char> src(4096, 'x');
  auto batch = std::make_shared<Batch>(1);
  {
    ClientLane lane(config, &loop, &path, &owner);
    lane.Abort(Status(ErrorCode::kSocket, "shutting down"), /*reroute=*/false);
    loop.Stop();
    auto task = batch->AddTask();
    ASSERT_TRUE(task.ok());
    batch->StartTask(*task, CutIntoSlices(OpCode::kWrite, src.data(), 0x1000, src.size(), 1 << 20), nullptr);
    lane.Enqueue({&(*task)->slices()[0]});
    ASSERT_TRUE(batch->WaitUntil(std::chrono::steady_clock::now() + std::chrono::seconds(2)));
    EXPECT_EQ(batch->task(0).status().state, TransferState::kFailed);
    EXPECT_FALSE(lane.connected());
  }
  close(*listen_fd);
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
