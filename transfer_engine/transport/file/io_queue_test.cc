#include "transfer_engine/transport/file/io_queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "transfer_engine/transport/file/testing/scratch.h"

namespace mooncake::te::file {
namespace {

using testing::Pattern;
using testing::ScratchDir;

// Runs `ios` on a private queue and returns each outcome.
std::vector<Status> RunAll(std::vector<FileIo> ios, unsigned depth = 8) {
  IoQueue q(depth);
  EXPECT_TRUE(q.Init().ok());
  std::vector<Status> out(ios.size(), Status(ErrorCode::kTimeout, "not completed"));
  std::vector<int> calls(ios.size(), 0);
  for (size_t i = 0; i < ios.size(); ++i) {
    ios[i].done = [&out, &calls, i](const Status& st) {
      out[i] = st;
      ++calls[i];
    };
  }
  q.Enqueue(std::move(ios));
  q.DriveUntilIdle();
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i], 1) << "io " << i << " completed " << calls[i] << " times";
  }
  return out;
}

// An aligned allocation, `skew` bytes past a 4 KiB boundary.
struct Buffer {
  explicit Buffer(size_t n, size_t skew = 0) : skew(skew) {
    EXPECT_EQ(posix_memalign(&base, 4096, n + skew + 4096), 0);
    data = static_cast<char*>(base) + skew;
  }
  ~Buffer() { free(base); }
  void* base = nullptr;
  char* data = nullptr;
  size_t skew;
};

class IoQueueTest : public ::testing::TestWithParam<std::string> {};

TEST_P(IoQueueTest, AlignedAndUnalignedRangesRoundTrip) {
  ScratchDir dir(GetParam());
  const size_t kSize = 1 << 20;
  auto original = Pattern(kSize, 1);
  std::string path = dir.WriteFile("f", original);
  auto f = OpenFile::Open(path, /*direct=*/true);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE((*f)->direct()) << "O_DIRECT not taken on " << GetParam();
  if (GetParam() == "/tmp") {
    // ext4 enforces the alignment: a misaligned direct read fails, so the split below is what makes it work.
    EXPECT_GE((*f)->alignment().offset, 512u);
    Buffer b(8192);
    errno = 0;
    EXPECT_LT(pread((*f)->direct_fd(), b.data, 1000, 513), 0);
    EXPECT_EQ(errno, EINVAL) << "ext4 accepted a misaligned O_DIRECT read";
  }
  struct Case {
    uint64_t offset;
    size_t length;
    size_t skew;
  };
  const Case cases[] = {{0, 4096, 0},     {513, 1000, 1},     {4095, 8194, 3},   {8192, 65536, 0},
                        {1, 1, 0},        {100, 300000, 7},   {4096, 4096, 512}, {12288, 100, 0},
                        {65536, 131072, 5}, {kSize - 10, 10, 0}};
  uint64_t seed = 10;
  std::vector<uint8_t> expect = original;
  for (const auto& c : cases) {
    Buffer b(c.length, c.skew);
    FileIo rd{*f, false, b.data, c.offset, c.length, nullptr};
    auto st = RunAll({rd});
    ASSERT_TRUE(st[0].ok()) << c.offset << "+" << c.length << ": " << st[0].ToString();
    ASSERT_EQ(memcmp(b.data, expect.data() + c.offset, c.length), 0) << "read " << c.offset << "+" << c.length;
    auto fresh = Pattern(c.length, ++seed);
    memcpy(b.data, fresh.data(), c.length);
    FileIo wr{*f, true, b.data, c.offset, c.length, nullptr};
    st = RunAll({wr});
    ASSERT_TRUE(st[0].ok()) << c.offset << "+" << c.length << ": " << st[0].ToString();
    memcpy(expect.data() + c.offset, fresh.data(), c.length);
  }
  EXPECT_EQ(ScratchDir::ReadFile(path), expect) << "the file does not hold what was written";
}

TEST_P(IoQueueTest, OnlyUnalignedRequestsAreSplitOrBounced) {
  ScratchDir dir(GetParam());
  std::string path = dir.WriteFile("f", Pattern(1 << 20, 2));
  auto f = OpenFile::Open(path, true);
  ASSERT_TRUE(f.ok());
  IoQueue q(4);
  ASSERT_TRUE(q.Init().ok());
  Buffer b(1 << 20, 0);
  int done = 0;
  q.Enqueue({FileIo{*f, false, b.data, 0, 1 << 20, [&](const Status& st) { EXPECT_TRUE(st.ok()); ++done; }}});
  q.DriveUntilIdle();
  EXPECT_EQ(q.counters().direct_pieces.load(), 1u);
  EXPECT_EQ(q.counters().bounced_pieces.load() + q.counters().buffered_pieces.load(), 0u);
  Buffer m(8192, 1);  // misaligned memory, aligned file range: one bounced piece
  q.Enqueue({FileIo{*f, false, m.data, 4096, 8192, [&](const Status& st) { EXPECT_TRUE(st.ok()); ++done; }}});
  q.DriveUntilIdle();
  EXPECT_EQ(q.counters().bounced_pieces.load(), 1u);
  // Unaligned offset and length: two partial edge blocks (buffered) and the whole blocks between (direct).
  q.Enqueue({FileIo{*f, false, b.data, 100, 3 * 4096, [&](const Status& st) { EXPECT_TRUE(st.ok()); ++done; }}});
  q.DriveUntilIdle();
  EXPECT_EQ(q.counters().buffered_pieces.load(), 2u);
  EXPECT_EQ(done, 3);
}

