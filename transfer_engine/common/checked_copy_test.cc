// CheckedCopy on real mappings: ordinary, read-only, PROT_NONE and unmapped pages; errors instead of faults.
#include "transfer_engine/common/checked_copy.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace mooncake::te {
namespace {

// Parameter: whether the pipe fallback is used (a sandbox that refuses process_vm_writev).
class CheckedCopyTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    checked_copy_internal::ForcePipeCopy(GetParam());
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    // Four pages: read-write, read-only, PROT_NONE, unmapped.
    base_ = static_cast<char*>(mmap(nullptr, 4 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(base_, MAP_FAILED);
    memset(base_, 0x11, 2 * page_);
    ASSERT_EQ(mprotect(base_ + page_, page_, PROT_READ), 0);
    ASSERT_EQ(mprotect(base_ + 2 * page_, page_, PROT_NONE), 0);
    ASSERT_EQ(munmap(base_ + 3 * page_, page_), 0);
  }
  void TearDown() override {
    munmap(base_, 3 * page_);
    checked_copy_internal::ForcePipeCopy(false);
  }

  char* rw() { return base_; }
  char* ro() { return base_ + page_; }
  char* none() { return base_ + 2 * page_; }
  char* unmapped() { return base_ + 3 * page_; }

  size_t page_ = 0;
  char* base_ = nullptr;
};

TEST_P(CheckedCopyTest, CopiesBetweenAnyReadableAndWritableMemory) {
  std::vector<char> heap(3 * page_ + 7);
  std::iota(heap.begin(), heap.end(), 0);
  ASSERT_TRUE(CheckedCopy(rw() + 3, heap.data(), page_ - 3).ok());
  EXPECT_EQ(memcmp(rw() + 3, heap.data(), page_ - 3), 0);
  std::vector<char> out(page_);
  ASSERT_TRUE(CheckedCopy(out.data(), ro(), page_).ok());  // reading read-only memory is fine
  EXPECT_EQ(out[0], 0x11);
  EXPECT_TRUE(CheckedCopy(nullptr, nullptr, 0).ok());
  std::vector<char> big(8 << 20, 'x'), dst(8 << 20);
  ASSERT_TRUE(CheckedCopy(dst.data(), big.data(), big.size()).ok());
  EXPECT_EQ(dst, big);
}

TEST_P(CheckedCopyTest, BadRangesAreErrorsNotFaults) {
  std::vector<char> buf(2 * page_, 'a');
  Status st = CheckedCopy(ro(), buf.data(), 16);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not writable"), std::string::npos) << st.message();
  EXPECT_EQ(ro()[0], 0x11);
  st = CheckedCopy(buf.data(), none(), 16);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not readable"), std::string::npos) << st.message();
  st = CheckedCopy(none(), buf.data(), 16);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  st = CheckedCopy(unmapped(), buf.data(), 16);
  EXPECT_NE(st.message().find("not mapped"), std::string::npos) << st.message();
  st = CheckedCopy(buf.data(), unmapped(), 16);
  EXPECT_NE(st.message().find("not mapped"), std::string::npos) << st.message();
  EXPECT_FALSE(CheckedCopy(buf.data(), reinterpret_cast<void*>(16), 16).ok());
  EXPECT_FALSE(CheckedCopy(buf.data(), reinterpret_cast<void*>(~uintptr_t{0} - 8), 64).ok());  // wraps
  // A destination running off the end of its mapping into an unmapped page: nothing is written.
  std::vector<char> before(rw(), rw() + page_), src(4 * page_, 'b');
  EXPECT_FALSE(CheckedCopy(rw(), src.data(), 4 * page_).ok());
  EXPECT_EQ(std::vector<char>(rw(), rw() + page_), before);
  // Read-write into read-only: the error says how much of the writable prefix was written.
  st = CheckedCopy(rw() + page_ - 8, buf.data(), 16);
  EXPECT_NE(st.message().find("8 bytes were copied"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(Paths, CheckedCopyTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Pipe" : "CrossMemory"; });

}  // namespace
}  // namespace mooncake::te
