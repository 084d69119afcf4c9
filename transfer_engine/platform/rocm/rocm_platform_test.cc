// What can be checked without the vendor runtime: the exact reason, the registration, and that every call
// fails cleanly. (GpuPlatform's logic is tested on a fake runtime in //transfer_engine/platform/gpu.)
#include "transfer_engine/platform/rocm/rocm_platform.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace mooncake::te {
namespace {

TEST(RocmPlatformTest, WithoutTheRuntimeSaysExactlyWhy) {
  auto p = MakeRocmPlatform();
  EXPECT_EQ(p->name(), "rocm");
  EXPECT_EQ(p->device_type(), MemoryType::kRocm);
  PlatformProbe probe = p->Probe();
  if (dlopen("libamdhip64.so.7", RTLD_NOW | RTLD_LOCAL) != nullptr) {
    GTEST_SKIP() << "libamdhip64.so.7 is installed: " << probe.reason;
  }
  EXPECT_FALSE(probe.usable);
  EXPECT_EQ(probe.reason,
            "libamdhip64.so.*: not found (libamdhip64.so.7: cannot open shared object file: "
            "No such file or directory)");
  int x = 0;
  EXPECT_FALSE(p->Classify(&x).has_value());
  auto a = p->Allocate(4096, AllocationKind::kDevice, 0);
  EXPECT_EQ(a.status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_NE(a.status().message().find("libamdhip64.so.*: not found"), std::string::npos) << a.status().ToString();
  EXPECT_EQ(p->Free(&x, 4, AllocationKind::kDevice).code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->ExportIpc(&x, 4).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->ImportIpc("x", getpid(), 4).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->CloseIpc(&x, 4).code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->CopyAsync(&x, &x, 4, 0).status().code(), ErrorCode::kDeviceNotFound);
  auto dmabuf = p->ExportDmabuf(&x, 4);
  EXPECT_EQ(dmabuf.status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_NE(dmabuf.status().message().find("libamdhip64.so.*: not found"), std::string::npos)
      << dmabuf.status().ToString();
}

TEST(RocmPlatformTest, ALibraryWithoutTheEntryPointsIsNamed) {
  auto p = MakeRocmPlatform({"libmc-no-such-library.so", "libm.so.6"});
  PlatformProbe probe = p->Probe();
  EXPECT_FALSE(probe.usable);
  EXPECT_EQ(probe.reason, "libm.so.6 has no hipInit");
}

TEST(RocmPlatformTest, IsRegisteredWhenLinkedIn) {
  auto p = PlatformRegistry::Get().Find("rocm");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->device_type(), MemoryType::kRocm);
  if (!p->Probe().usable) {
    EXPECT_EQ(PlatformRegistry::Get().ForType(MemoryType::kRocm), nullptr);
  }
}

}  // namespace
}  // namespace mooncake::te