TEST_P(IoQueueTest, ReadPastTheEndOfTheFileIsAShortReadError) {
  ScratchDir dir(GetParam());
  std::string path = dir.WriteFile("f", Pattern(10000, 3));
  auto f = OpenFile::Open(path, true);
  ASSERT_TRUE(f.ok());
  Buffer b(8192);
  for (uint64_t off : {uint64_t{8192}, uint64_t{9000}, uint64_t{10000}}) {
    auto st = RunAll({FileIo{*f, false, b.data, off, 4096, nullptr}});
    EXPECT_EQ(st[0].code(), ErrorCode::kRemoteRejected) << off << ": " << st[0].ToString();
    EXPECT_NE(st[0].message().find("short read"), std::string::npos) << st[0].message();
    EXPECT_NE(st[0].message().find("10000 bytes"), std::string::npos) << "names the file's size: " << st[0].message();
  }
  // Up to the end exactly is fine.
  auto ok = RunAll({FileIo{*f, false, b.data, 8192, 10000 - 8192, nullptr}});
  EXPECT_TRUE(ok[0].ok()) << ok[0].ToString();
}

TEST_P(IoQueueTest, RemovedOrTruncatedFileFailsClearly) {
  ScratchDir dir(GetParam());
  std::string path = dir.WriteFile("f", Pattern(1 << 20, 4));
  auto f = OpenFile::Open(path, true);
  ASSERT_TRUE(f.ok());
  Buffer b(65536);
  ASSERT_EQ(truncate(path.c_str(), 4096), 0);
  auto st = RunAll({FileIo{*f, false, b.data, 0, 65536, nullptr}});
  EXPECT_EQ(st[0].code(), ErrorCode::kRemoteRejected) << st[0].ToString();
  st = RunAll({FileIo{*f, true, b.data, 0, 65536, nullptr}});  // the write itself works: the check after it fails
  EXPECT_TRUE(st[0].ok()) << "a write extends a truncated file: " << st[0].ToString();
  EXPECT_EQ((*f)->Check(1 << 20).code(), ErrorCode::kRemoteRejected);
  ASSERT_EQ(unlink(path.c_str()), 0);
  st = RunAll({FileIo{*f, true, b.data, 0, 4096, nullptr}});
  EXPECT_EQ(st[0].code(), ErrorCode::kRemoteRejected) << st[0].ToString();
  EXPECT_NE(st[0].message().find("removed"), std::string::npos) << st[0].message();
  EXPECT_EQ(OpenFile::Open(path, true).status().code(), ErrorCode::kNotFound);
}

TEST_P(IoQueueTest, ManyInFlightOnAWorkerThread) {
  ScratchDir dir(GetParam());
  const size_t kSize = 8 << 20;
  auto original = Pattern(kSize, 5);
  std::string path = dir.WriteFile("f", original);
  auto f = OpenFile::Open(path, true);
  ASSERT_TRUE(f.ok());
  IoQueue q(32);
  ASSERT_TRUE(q.Init().ok());
  std::thread worker([&] { q.Run(); });
  constexpr int kIos = 512;
  Buffer b(kIos * 4096);
  std::mt19937 rng(1);
  std::vector<uint64_t> offs(kIos);
  std::atomic<int> done{0}, failed{0};
  std::vector<FileIo> ios;
  for (int i = 0; i < kIos; ++i) {
    offs[i] = (rng() % (kSize / 4096)) * 4096 + (i % 3 == 0 ? 17 : 0);  // a third unaligned
    if (offs[i] + 4096 > kSize) offs[i] -= 4096;
    ios.push_back(FileIo{*f, false, b.data + i * 4096, offs[i], 4096, [&](const Status& st) {
                           if (!st.ok()) ++failed;
                           ++done;
                         }});
  }
  q.Enqueue(std::move(ios));
  for (int i = 0; i < 2000 && done.load() < kIos; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  q.Stop();
  worker.join();
  ASSERT_EQ(done.load(), kIos);
  EXPECT_EQ(failed.load(), 0);
  for (int i = 0; i < kIos; ++i) {
    ASSERT_EQ(memcmp(b.data + i * 4096, original.data() + offs[i], 4096), 0) << "io " << i;
  }
}

TEST_P(IoQueueTest, WritesSharingABlockKeepEachOthersBytes) {
  ScratchDir dir(GetParam());
  std::string path = dir.WriteFile("f", std::vector<uint8_t>(64 << 10, 0));
  auto f = OpenFile::Open(path, true);
  ASSERT_TRUE(f.ok());
  auto fresh = Pattern(64 << 10, 6);
  std::vector<FileIo> ios;
  for (size_t off = 0; off < fresh.size(); off += 300) {  // 300-byte pieces: most blocks are shared by two writes
    size_t len = std::min<size_t>(300, fresh.size() - off);
    ios.push_back(FileIo{*f, true, reinterpret_cast<char*>(fresh.data()) + off, off, len, nullptr});
  }
  auto st = RunAll(std::move(ios), 32);
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ScratchDir::ReadFile(path), fresh);
}

TEST_P(IoQueueTest, StoppedQueueFailsNewTransfers) {
  ScratchDir dir(GetParam());
  std::string path = dir.WriteFile("f", Pattern(8192, 7));
  auto f = OpenFile::Open(path, true);
  ASSERT_TRUE(f.ok());
  IoQueue q(4);
  ASSERT_TRUE(q.Init().ok());
  q.Stop();
  Buffer b(4096);
  Status got = Status::Ok();
  int calls = 0;
  q.Enqueue({FileIo{*f, false, b.data, 0, 4096, [&](const Status& st) {
                      got = st;
                      ++calls;
                    }}});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(got.ok());
}

INSTANTIATE_TEST_SUITE_P(FileSystems, IoQueueTest, ::testing::ValuesIn(testing::TestRoots()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param == "/tmp" ? std::string("ext4_tmp") : std::string("tmpfs_dev_shm");
                         });

}  // namespace
}  // namespace mooncake::te::file
