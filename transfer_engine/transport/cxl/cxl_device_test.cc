#include "transfer_engine/transport/cxl/cxl_device.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "transfer_engine/transport/cxl/cxl_cache.h"

namespace mooncake::te::cxl {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// A file standing in for a device, removed with the fixture.
class DeviceFile {
 public:
  explicit DeviceFile(uint64_t size, const char* dir = "/dev/shm") {
    path_ = std::string(dir) + "/mc-cxl-device-test-XXXXXX";
    int fd = mkstemp(path_.data());
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    close(fd);
  }
  ~DeviceFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(CxlDevice, TwoMappingsOfOneFileAreOneDevice) {
  DeviceFile f(16 * kMiB);
  auto a = CxlDevice::Open(f.path(), 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = CxlDevice::Open(f.path(), 16 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*a)->identity().uuid, (*b)->identity().uuid);
  EXPECT_EQ((*a)->identity().uuid.size(), 32u);
  EXPECT_EQ((*a)->identity().ino, (*b)->identity().ino);
  EXPECT_NE((*a)->base(), (*b)->base());
  CopyToDevice((*a)->base() + 4 * kMiB, "shared!", 8, true);
  char out[8];
  CopyFromDevice(out, (*b)->base() + 4 * kMiB, 8, true);
  EXPECT_STREQ(out, "shared!");
}

TEST(CxlDevice, AnotherFileIsAnotherDevice) {
  DeviceFile f(8 * kMiB), g(8 * kMiB);
  auto a = CxlDevice::Open(f.path(), 0);
  auto b = CxlDevice::Open(g.path(), 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->identity().uuid, (*b)->identity().uuid);
}

TEST(CxlDevice, BadSizesAndPathsAreClearErrors) {
  DeviceFile f(8 * kMiB);
  EXPECT_EQ(CxlDevice::Open(f.path(), 3 * kMiB).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(CxlDevice::Open(f.path(), 2 * kMiB).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(CxlDevice::Open("/nonexistent/dax9.9", 8 * kMiB).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(CxlDevice::Open("", 8 * kMiB).status().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(CxlDevice::Open(f.path(), 8 * kMiB).ok());
  auto other = CxlDevice::Open(f.path(), 4 * kMiB);  // formatted for 8 MiB: every engine must agree
  EXPECT_EQ(other.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("formatted for"), std::string::npos) << other.status().message();
}

TEST(CxlDevice, AllocationsDoNotOverlapAndAreReused) {
  DeviceFile f(16 * kMiB);
  auto d = CxlDevice::Open(f.path(), 0);
  ASSERT_TRUE(d.ok());
  auto x = (*d)->Allocate(1, "x");
  auto y = (*d)->Allocate(3 * kMiB, "y");
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->offset, CxlDevice::kReservedBytes);
  EXPECT_EQ(x->length, 2 * kMiB);
  EXPECT_EQ(y->offset, x->offset + x->length);
  EXPECT_EQ(y->length, 4 * kMiB);
  EXPECT_EQ((*d)->Allocate(10 * kMiB, "too big").status().code(), ErrorCode::kMemory);
  EXPECT_EQ((*d)->Allocate(0, "zero").status().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE((*d)->Free(x->offset).ok());
  EXPECT_EQ((*d)->Free(x->offset).code(), ErrorCode::kInvalidArgument);  // freed once
  auto z = (*d)->Allocate(2 * kMiB, "z");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->offset, x->offset);  // first fit
  auto all = (*d)->Allocations();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].tag, "z");
  EXPECT_EQ(all[1].tag, "y");
  EXPECT_FALSE((*d)->OverlapsForeign(y->offset, 1, nullptr));  // our own
}

// A child process allocates and then dies: its range stays out of reach while it lives, and is reclaimed only
// once it is provably gone; the parent's own range is never touched.
TEST(CxlDevice, ADeadOwnersRangeIsReclaimedOthersStay) {
  DeviceFile f(16 * kMiB);
  auto d = CxlDevice::Open(f.path(), 0);
  ASSERT_TRUE(d.ok());
  auto mine = (*d)->Allocate(2 * kMiB, "parent");
  ASSERT_TRUE(mine.ok());
  memset((*d)->base() + mine->offset, 0x5a, 2 * kMiB);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    auto c = CxlDevice::Open(f.path(), 0);
    if (!c.ok()) _exit(1);
    auto a = (*c)->Allocate(4 * kMiB, "child");
    char ok = a.ok() && a->offset == mine->offset + mine->length ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  EXPECT_EQ(ok, 'y');
  Allocation found;
  EXPECT_TRUE((*d)->OverlapsForeign(mine->offset + mine->length + kMiB, 1, &found));
  EXPECT_EQ(found.tag, "child");
  EXPECT_EQ((*d)->Allocate(4 * kMiB, "next")->offset, mine->offset + 6 * kMiB);  // skips the live child's
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE((*d)->OverlapsForeign(mine->offset + mine->length + kMiB, 1, nullptr));
  auto again = (*d)->Allocate(4 * kMiB, "after");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->offset, mine->offset + mine->length);  // the dead child's range, reclaimed
  for (uint64_t i = 0; i < 2 * kMiB; ++i) {
    ASSERT_EQ(static_cast<unsigned char>((*d)->base()[mine->offset + i]), 0x5a) << i;
  }
  close(ready[0]);
}

TEST(CxlDevice, SlotsCarryLivenessAndEpoch) {
  DeviceFile f(8 * kMiB);
  auto a = CxlDevice::Open(f.path(), 0);
  auto b = CxlDevice::Open(f.path(), 0);
  ASSERT_TRUE(a.ok() && b.ok());
  auto s1 = (*a)->ClaimSlot("engine-one");
  auto s2 = (*a)->ClaimSlot("engine-two");
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_NE(*s1, *s2);
  auto seen = (*b)->ReadSlot(*s1);
  EXPECT_TRUE(seen.live);
  EXPECT_EQ(seen.instance, "engine-one");
  EXPECT_EQ(seen.epoch, 0u);
  EXPECT_EQ((*a)->AdvanceEpoch(*s1), 1u);
  EXPECT_EQ((*b)->ReadSlot(*s1).epoch, 1u);
  (*a)->ReleaseSlot(*s1);
  EXPECT_FALSE((*b)->ReadSlot(*s1).live);
  EXPECT_FALSE((*b)->ReadSlot(-1).live);
  EXPECT_FALSE((*b)->ReadSlot(CxlDevice::kMaxEngines).live);
}

TEST(CxlCache, FlushesRunOnAnyAlignment) {
  std::string kind = FlushKindName(CpuFlushKind());
  EXPECT_FALSE(kind.empty());
  std::vector<char> buf(1 << 16, 1), out(1 << 16);
  for (size_t off : {0, 1, 63, 64, 65}) {
    CopyToDevice(buf.data() + off, out.data(), 1000, true);
    CopyFromDevice(out.data(), buf.data() + off, 1000, true);
  }
  WriteBack(buf.data(), 0);
  Invalidate(buf.data(), 0);
}

}  // namespace
}  // namespace mooncake::te::cxl
