// Runs with MC_PLATFORM_EMULATION=1 (BUILD env): the registered host emulation is enabled from the start.
#include <gtest/gtest.h>

#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"

namespace mooncake::te {
namespace {

TEST(HostEmulationEnvTest, EnabledByEnvironment) {
  ASSERT_TRUE(HostEmulationRequestedByEnv());
  auto& reg = PlatformRegistry::Get();
  auto p = reg.ForType(MemoryType::kCuda);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name(), "host_emulation");
  EXPECT_EQ(p->Probe().device_count, 2);
  auto dev = p->Allocate(100, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(reg.Classify(*dev).ToString(), "cuda:0");
  EXPECT_TRUE(p->Free(*dev, 100, AllocationKind::kDevice).ok());
}

}  // namespace
}  // namespace mooncake::te
