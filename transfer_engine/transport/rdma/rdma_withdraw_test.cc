// Withdrawn memory across processes on the FAKE verbs provider: this process (fake host "hostB") owns a buffer
// and unregisters it while its own slow transfer from it still runs (so the engine is draining); a writer in a
// child process (this binary again, running only the WriterRole test, fake host "hostA") that fetched the
// descriptor before then writes into the buffer: the write must fail, and nothing may land.

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/rdma/testing/fake_env.h"

extern char** environ;

namespace mooncake::te::rdma {
namespace {

constexpr const char* kRoleEnv = "MC_RDMA_WITHDRAW_TEST_ROLE";
constexpr size_t kSlow = 4 << 20;  // the owner's own transfer: 4 MiB at 2 MB/s, about 2 s

const bool kEnv = [] {
  fake::UseFakeVerbs(getenv(kRoleEnv) ? "fake_mlx5_0" : "fake_mlx5_0:mbps=2");
  setenv("MC_RDMA_FAKE_HOST", getenv(kRoleEnv) ? "hostA" : "hostB", 1);
  return true;
}();

EngineOptions Options() {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "rdma";
  o.transports = {"rdma"};
  return o;
}

std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

void WriteLine(int fd, const std::string& line) {
  std::string l = line + "\n";
  ASSERT_EQ(write(fd, l.data(), l.size()), static_cast<ssize_t>(l.size()));
}

// The child: fd 3 reads the owner's lines, fd 4 answers.
TEST(RdmaWithdrawTest, WriterRole) {
  if (!getenv(kRoleEnv)) GTEST_SKIP() << "run by WithdrawnMemoryRefusesALateWriteFromAnotherProcess";
  auto e = TransferEngine::Create(Options());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> buf(kSlow, 0xab);
  ASSERT_TRUE((*e)->RegisterMemory(buf.data(), buf.size()).ok());
  std::string owner = ReadLine(3);
  uint64_t target = std::stoull(ReadLine(3));
  auto h = (*e)->OpenSegment(owner);  // fetches (and caches) the descriptor listing the buffer
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  WriteLine(4, (*e)->segment_name());
  WriteLine(4, std::to_string(reinterpret_cast<uint64_t>(buf.data())));
  ASSERT_EQ(ReadLine(3), "go");
  Status st = (*e)->TransferSync({{OpCode::kWrite, buf.data(), *h, target, 65536}}, std::chrono::seconds(10));
  WriteLine(4, std::to_string(static_cast<int>(st.code())) + " " + st.message());
  EXPECT_EQ(ReadLine(3), "bye");  // the owner's transfer into our buffer is done
}

TEST(RdmaWithdrawTest, WithdrawnMemoryRefusesALateWriteFromAnotherProcess) {
  if (getenv(kRoleEnv)) GTEST_SKIP() << "the writer runs only its role";
  auto owner = TransferEngine::Create(Options());
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  std::vector<uint8_t> mem(kSlow, 0);
  ASSERT_TRUE((*owner)->RegisterMemory(mem.data(), mem.size()).ok());

  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 3);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 4);
  std::string filter = "--gtest_filter=RdmaWithdrawTest.WriterRole";
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, filter.data(), nullptr};
  // The child's environment: ours plus the role, minus gtest's output files (this process writes those).
  std::vector<std::string> env_text = {std::string(kRoleEnv) + "=writer"};
  for (char** e = environ; *e; ++e) {
    std::string v = *e;
    if (v.rfind("XML_OUTPUT_FILE=", 0) == 0 || v.rfind("TEST_PREMATURE_EXIT_FILE=", 0) == 0 ||
        v.rfind("GTEST_OUTPUT=", 0) == 0 || v.rfind(std::string(kRoleEnv) + "=", 0) == 0) {
      continue;
    }
    env_text.push_back(v);
  }
  std::vector<char*> env;
  for (auto& v : env_text) env.push_back(v.data());
  env.push_back(nullptr);
  pid_t child = 0;
  int rc = posix_spawn(&child, "/proc/self/exe", &actions, nullptr, argv, env.data());
  posix_spawn_file_actions_destroy(&actions);
  ASSERT_EQ(rc, 0);
  close(to_child[0]);
  close(from_child[1]);
  WriteLine(to_child[1], (*owner)->segment_name());
  WriteLine(to_child[1], std::to_string(reinterpret_cast<uint64_t>(mem.data())));
  std::string writer = ReadLine(from_child[0]);
  uint64_t writer_buf = std::stoull(ReadLine(from_child[0]));

  // Our own slow transfer from the buffer keeps it pinned: the unregistration withdraws it, then drains.
  auto h = (*owner)->OpenSegment(writer);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto batch = (*owner)->AllocateBatch(1);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE((*owner)->Submit(*batch, {{OpCode::kWrite, mem.data(), *h, writer_buf, kSlow}}).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  Status unregistered;
  std::chrono::steady_clock::duration drained{};
  std::thread unregister([&] {
    unregistered = (*owner)->UnregisterMemory(mem.data());
    drained = std::chrono::steady_clock::now() - start;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // withdrawn, still draining
  WriteLine(to_child[1], "go");
  std::string result = ReadLine(from_child[0]);
  const auto answered = std::chrono::steady_clock::now() - start;
  unregister.join();
  EXPECT_TRUE(unregistered.ok()) << unregistered.ToString();
  EXPECT_LT(answered, drained) << "the late write came after the drain (the test's timing failed)";
  EXPECT_NE(result.rfind("0 ", 0), 0u) << "the late write succeeded: " << result;
  bool untouched = true;
  for (size_t i = 0; i < 65536; ++i) untouched = untouched && mem[i] == 0;
  EXPECT_TRUE(untouched) << "a late write landed in withdrawn memory";
  // Our own transfer finished on its local keys.
  auto done = (*owner)->WaitBatch(*batch, std::chrono::seconds(20));
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE((*owner)->GetTaskError(*batch, 0).ok()) << (*owner)->GetTaskError(*batch, 0).ToString();
  WriteLine(to_child[1], "bye");
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the writer failed: " << status;
  close(to_child[1]);
  close(from_child[0]);
}

}  // namespace
}  // namespace mooncake::te::rdma
