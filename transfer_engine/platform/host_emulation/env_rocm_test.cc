// Runs with MC_PLATFORM_EMULATION=1 and MC_PLATFORM_EMULATION_DEVICE=rocm (BUILD env): the registered host
// emulation presents ROCm devices, and no CUDA platform is usable.
#include <gtest/gtest.h>

#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"

namespace mooncake::te {
namespace {

TEST(HostEmulationEnvTest, PresentsRocmDevicesWhenAsked) {
  auto& reg = PlatformRegistry::Get();
  auto p = reg.ForType(MemoryType::kRocm);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name(), "host_emulation");
  EXPECT_EQ(reg.ForType(MemoryType::kCuda), nullptr);
  auto dev = p->Allocate(100, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(reg.Classify(*dev).ToString(), "rocm:1");
  EXPECT_TRUE(p->Free(*dev, 100, AllocationKind::kDevice).ok());
}

}  // namespace
}  // namespace mooncake::te
