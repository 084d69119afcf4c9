#include "transfer_engine/common/shm_names.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace mooncake::te {
namespace {

class ShmNamesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mc-shm-names-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Touch(const std::string& name) {
    int fd = open((dir_ + "/" + name).c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  bool Exists(const std::string& name) {
    struct stat st;
    return stat((dir_ + "/" + name).c_str(), &st) == 0;
  }
  std::string dir_;
};

// A pid that existed and is gone now: a child that exited and was reaped.
pid_t DeadPid() {
  pid_t p = fork();
  if (p == 0) _exit(0);
  waitpid(p, nullptr, 0);
  return p;
}

std::string Ns() {
  std::string tag = ShmOwnerTag();
  return tag.substr(0, tag.find('-'));
}

TEST_F(ShmNamesTest, RemovesOnlyFilesOfGoneProcessesOfThisPidNamespace) {
  const std::string dead = std::to_string(DeadPid());
  Touch("mc-x-" + Ns() + "-" + dead + "-0123abcd:0:0");                       // stale: removed
  Touch("mc-x-" + ShmOwnerTag() + "-feed");                                   // this process: kept
  Touch("mc-x-1-" + dead + "-beef");                                          // another PID namespace: kept
  Touch("mc-x-" + dead + "-08554639d3cf8d68:0:0");                            // old format, no namespace: kept
  Touch("other-" + Ns() + "-" + dead + "-1");                                 // another prefix: kept
  EXPECT_EQ(RemoveStaleShmFiles("mc-x-", dir_), 1);
  EXPECT_FALSE(Exists("mc-x-" + Ns() + "-" + dead + "-0123abcd:0:0"));
  EXPECT_TRUE(Exists("mc-x-" + ShmOwnerTag() + "-feed"));
  EXPECT_TRUE(Exists("mc-x-1-" + dead + "-beef"));
  EXPECT_TRUE(Exists("mc-x-" + dead + "-08554639d3cf8d68:0:0"));
  EXPECT_TRUE(Exists("other-" + Ns() + "-" + dead + "-1"));
}

TEST_F(ShmNamesTest, MalformedNamesAreLeftAlone) {
  for (const char* name : {"mc-x-", "mc-x--1-2", "mc-x-12", "mc-x-12-", "mc-x-99999999999999999999999-1-a",
                           "mc-x-abc-1-2"}) {
    Touch(name);
  }
  EXPECT_EQ(RemoveStaleShmFiles("mc-x-", dir_), 0);
  EXPECT_EQ(RemoveStaleShmFiles("mc-x-", dir_ + "/missing"), 0);
}

}  // namespace
}  // namespace mooncake::te
