// nvlink on the host emulation (MC_PLATFORM_EMULATION=1: fabric handles are shared files under /dev/shm, not an
// NVSwitch; MC_NVLINK_DOMAIN=test-domain from the BUILD env): registration (fabric memory exported, other device
// memory declined), reachability by NVLink domain rather than host, two engines moving device bytes through one
// fabric mapping, memory the target unregistered never written, a peer of another domain served by tcp staging,
// the managed allocator (on the device asked, freed when the engine closes), a peer's epoch table imported
// read-only, one epoch read per submission, and the inert forms (no domain, no platform).
#include "transfer_engine/transport/nvlink/nvlink_transport.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/testing/proc_maps.h"
#include "transfer_engine/transport/device_ipc/handle_hex.h"
#include "transfer_engine/transport/device_ipc/testing/engine_pair.h"

namespace mooncake::te::nvlink {
namespace {

using device_ipc::testing::kTimeout;

std::shared_ptr<Platform> Cuda() { return PlatformRegistry::Get().ForType(MemoryType::kCuda); }

// A started transport on host "this-host" with `platforms`; `domain` as its option.
struct Started {
  explicit Started(const std::string& domain, PlatformRegistry* platforms = &PlatformRegistry::Get())
      : local(platforms) {
    EXPECT_TRUE(t.Configure(TransportOptions("nvlink", {{"nvlink.domain", domain}})).ok());
    EXPECT_TRUE(t.Start(local.ctx).ok());
  }
  ~Started() { t.Stop(); }
  device_ipc::testing::LocalContext local;
  NvlinkTransport t;
};

MemoryRegion Region(void* p, size_t n) { return device_ipc::testing::RegionOf(p, n, MemoryKind{MemoryType::kCuda, 0}); }

TEST(NvlinkTransportTest, ExportsFabricMemoryAndReachesItsDomainOnAnyHost) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr);
  Started s("domain-a");
  auto fab = cuda->Allocate(1 << 20, AllocationKind::kFabric, 0);
  auto dev = cuda->Allocate(1 << 20, AllocationKind::kDevice, 0);
  ASSERT_TRUE(fab.ok() && dev.ok());
  auto r = s.t.RegisterRegion(Region(*fab, 1 << 20));
  ASSERT_TRUE(r.ok());
  ASSERT_FALSE(r->declined) << r->why_declined;
  auto handle = device_ipc::HandleFromHex(r->descriptor_fields.value("shm_name", ""));
  ASSERT_TRUE(handle.ok());
  auto mapped = cuda->ImportFabric(*handle, 1 << 20);  // what a peer of the domain does
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  memset(*mapped, 0x6b, 8);
  EXPECT_EQ(static_cast<unsigned char*>(*fab)[7], 0x6b);
  EXPECT_TRUE(cuda->CloseFabric(*mapped, 1 << 20).ok());
  auto plain = s.t.RegisterRegion(Region(*dev, 1 << 20));  // not fabric memory: another transport's
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->declined);
  EXPECT_NE(plain->why_declined.find("fabric allocation"), std::string::npos) << plain->why_declined;

  nlohmann::json desc = nlohmann::json::object();
  s.t.Describe(desc);
  EXPECT_EQ(desc[kDomainField], "domain-a");
  EXPECT_EQ(desc["nvlink_platform"], cuda->name());
  ASSERT_TRUE(desc.contains(kEpochTableField));
  SegmentDescriptor peer;
  peer.json = {{"host_id", "another-host"}, {"nvlink_platform", cuda->name()}, {kDomainField, "domain-a"}};
  EXPECT_TRUE(s.t.CanReach(peer)) << "another host of the domain";
  peer.json[kDomainField] = "domain-b";
  peer.json["host_id"] = "this-host";
  EXPECT_FALSE(s.t.CanReach(peer)) << "this host, another domain";
  peer.json.erase(kDomainField);
  EXPECT_FALSE(s.t.CanReach(peer));
  peer.json[kDomainField] = 7;  // untrusted: wrong type
  EXPECT_FALSE(s.t.CanReach(peer));
  EXPECT_TRUE(cuda->Free(*fab, 1 << 20, AllocationKind::kFabric).ok());
  EXPECT_TRUE(cuda->Free(*dev, 1 << 20, AllocationKind::kDevice).ok());
}

