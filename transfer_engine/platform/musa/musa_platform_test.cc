// What can be checked without the vendor runtime: the exact reason, the registration, and that every call
// fails cleanly. (GpuPlatform's logic is tested on a fake runtime in //transfer_engine/platform/gpu.)
#include "transfer_engine/platform/musa/musa_platform.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace mooncake::te {
namespace {

TEST(MusaPlatformTest, WithoutTheRuntimeSaysExactlyWhy) {
  auto p = MakeMusaPlatform();
  EXPECT_EQ(p->name(), "musa");
  EXPECT_EQ(p->device_type(), MemoryType::kMusa);
  PlatformProbe probe = p->Probe();
  if (dlopen("libmusa.so.1", RTLD_NOW | RTLD_LOCAL) != nullptr) {
    GTEST_SKIP() << "libmusa.so.1 is installed: " << probe.reason;
  }
  EXPECT_FALSE(probe.usable);
  EXPECT_EQ(probe.reason,
            "libmusa.so.*: not found (libmusa.so.1: cannot open shared object file: No such file or directory)");
  int x = 0;
  EXPECT_FALSE(p->Classify(&x).has_value());
  auto a = p->Allocate(4096, AllocationKind::kDevice, 0);
  EXPECT_EQ(a.status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_NE(a.status().message().find("libmusa.so.*: not found"), std::string::npos) << a.status().ToString();
  EXPECT_EQ(p->Free(&x, 4, AllocationKind::kDevice).code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->ExportIpc(&x, 4).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->ImportIpc("x", getpid(), 4).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->CloseIpc(&x, 4).code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->CopyAsync(&x, &x, 4, 0).status().code(), ErrorCode::kDeviceNotFound);
}

TEST(MusaPlatformTest, ALibraryWithoutTheEntryPointsIsNamed) {
  auto p = MakeMusaPlatform({"libmc-no-such-library.so", "libm.so.6"});
  PlatformProbe probe = p->Probe();
  EXPECT_FALSE(probe.usable);
  EXPECT_EQ(probe.reason, "libm.so.6 has no muInit");
}

TEST(MusaPlatformTest, IsRegisteredWhenLinkedIn) {
  auto p = PlatformRegistry::Get().Find("musa");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->device_type(), MemoryType::kMusa);
  if (!p->Probe().usable) {
    EXPECT_EQ(PlatformRegistry::Get().ForType(MemoryType::kMusa), nullptr);
  }
}

}  // namespace
}  // namespace mooncake::te
