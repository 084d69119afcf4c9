// A full disk: before any thread starts, main() enters a private mount namespace (unshare(CLONE_NEWNS), as
// `unshare -m` does) and mounts a 1 MiB tmpfs there, so nothing outside this process sees it and no loop device is
// needed. Without the privilege to do so every test is skipped, saying why.
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/file/file_segment.h"
#include "transfer_engine/transport/file/testing/memory_metadata.h"

namespace mooncake::te::file {
namespace {

std::string g_mount;     // the 1 MiB tmpfs, or empty
std::string g_why_none;  // why there is none

std::vector<uint8_t> Read(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool WriteFile(const std::string& p, size_t n, uint8_t byte) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  std::vector<char> v(n, static_cast<char>(byte));
  out.write(v.data(), static_cast<std::streamsize>(n));
  out.flush();
  return out.good();
}

TEST(FileFullDisk, WriteFailsWithNoSpaceAndNothingWritten) {
  if (g_mount.empty()) GTEST_SKIP() << "no private 1 MiB tmpfs: " << g_why_none;
  const std::string filler = g_mount + "/filler", target = g_mount + "/target";
  ASSERT_TRUE(WriteFile(filler, 768 << 10, 0x11)) << "filling the disk";
  ASSERT_EQ(truncate(target.c_str(), 0) == 0 || errno == ENOENT, true);
  { std::ofstream create(target); }
  ASSERT_EQ(truncate(target.c_str(), 512 << 10), 0) << "a sparse 512 KiB file: its blocks do not fit";

  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "memkv://enospc";
  o.transport_options["file.allowed_dirs"] = "/";  // its own scratch files, wherever they are
  auto engine = TransferEngine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::vector<uint8_t> mem(1 << 20, 0x5a);
  ASSERT_TRUE((*engine)->RegisterMemory(mem.data(), mem.size()).ok());
  auto published = PublishFileSegment(o.metadata_conn, "nvmeof/full", {{target, 0, {}}, {filler, 0, {}}});
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  auto seg = (*engine)->OpenSegment("nvmeof/full");
  ASSERT_TRUE(seg.ok());

  TransferRequest w{OpCode::kWrite, mem.data(), *seg, kFileSegmentBase + 4096, 256 << 10};
  Status st = (*engine)->TransferSync({w}, std::chrono::seconds(20));
  EXPECT_EQ(st.code(), ErrorCode::kMemory) << st.ToString();
  EXPECT_NE(st.message().find("no space"), std::string::npos) << st.message();
  auto after = Read(target);
  EXPECT_EQ(after.size(), size_t{512} << 10) << "the file's size changed";
  EXPECT_EQ(after, std::vector<uint8_t>(512 << 10, 0)) << "a failed write left bytes behind";

  // The filler's blocks are allocated: writing into them still works on the full disk.
  TransferRequest in_filler{OpCode::kWrite, mem.data(), *seg, kFileSegmentBase + (512 << 10) + 8192, 65536};
  st = (*engine)->TransferSync({in_filler}, std::chrono::seconds(20));
  EXPECT_TRUE(st.ok()) << st.ToString();
  auto filler_now = Read(filler);
  ASSERT_EQ(filler_now.size(), size_t{768} << 10);
  EXPECT_EQ(filler_now[8192], 0x5a);
  EXPECT_EQ(filler_now[8191], 0x11);

  // Space freed (the transport still holds the removed filler open, which keeps its blocks, until the segment
  // is forgotten): the same write now succeeds.
  ASSERT_EQ(unlink(filler.c_str()), 0);
  (*engine)->InvalidateSegment("nvmeof/full");
  st = (*engine)->TransferSync({w}, std::chrono::seconds(20));
  EXPECT_TRUE(st.ok()) << st.ToString();
  after = Read(target);
  EXPECT_EQ(after[4096], 0x5a);
  EXPECT_EQ(after[4095], 0);
}

}  // namespace
}  // namespace mooncake::te::file

int main(int argc, char** argv) {
  using mooncake::te::file::g_mount;
  using mooncake::te::file::g_why_none;
  char dir[] = "/tmp/mc_enospc_XXXXXX";
  if (unshare(CLONE_NEWNS) != 0) {
    g_why_none = std::string("unshare(CLONE_NEWNS): ") + strerror(errno);
  } else if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    g_why_none = std::string("making mounts private: ") + strerror(errno);
  } else if (!mkdtemp(dir)) {
    g_why_none = std::string("mkdtemp: ") + strerror(errno);
  } else if (mount("mc_enospc", dir, "tmpfs", 0, "size=1M") != 0) {
    g_why_none = std::string("mount tmpfs size=1M: ") + strerror(errno);
  } else {
    g_mount = dir;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  if (!g_mount.empty()) {
    umount2(dir, MNT_DETACH);
    rmdir(dir);
  }
  return rc;
}