TEST(NvlinkTransportTest, WithoutADomainOrAPlatformItIsInert) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr);
  for (PlatformRegistry* platforms : {&PlatformRegistry::Get(), static_cast<PlatformRegistry*>(nullptr)}) {
    Started s(platforms ? "" : "domain-a", platforms);
    auto fab = cuda->Allocate(4096, AllocationKind::kFabric, 0);
    ASSERT_TRUE(fab.ok());
    auto r = s.t.RegisterRegion(Region(*fab, 4096));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->declined);
    EXPECT_NE(r->why_declined.find(platforms ? "no NVLink domain" : "no usable CUDA platform"), std::string::npos)
        << r->why_declined;
    nlohmann::json desc = nlohmann::json::object();
    s.t.Describe(desc);
    EXPECT_FALSE(desc.contains(kDomainField));
    EXPECT_EQ(s.t.AllocateManaged(4096, -1).status().code(), ErrorCode::kDeviceNotFound);
    EXPECT_TRUE(cuda->Free(*fab, 4096, AllocationKind::kFabric).ok());
  }
}

class NvlinkEngineTest : public device_ipc::testing::EnginePairTest {
 protected:
  NvlinkEngineTest() : EnginePairTest({"nvlink", MemoryType::kCuda, AllocationKind::kFabric, "nvlink"}) {}
};

TEST_F(NvlinkEngineTest, MovesDeviceMemoryThroughOneFabricMapping) { CheckMovesThroughOneMapping(); }

TEST_F(NvlinkEngineTest, MemoryTheTargetUnregisteredIsNeverWritten) { CheckUnregisteredIsNeverWritten(); }

TEST_F(NvlinkEngineTest, ManagedBuffersAreFabricMemory) {
  auto p = a_->AllocateManaged(1 << 20);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(PlatformRegistry::Get().Classify(*p).ToString(), "cuda:0");
  auto handle = dev_->ExportFabric(*p, 1 << 20);
  EXPECT_TRUE(handle.ok()) << handle.status().ToString();
  EXPECT_TRUE(a_->FreeManaged(*p, 1 << 20).ok());
}

// The mappings of /dev/shm/<prefix>* files of `bytes` bytes, as (address, permissions) from /proc/self/maps.
std::vector<std::pair<uintptr_t, std::string>> ShmMappings(const std::string& prefix, size_t bytes) {
  std::vector<std::pair<uintptr_t, std::string>> out;
  for (const auto& m : te::testing::ProcSelfMaps()) {
    if (m.path.find("/dev/shm/" + prefix) != std::string::npos && m.hi - m.lo == bytes) out.emplace_back(m.lo, m.perms);
  }
  return out;
}

// The field after the last ':' of an emulation fabric handle (its device).
int HandleDevice(const std::string& handle) { return std::stoi(handle.substr(handle.rfind(':') + 1)); }

TEST_F(NvlinkEngineTest, APeersEpochTableIsImportedReadOnly) {
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 4096).ok());  // a read b's epoch: a imported b's table
  auto tables = ShmMappings("mc-emu-fabric-", device_ipc::kEpochTableBytes);
  size_t owners = 0, read_only = 0;
  uintptr_t imported = 0;
  for (const auto& [at, mode] : tables) {
    owners += mode == "rw-s";
    if (mode == "r--s") imported = at, ++read_only;
  }
  EXPECT_EQ(owners, 2u) << "a's and b's own tables";
  ASSERT_EQ(read_only, 1u) << "a's import of b's table";
  auto write = dev_->CopyAsync(reinterpret_cast<void*>(imported), "\xff\xff\xff\xff\xff\xff\xff\xff", 8, -1);
  ASSERT_TRUE(write.ok());
  EXPECT_FALSE((*write)->Wait().ok()) << "a device write into the peer's epochs";
  ASSERT_TRUE(Move(OpCode::kRead, 0, 0, 4096).ok()) << "the epochs still read";
}

TEST(NvlinkManagedTest, ManagedBuffersAndTheEpochTableAreOnTheDeviceAsked) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr);
  for (int device : {0, 1}) {
    device_ipc::testing::LocalContext local(&PlatformRegistry::Get());
    NvlinkTransport t;
    ASSERT_TRUE(t.Configure(TransportOptions("nvlink", {{"nvlink.domain", "d"},
                                                        {"nvlink.device", std::to_string(device)}})).ok());
    ASSERT_TRUE(t.Start(local.ctx).ok());
    auto p = t.AllocateManaged(1 << 20, -1);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(cuda->Classify(*p)->ToString(), "cuda:" + std::to_string(device));
    nlohmann::json desc = nlohmann::json::object();
    t.Describe(desc);
    auto table = device_ipc::HandleFromHex(desc.value(kEpochTableField, ""));
    ASSERT_TRUE(table.ok());
    EXPECT_EQ(HandleDevice(*table), device) << *table;
    EXPECT_TRUE(t.FreeManaged(*p, 1 << 20).ok());
    t.Stop();
  }
}

