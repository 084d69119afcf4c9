#include "transfer_engine/common/process_watch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace mooncake::te {
namespace {

// A child that sleeps until killed.
pid_t SleepingChild() {
  pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

bool ExitsWithin(const ProcessWatch& w, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!w.Exited()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class ProcessWatchTest : public ::testing::TestWithParam<bool> {};

TEST_P(ProcessWatchTest, SeesAKilledProcessAsExitedBeforeAndAfterReaping) {
  pid_t pid = SleepingChild();
  ASSERT_GT(pid, 0);
  uint64_t start = ProcessStartTime(pid);
  ASSERT_NE(start, 0u);
  auto w = ProcessWatch::Open(pid, start, GetParam());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_FALSE((*w)->Exited());
  kill(pid, SIGKILL);
  EXPECT_TRUE(ExitsWithin(**w, std::chrono::seconds(5)));  // a zombie: not reaped yet
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_TRUE((*w)->Exited());
  auto late = ProcessWatch::Open(pid, start, GetParam());
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), ErrorCode::kPeerUnreachable);
}

TEST_P(ProcessWatchTest, RefusesAPidHeldByAnotherProcess) {
  // Our own pid with another start time stands for a dead process whose pid we now hold.
  auto w = ProcessWatch::Open(getpid(), ProcessStartTime(getpid()) + 1, GetParam());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kPeerUnreachable);
  EXPECT_NE(w.status().message().find("another process"), std::string::npos) << w.status().message();
  auto self = ProcessWatch::Open(getpid(), 0, GetParam());
  ASSERT_TRUE(self.ok());
  EXPECT_FALSE((*self)->Exited());
  EXPECT_FALSE(ProcessWatch::Open(0, 0, GetParam()).ok());
  EXPECT_FALSE(ProcessWatch::Open(-5, 0, GetParam()).ok());
}

INSTANTIATE_TEST_SUITE_P(PidfdAndStartTime, ProcessWatchTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "pidfd" : "start_time"; });

}  // namespace
}  // namespace mooncake::te
