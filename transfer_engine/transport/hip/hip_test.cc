// hip on the host emulation presenting ROCm devices (MC_PLATFORM_EMULATION=1, MC_PLATFORM_EMULATION_DEVICE=rocm:
// memfd "rocm" memory, not a GPU): its probe with and without the emulation, registration (shm_name, hip_* fields,
// other memory declined), two engines moving device bytes through one mapping, memory the target unregistered
// never written, the inert form and the managed allocator.
#include "transfer_engine/transport/hip/hip_transport.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/device_ipc/handle_hex.h"
#include "transfer_engine/transport/device_ipc/testing/engine_pair.h"

namespace mooncake::te::hip {
namespace {

TEST(HipProbeTest, SaysWhyWithoutARocmRuntime) {
  EXPECT_TRUE(ProbeHip().usable) << ProbeHip().reason;
  const std::string saved = getenv("MC_PLATFORM_EMULATION_DEVICE");
  setenv("MC_PLATFORM_EMULATION_DEVICE", "cuda", 1);  // the emulation, but of CUDA devices: no ROCm here
  TransportProbe p = ProbeHip();
  setenv("MC_PLATFORM_EMULATION_DEVICE", saved.c_str(), 1);
  EXPECT_FALSE(p.usable);
  EXPECT_EQ(p.reason.rfind("no ROCm runtime: ", 0), 0u) << p.reason;
  EXPECT_NE(p.reason.find("libamdhip64"), std::string::npos) << p.reason;
}

TEST(HipTransportTest, ExportsRocmRegionsAndDeclinesOtherMemory) {
  auto rocm = PlatformRegistry::Get().ForType(MemoryType::kRocm);
  ASSERT_NE(rocm, nullptr) << "MC_PLATFORM_EMULATION_DEVICE=rocm should present ROCm devices";
  HipTransport t;
  device_ipc::testing::LocalContext local(&PlatformRegistry::Get());
  ASSERT_TRUE(t.Start(local.ctx).ok());
  auto dev = rocm->Allocate(1 << 20, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok());
  MemoryRegion region = device_ipc::testing::RegionOf(*dev, 1 << 20, MemoryKind{MemoryType::kRocm, 1});
  auto r = t.RegisterRegion(region);
  ASSERT_TRUE(r.ok());
  ASSERT_FALSE(r->declined) << r->why_declined;
  auto handle = device_ipc::HandleFromHex(r->descriptor_fields.value("shm_name", ""));
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  EXPECT_TRUE(r->descriptor_fields.contains("hip_epoch_slot") && r->descriptor_fields.contains("hip_epoch"));
  region.kind = MemoryKind{MemoryType::kCuda, 0};
  auto cuda_kind = t.RegisterRegion(region);
  ASSERT_TRUE(cuda_kind.ok());
  EXPECT_TRUE(cuda_kind->declined);
  EXPECT_NE(cuda_kind->why_declined.find("ROCm"), std::string::npos) << cuda_kind->why_declined;

  nlohmann::json desc = nlohmann::json::object();
  t.Describe(desc);
  EXPECT_EQ(desc["hip_platform"], rocm->name());
  EXPECT_GE(desc.value("hip_epoch_fd", -1), 0);
  SegmentDescriptor peer;
  peer.json = {{"host_id", "this-host"}, {"hip_platform", rocm->name()}};
  EXPECT_TRUE(t.CanReach(peer));
  peer.json["host_id"] = "another-host";
  EXPECT_FALSE(t.CanReach(peer));
  peer.json = {{"host_id", "this-host"}, {"nvlink_intra_platform", rocm->name()}};
  EXPECT_FALSE(t.CanReach(peer)) << "another transport's field";
  t.Stop();
  EXPECT_TRUE(rocm->Free(*dev, 1 << 20, AllocationKind::kDevice).ok());
}

TEST(HipTransportTest, WithoutARocmPlatformItIsInert) {
  HipTransport t;
  device_ipc::testing::LocalContext local(nullptr);  // no platforms at all
  ASSERT_TRUE(t.Start(local.ctx).ok());
  auto r = t.RegisterRegion(
      device_ipc::testing::RegionOf(reinterpret_cast<void*>(0x10000), 4096, MemoryKind{MemoryType::kRocm, 0}));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->declined);
  EXPECT_NE(r->why_declined.find("no usable ROCm platform"), std::string::npos) << r->why_declined;
  EXPECT_EQ(t.AllocateManaged(4096, -1).status().code(), ErrorCode::kDeviceNotFound);
}

class HipEngineTest : public device_ipc::testing::EnginePairTest {
 protected:
  HipEngineTest() : EnginePairTest({"hip", MemoryType::kRocm, AllocationKind::kDevice}) {}
};

TEST_F(HipEngineTest, MovesRocmMemoryThroughOneCachedMapping) { CheckMovesThroughOneMapping(); }

TEST_F(HipEngineTest, MemoryTheTargetUnregisteredIsNeverWritten) { CheckUnregisteredIsNeverWritten(); }

TEST(HipManagedTest, ManagedBuffersAreRocmDeviceMemory) {
  EngineOptions o = device_ipc::testing::LocalEngineOptions("hip");
  auto e = TransferEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto p = (*e)->AllocateManaged(1 << 20);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(PlatformRegistry::Get().Classify(*p).ToString(), "rocm:0");
  EXPECT_TRUE((*e)->FreeManaged(*p, 1 << 20).ok());
}

}  // namespace
}  // namespace mooncake::te::hip