TEST(NvlinkManagedTest, AClosedEngineHasFreedItsManagedBuffers) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr);
  auto e = TransferEngine::Create(device_ipc::testing::LocalEngineOptions("nvlink"));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<std::string> files;
  for (size_t length : {size_t{1} << 20, size_t{3} << 20}) {
    auto p = (*e)->AllocateManaged(length);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto handle = cuda->ExportFabric(*p, length);  // "mc-host-emulation-fabric:v1:cuda:<file>:..."
    ASSERT_TRUE(handle.ok());
    const size_t from = handle->find("mc-emu-fabric-");
    files.push_back("/dev/shm/" +
                    handle->substr(from, handle->find(':', from) - from));
    EXPECT_EQ(access(files.back().c_str(), F_OK), 0) << files.back();
  }
  const size_t before = ShmMappings("mc-emu-fabric-", size_t{3} << 20).size();
  EXPECT_GE(before, 1u);
  e->reset();  // closed without free_managed_buffer
  for (const auto& f : files) EXPECT_NE(access(f.c_str(), F_OK), 0) << f << " outlived the engine";
  EXPECT_EQ(ShmMappings("mc-emu-fabric-", size_t{3} << 20).size(), before - 1) << "its mapping is gone";
}

// Slices of 4 KiB: one submission is many slices into one buffer.
class NvlinkSlicesTest : public device_ipc::testing::EnginePairTest {
 protected:
  NvlinkSlicesTest()
      : EnginePairTest({"nvlink", MemoryType::kCuda, AllocationKind::kFabric, "nvlink", {{"nvlink.slice_size", "4096"}}}) {}
};

TEST_F(NvlinkSlicesTest, ASubmissionReadsTheEpochOnceAndAWithdrawalBeforeItFailsAllItsSlices) {
  memset(local_, 'a', 64 << 10);
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 64 << 10).ok());
  nlohmann::json c = Carried();
  EXPECT_EQ(c["slices"], 16u) << c.dump();
  EXPECT_EQ(c["epoch_reads"], 1u) << "16 slices into one buffer share one read: " << c.dump();
  ASSERT_TRUE(Move(OpCode::kRead, 0, 0, 64 << 10).ok());
  EXPECT_EQ(Carried()["epoch_reads"], 2u) << "each submission reads again";
  // Withdrawn (unregistered) before the next submission: none of its 16 slices lands.
  ASSERT_TRUE(b_->UnregisterMemory(remote_).ok());
  memset(remote_, 0, 64 << 10);
  memset(local_, 'b', 64 << 10);
  Status st = Move(OpCode::kWrite, 0, 0, 64 << 10);
  EXPECT_EQ(st.code(), ErrorCode::kAddressNotRegistered) << st.ToString();
  for (size_t i = 0; i < (64 << 10); ++i) ASSERT_EQ(static_cast<char*>(remote_)[i], 0) << "byte " << i << " landed";
}

TEST(NvlinkDomainTest, APeerOfAnotherDomainIsServedByTcpStaging) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr);
  EngineOptions o = device_ipc::testing::LocalEngineOptions("nvlink");
  auto a = TransferEngine::Create(o);  // MC_NVLINK_DOMAIN: test-domain
  o.transport_options = {{"nvlink.domain", "other-domain"}};
  auto b = TransferEngine::Create(o);
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr size_t kLen = 1 << 20;
  auto src = cuda->Allocate(kLen, AllocationKind::kFabric, 0);
  auto dst = cuda->Allocate(kLen, AllocationKind::kFabric, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_TRUE((*a)->RegisterMemory(*src, kLen).ok());
  ASSERT_TRUE((*b)->RegisterMemory(*dst, kLen).ok());
  auto h = (*a)->OpenSegment((*b)->segment_name());
  ASSERT_TRUE(h.ok());
  memset(*src, 'd', kLen);
  TransferRequest r{OpCode::kWrite, *src, *h, reinterpret_cast<uint64_t>(*dst), kLen};
  ASSERT_TRUE((*a)->TransferSync({r}, kTimeout).ok());
  EXPECT_EQ(static_cast<char*>(*dst)[kLen - 1], 'd');
  auto stats = nlohmann::json::parse((*a)->StatsJson());
  EXPECT_FALSE(stats.contains("nvlink") && stats["nvlink"].contains((*b)->segment_name())) << stats.dump();
  uint64_t tcp = 0;
  for (const auto& [path, k] : stats["tcp"].items()) tcp += k.value("bytes", uint64_t{0});
  EXPECT_GE(tcp, kLen) << stats.dump();
  a->reset();
  b->reset();
  EXPECT_TRUE(cuda->Free(*src, kLen, AllocationKind::kFabric).ok());
  EXPECT_TRUE(cuda->Free(*dst, kLen, AllocationKind::kFabric).ok());
}

}  // namespace
}  // namespace mooncake::te::nvlink
