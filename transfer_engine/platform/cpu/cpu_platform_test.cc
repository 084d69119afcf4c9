#include "transfer_engine/platform/cpu/cpu_platform.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace mooncake::te {
namespace {

TEST(CpuPlatformTest, ProbeAndClassify) {
  auto cpu = MakeCpuPlatform();
  EXPECT_EQ(cpu->name(), "cpu");
  EXPECT_EQ(cpu->device_type(), MemoryType::kHost);
  EXPECT_TRUE(cpu->Probe().usable);
  int x = 0;
  EXPECT_FALSE(cpu->Classify(&x).has_value());
}

TEST(CpuPlatformTest, PinnedHostAllocateFree) {
  auto cpu = MakeCpuPlatform();
  auto p = cpu->Allocate(10000, AllocationKind::kPinnedHost, -1);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)), 0u);
  memset(*p, 0x5a, 10000);
  EXPECT_EQ(static_cast<unsigned char*>(*p)[9999], 0x5a);
  // The cpu platform never claims memory, even its own: host is the registry's default.
  EXPECT_FALSE(cpu->Classify(*p).has_value());

  Status wrong_len = cpu->Free(*p, 4096, AllocationKind::kPinnedHost);
  EXPECT_EQ(wrong_len.code(), ErrorCode::kInvalidArgument) << wrong_len.ToString();
  EXPECT_TRUE(cpu->Free(*p, 10000, AllocationKind::kPinnedHost).ok());
  Status twice = cpu->Free(*p, 10000, AllocationKind::kPinnedHost);
  EXPECT_EQ(twice.code(), ErrorCode::kInvalidArgument) << twice.ToString();
  int stack = 0;
  EXPECT_EQ(cpu->Free(&stack, sizeof(stack), AllocationKind::kPinnedHost).code(), ErrorCode::kInvalidArgument);
}

TEST(CpuPlatformTest, NoDeviceMemoryNoIpc) {
  auto cpu = MakeCpuPlatform();
  EXPECT_EQ(cpu->Allocate(0, AllocationKind::kPinnedHost, -1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cpu->Allocate(4096, AllocationKind::kDevice, 0).status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(cpu->Allocate(4096, AllocationKind::kShareable, 0).status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(cpu->Allocate(SIZE_MAX, AllocationKind::kPinnedHost, -1).status().code(), ErrorCode::kInvalidArgument);
  char buf[16];
  EXPECT_EQ(cpu->ExportIpc(buf, sizeof(buf)).status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(cpu->ImportIpc("x", getpid(), 16).status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(cpu->CloseIpc(buf, sizeof(buf)).code(), ErrorCode::kNotImplemented);
}

TEST(CpuPlatformTest, CopyAsyncCompletesAtOnce) {
  auto cpu = MakeCpuPlatform();
  char src[64], dst[64] = {};
  for (int i = 0; i < 64; ++i) src[i] = static_cast<char>(i * 3);
  auto c = cpu->CopyAsync(dst, src, sizeof(src), -1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->Done());
  EXPECT_TRUE((*c)->Wait().ok());
  EXPECT_EQ(memcmp(dst, src, sizeof(src)), 0);
  EXPECT_EQ(cpu->CopyAsync(nullptr, src, 8, -1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cpu->CopyAsync(dst, nullptr, 8, -1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(cpu->CopyAsync(nullptr, nullptr, 0, -1).ok());
  char untouched[8] = {};
  int stream = 0;  // the cpu platform has no streams: any non-null handle is refused, nothing is copied
  auto refused = cpu->CopyAsync(untouched, src + 1, sizeof(untouched), -1, &stream);
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("no streams"), std::string::npos) << refused.status().ToString();
  EXPECT_EQ(untouched[7], 0);
  EXPECT_TRUE(cpu->CopyAsync(dst, src, 8, -1, nullptr).ok());
}

}  // namespace
}  // namespace mooncake::te
