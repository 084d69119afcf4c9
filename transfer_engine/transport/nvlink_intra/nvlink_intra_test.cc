// nvlink_intra on the host emulation platform (MC_PLATFORM_EMULATION=1: memfd "cuda" memory, not a GPU): its
// registration hook (handle in Mooncake's shm_name field, host memory declined), reachability, device-to-device
// writes and reads between two engines with the peer buffer mapped once and dropped on refresh, the managed
// allocator and the inert form without a CUDA platform.
#include "transfer_engine/transport/nvlink_intra/nvlink_intra_transport.h"

#include <sys/mman.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/device_ipc/handle_hex.h"
#include "transfer_engine/transport/device_ipc/ipc_cache.h"
#include "transfer_engine/transport/device_ipc/testing/engine_pair.h"

namespace mooncake::te::nvlink_intra {
namespace {

using device_ipc::HandleFromHex;
using device_ipc::HandleToHex;
using device_ipc::IpcCache;
using device_ipc::kEpochTableBytes;

using device_ipc::testing::kTimeout;
using device_ipc::testing::LocalContext;

std::shared_ptr<Platform> Cuda() { return PlatformRegistry::Get().ForType(MemoryType::kCuda); }

TEST(NvlinkIntraTransportTest, ExportsCudaRegionsAndDeclinesHostMemory) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr) << "MC_PLATFORM_EMULATION=1 should enable the emulation";
  NvlinkIntraTransport t;
  LocalContext local(&PlatformRegistry::Get());
  TransportContext& ctx = local.ctx;
  ASSERT_TRUE(t.Start(ctx).ok());
  auto dev = cuda->Allocate(1 << 20, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  MemoryRegion region;
  region.start = reinterpret_cast<uint64_t>(*dev);
  region.length = 1 << 20;
  region.kind = MemoryKind{MemoryType::kCuda, 0};
  auto r = t.RegisterRegion(region);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->declined) << r->why_declined;
  ASSERT_TRUE(r->descriptor_fields.contains("shm_name"));
  std::string hex = r->descriptor_fields["shm_name"].get<std::string>();
  auto handle = HandleFromHex(hex);
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(HandleToHex(*handle), hex) << "upper-case hex, as Mooncake writes it";
  // The handle maps the region (here: imported by this same process).
  auto mapped = cuda->ImportIpc(*handle, getpid(), 1 << 20);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  memset(*mapped, 0x5a, 64);
  EXPECT_EQ(static_cast<unsigned char*>(*dev)[63], 0x5a);
  EXPECT_TRUE(cuda->CloseIpc(*mapped, 1 << 20).ok());

  std::vector<char> host(4096);
  MemoryRegion h;
  h.start = reinterpret_cast<uint64_t>(host.data());
  h.length = host.size();
  auto hr = t.RegisterRegion(h);
  ASSERT_TRUE(hr.ok());
  EXPECT_TRUE(hr->declined);
  EXPECT_TRUE(hr->descriptor_fields.empty());

  nlohmann::json desc = nlohmann::json::object();
  t.Describe(desc);
  EXPECT_EQ(desc["nvlink_intra_platform"], cuda->name());
  SegmentDescriptor peer;
  peer.name = "peer";
  peer.json = {{"host_id", "this-host"}, {"nvlink_intra_platform", cuda->name()}};
  EXPECT_TRUE(t.CanReach(peer));
  peer.json["host_id"] = "another-host";
  EXPECT_FALSE(t.CanReach(peer));
  peer.json = {{"host_id", "this-host"}, {"nvlink_intra_platform", 7}};  // untrusted: wrong type
  EXPECT_FALSE(t.CanReach(peer));
  t.Stop();
  EXPECT_TRUE(cuda->Free(*dev, 1 << 20, AllocationKind::kDevice).ok());
}

TEST(NvlinkIntraTransportTest, ReRegisteringAnAddressWhileTheOldRegistrationDrainsKeepsThemApart) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr) << "MC_PLATFORM_EMULATION=1 should enable the emulation";
  NvlinkIntraTransport t;
  LocalContext local(&PlatformRegistry::Get());
  TransportContext& ctx = local.ctx;
  ASSERT_TRUE(t.Start(ctx).ok());
  nlohmann::json desc = nlohmann::json::object();
  t.Describe(desc);
  int epoch_fd = desc.value("nvlink_intra_epoch_fd", -1);
  ASSERT_GE(epoch_fd, 0);
  void* table = mmap(nullptr, kEpochTableBytes, PROT_READ, MAP_SHARED, epoch_fd, 0);
  ASSERT_NE(table, MAP_FAILED);
  auto epoch = [&](uint32_t slot) { return static_cast<const volatile uint64_t*>(table)[slot]; };

  auto dev = cuda->Allocate(1 << 20, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  // As the engine does: the registration's state travels in the region's entry for the transport.
  auto registered = [&](MemoryRegion region) {
    auto r = t.RegisterRegion(region);
    EXPECT_TRUE(r.ok() && !r->declined);
    if (r.ok()) region.transports.push_back({t.name(), r->descriptor_fields, r->state, false, ""});
    return region;
  };
  MemoryRegion base;
  base.start = reinterpret_cast<uint64_t>(*dev);
  base.length = 1 << 20;
  base.kind = MemoryKind{MemoryType::kCuda, 0};
  MemoryRegion old_reg = registered(base);
  ASSERT_EQ(old_reg.transports.size(), 1u);
  auto old_slot = old_reg.transports[0].descriptor_fields[kEpochSlotField].get<uint32_t>();

  t.WithdrawRegion(old_reg);  // the old registration drains ...
  MemoryRegion new_reg = registered(base);  // ... while the same address is registered again
  ASSERT_EQ(new_reg.transports.size(), 1u);
  auto new_slot = new_reg.transports[0].descriptor_fields[kEpochSlotField].get<uint32_t>();
  auto new_epoch = new_reg.transports[0].descriptor_fields[kEpochField].get<uint64_t>();
  ASSERT_NE(new_slot, old_slot);
  uint64_t old_before = epoch(old_slot);
  t.UnregisterRegion(old_reg);  // the old one finishes draining

  EXPECT_EQ(epoch(new_slot), new_epoch) << "ending the old registration moved the new buffer's epoch";
  EXPECT_GT(epoch(old_slot), old_before) << "the old registration's slot was not given up";
  t.WithdrawRegion(new_reg);
  EXPECT_GT(epoch(new_slot), new_epoch) << "withdrawing the new registration did not move its epoch";
  t.UnregisterRegion(new_reg);
  t.UnregisterRegion(new_reg);  // once only: the slot is not given up twice
  MemoryRegion third = registered(base), fourth = registered(base);
  EXPECT_NE(third.transports[0].descriptor_fields[kEpochSlotField],
            fourth.transports[0].descriptor_fields[kEpochSlotField]);
  t.UnregisterRegion(third);
  t.UnregisterRegion(fourth);
  munmap(table, kEpochTableBytes);
  t.Stop();
  EXPECT_TRUE(cuda->Free(*dev, 1 << 20, AllocationKind::kDevice).ok());
}

TEST(NvlinkIntraTransportTest, WithoutACudaPlatformItIsInert) {
  NvlinkIntraTransport t;
  LocalContext local(nullptr);  // as in a process without any usable CUDA platform
  TransportContext& ctx = local.ctx;
  ASSERT_TRUE(t.Start(ctx).ok());
  MemoryRegion region;
  region.start = 0x10000;
  region.length = 4096;
  region.kind = MemoryKind{MemoryType::kCuda, 0};
  auto r = t.RegisterRegion(region);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->declined);
  EXPECT_NE(r->why_declined.find("no usable CUDA platform"), std::string::npos) << r->why_declined;
  nlohmann::json desc = nlohmann::json::object();
  t.Describe(desc);
  EXPECT_FALSE(desc.contains("nvlink_intra_platform"));
  EXPECT_EQ(t.AllocateManaged(4096, -1).status().code(), ErrorCode::kDeviceNotFound);
}

// Two engines of this process, both with nvlink_intra (and their default transports).
class NvlinkIntraEngineTest : public device_ipc::testing::EnginePairTest {
 protected:
  NvlinkIntraEngineTest() : EnginePairTest({"nvlink_intra", MemoryType::kCuda, AllocationKind::kDevice}) {}
};

TEST_F(NvlinkIntraEngineTest, MovesDeviceMemoryThroughOneCachedMapping) { CheckMovesThroughOneMapping(); }

TEST_F(NvlinkIntraEngineTest, ARefreshedPeerIsMappedAgain) {
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 4096).ok());
  a_->InvalidateSegment(b_->segment_name());  // drops the descriptor: nvlink_intra forgets its mappings
  EXPECT_EQ(Carried()["mapped"], 0u) << Carried().dump();
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 4096).ok());
  EXPECT_EQ(Carried()["imports"], 2u) << Carried().dump();
  EXPECT_EQ(Carried()["mapped"], 1u);
}

TEST_F(NvlinkIntraEngineTest, MemoryTheTargetUnregisteredIsNeverWritten) { CheckUnregisteredIsNeverWritten(); }

TEST_F(NvlinkIntraEngineTest, UnregisteringOneBufferLeavesThePeersOtherBuffersValid) {
  constexpr size_t kExtra = 1 << 20;
  auto extra = dev_->Allocate(kExtra, AllocationKind::kDevice, 0);
  ASSERT_TRUE(extra.ok());
  ASSERT_TRUE(b_->RegisterMemory(*extra, kExtra).ok());
  a_->InvalidateSegment(b_->segment_name());  // a's next transfer fetches b's descriptor with both buffers
  memset(local_, 'x', 4096);
  TransferRequest into_x{OpCode::kWrite, local_, peer_, reinterpret_cast<uint64_t>(*extra), 4096};
  ASSERT_TRUE(a_->TransferSync({into_x}, kTimeout).ok());
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 4096).ok());  // into y (remote_)
  const nlohmann::json before = Carried();
  ASSERT_EQ(before["imports"], 2u) << before.dump();
  ASSERT_TRUE(b_->UnregisterMemory(*extra).ok());  // x is gone; a's cached descriptor still lists it
  // y: copied at once through its cached mapping, with no failed attempt and no refresh (which would map it again).
  memset(local_, 'y', 4096);
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 4096).ok());
  EXPECT_EQ(static_cast<char*>(remote_)[4095], 'y');
  nlohmann::json after = Carried();
  EXPECT_EQ(after["errors"], before["errors"]) << "a copy into y failed: " << after.dump();
  EXPECT_EQ(after["imports"], 2u) << "y was mapped again: " << after.dump();
  // x: refused cleanly, never written.
  memset(*extra, 0, 4096);
  Status st = a_->TransferSync({into_x}, kTimeout);
  EXPECT_EQ(st.code(), ErrorCode::kAddressNotRegistered) << st.ToString();
  EXPECT_EQ(static_cast<char*>(*extra)[0], 0) << "a write landed in memory the target had unregistered";
  memset(local_, 'z', 4096);
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 4096).ok());
  EXPECT_EQ(static_cast<char*>(remote_)[0], 'z');
  EXPECT_TRUE(dev_->Free(*extra, kExtra, AllocationKind::kDevice).ok());
}

TEST(NvlinkIntraCacheTest, MapsMoreBuffersThanTheBoundLeastRecentlyUsedFirst) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr);
  EngineOptions o = device_ipc::testing::LocalEngineOptions("tcp");
  o.transport_options = {{"nvlink_intra.max_mappings", "2"}};
  auto a = TransferEngine::Create(o);
  auto b = TransferEngine::Create(o);
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr size_t kLen = 1 << 20;
  constexpr int kBuffers = 5;
  std::vector<void*> dev;
  for (int i = 0; i <= kBuffers; ++i) {  // [0, kBuffers): b's; the last one: a's source
    auto m = cuda->Allocate(kLen, AllocationKind::kDevice, 0);
    ASSERT_TRUE(m.ok());
    dev.push_back(*m);
    ASSERT_TRUE((i < kBuffers ? *b : *a)->RegisterMemory(*m, kLen).ok());
  }
  auto peer = (*a)->OpenSegment((*b)->segment_name());
  ASSERT_TRUE(peer.ok());
  auto carried = [&] { return nlohmann::json::parse((*a)->StatsJson())["nvlink_intra"][(*b)->segment_name()]; };
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kBuffers; ++i) {
      memset(dev[kBuffers], 'a' + i + round, kLen);
      TransferRequest r{OpCode::kWrite, dev[kBuffers], *peer, reinterpret_cast<uint64_t>(dev[i]), kLen};
      ASSERT_TRUE((*a)->TransferSync({r}, kTimeout).ok());
      EXPECT_EQ(static_cast<char*>(dev[i])[kLen - 1], 'a' + i + round);
      EXPECT_LE(carried()["mapped"].get<uint64_t>(), 2u) << carried().dump();
    }
  }
  EXPECT_EQ(carried()["imports"], 2u * kBuffers) << "each buffer was evicted before its next use: " << carried().dump();
  // The most recent buffer stays mapped: using it again imports nothing.
  TransferRequest last{OpCode::kWrite, dev[kBuffers], *peer, reinterpret_cast<uint64_t>(dev[kBuffers - 1]), kLen};
  ASSERT_TRUE((*a)->TransferSync({last}, kTimeout).ok());
  EXPECT_EQ(carried()["imports"], 2u * kBuffers);
  a->reset();
  b->reset();
  for (void* p : dev) EXPECT_TRUE(cuda->Free(p, kLen, AllocationKind::kDevice).ok());
}

TEST(NvlinkIntraCacheTest, AMappingACopyHoldsIsNeverEvicted) {
  auto cuda = Cuda();
  ASSERT_NE(cuda, nullptr);
  IpcCache cache(device_ipc::IpcMappingOps(cuda, "nvlink_intra"), 2);
  constexpr size_t kLen = 1 << 16;
  SegmentDescriptor desc;
  desc.name = "peer";
  desc.json = {{"instance", "i1"}, {"pid", getpid()}};
  std::vector<void*> dev;
  std::vector<BufferDescriptor> bufs;
  for (int i = 0; i < 3; ++i) {
    auto m = cuda->Allocate(kLen, AllocationKind::kDevice, 0);
    ASSERT_TRUE(m.ok());
    dev.push_back(*m);
    auto h = cuda->ExportIpc(*m, kLen);
    ASSERT_TRUE(h.ok());
    BufferDescriptor b;
    b.addr = reinterpret_cast<uint64_t>(*m);
    b.length = kLen;
    b.json = {{"shm_name", HandleToHex(*h)}};
    bufs.push_back(b);
  }
  auto held = cache.Get(desc, bufs[0]);  // the least recently used, but held by a "copy"
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(cache.Get(desc, bufs[1]).ok());
  ASSERT_TRUE(cache.Get(desc, bufs[2]).ok());  // evicts bufs[1], not the held bufs[0]
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.evictions(), 1u);
  memset((*held)->base(), 'h', kLen);  // still mapped
  EXPECT_EQ(static_cast<char*>(dev[0])[kLen - 1], 'h');
  auto again = cache.Get(desc, bufs[0]);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), held->get()) << "the held mapping stayed cached";
  EXPECT_EQ(cache.CountBySegment()["peer"].second, 3u) << "imports";
  held->reset();
  again->reset();
  cache.Clear();
  for (void* p : dev) EXPECT_TRUE(cuda->Free(p, kLen, AllocationKind::kDevice).ok());
}

TEST_F(NvlinkIntraEngineTest, HostMemoryGoesAnotherWay) {
  std::vector<char> host(1 << 16, 'h');
  ASSERT_TRUE(a_->RegisterMemory(host.data(), host.size()).ok());
  TransferRequest r{OpCode::kWrite, host.data(), peer_, reinterpret_cast<uint64_t>(remote_), host.size()};
  ASSERT_TRUE(a_->TransferSync({r}, kTimeout).ok());  // host -> cuda: tcp staging, not nvlink_intra
  EXPECT_EQ(static_cast<char*>(remote_)[100], 'h');
  auto stats = nlohmann::json::parse(a_->StatsJson());
  EXPECT_FALSE(stats.contains("nvlink_intra") && stats["nvlink_intra"].contains(b_->segment_name()))
      << stats.dump();
  EXPECT_TRUE(a_->UnregisterMemory(host.data()).ok());
}

TEST(NvlinkIntraManagedTest, ManagedBuffersAreShareableDeviceMemory) {
  // The preferred transport serves allocate_managed_buffer.
  EngineOptions o = device_ipc::testing::LocalEngineOptions("nvlink_intra");
  auto e = TransferEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto p = (*e)->AllocateManaged(1 << 20);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(PlatformRegistry::Get().Classify(*p).ToString(), "cuda:0");
  auto handle = Cuda()->ExportIpc(*p, 1 << 20);  // shareable: it exports
  EXPECT_TRUE(handle.ok()) << handle.status().ToString();
  EXPECT_TRUE((*e)->FreeManaged(*p, 1 << 20).ok());
}

TEST(NvlinkIntraManagedTest, ManagedBuffersGoOnTheDeviceAskedFor) {
  EngineOptions o = device_ipc::testing::LocalEngineOptions("nvlink_intra");
  auto e = TransferEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto on1 = (*e)->AllocateManaged(1 << 20, 1);
  ASSERT_TRUE(on1.ok()) << on1.status().ToString();
  EXPECT_EQ(PlatformRegistry::Get().Classify(*on1).ToString(), "cuda:1");
  EXPECT_TRUE((*e)->IsRegistered(*on1, 1 << 20));
  auto deflt = (*e)->AllocateManaged(1 << 20, -1);  // no device named: the transport's default (0)
  ASSERT_TRUE(deflt.ok()) << deflt.status().ToString();
  EXPECT_EQ(PlatformRegistry::Get().Classify(*deflt).ToString(), "cuda:0");
  auto missing = (*e)->AllocateManaged(1 << 20, 7);  // the emulation has 2 devices
  EXPECT_EQ(missing.status().code(), ErrorCode::kDeviceNotFound) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("no device 7"), std::string::npos) << missing.status().ToString();
  EXPECT_EQ((*e)->AllocateManaged(1 << 20, -2).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE((*e)->FreeManaged(*on1, 1 << 20).ok());
  EXPECT_TRUE((*e)->FreeManaged(*deflt, 1 << 20).ok());
}

TEST(NvlinkIntraManagedTest, HostAllocatorsRefuseADevice) {
  // Managed buffers are host memory: a device cannot be honoured.
  EngineOptions o = device_ipc::testing::LocalEngineOptions("tcp");
  auto e = TransferEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto p = (*e)->AllocateManaged(1 << 20, 0);
  EXPECT_EQ(p.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("allocates host memory"), std::string::npos) << p.status().ToString();
  auto host = (*e)->AllocateManaged(1 << 20, -1);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_FALSE(PlatformRegistry::Get().Classify(*host).ToString().rfind("cuda", 0) == 0);
  EXPECT_TRUE((*e)->FreeManaged(*host, 1 << 20).ok());
}

// The registry's CUDA platform (the emulation) under its own name, watched: the stream of each copy.
class StreamWatch final : public Platform {
 public:
  explicit StreamWatch(std::shared_ptr<Platform> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  MemoryType device_type() const override { return inner_->device_type(); }
  PlatformProbe Probe() override { return inner_->Probe(); }
  std::optional<MemoryKind> Classify(const void* p) override { return inner_->Classify(p); }
  StatusOr<void*> Allocate(size_t n, AllocationKind k, int d) override { return inner_->Allocate(n, k, d); }
  Status Free(void* p, size_t n, AllocationKind k) override { return inner_->Free(p, n, k); }
  StatusOr<std::string> ExportIpc(void* p, size_t n) override { return inner_->ExportIpc(p, n); }
  StatusOr<void*> ImportIpc(const std::string& h, int pid, size_t n) override { return inner_->ImportIpc(h, pid, n); }
  Status CloseIpc(void* p, size_t n) override { return inner_->CloseIpc(p, n); }
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t n, int device,
                                                      void* stream) override {
    {
      std::lock_guard lock(mu_);
      streams_.push_back(stream);
    }
    return inner_->CopyAsync(dst, src, n, device, stream);
  }
  StatusOr<void*> CreateStream(int device) override { return inner_->CreateStream(device); }
  Status DestroyStream(void* s) override { return inner_->DestroyStream(s); }
  std::vector<void*> streams() {
    std::lock_guard lock(mu_);
    return streams_;
  }

 private:
  std::shared_ptr<Platform> inner_;
  std::mutex mu_;
  std::vector<void*> streams_;
};

TEST(NvlinkIntraStreamsTest, SlicesInFlightRunOnDifferentStreams) {
  auto original = Cuda();
  ASSERT_NE(original, nullptr);
  auto watch = std::make_shared<StreamWatch>(original);
  PlatformRegistry::Get().Register(watch);  // replaces the emulation (same name) for the engines below
  setenv("MC_NVLINK_INTRA_SLICE_SIZE", "1048576", 1);
  setenv("MC_NVLINK_INTRA_STREAMS", "3", 1);
  {
    EngineOptions o = device_ipc::testing::LocalEngineOptions("tcp");
    auto a = TransferEngine::Create(o);
    auto b = TransferEngine::Create(o);
    ASSERT_TRUE(a.ok() && b.ok());
    constexpr size_t kLen = 6 << 20;
    auto local = watch->Allocate(kLen, AllocationKind::kDevice, 0);
    auto remote = watch->Allocate(kLen, AllocationKind::kDevice, 0);
    ASSERT_TRUE(local.ok() && remote.ok());
    ASSERT_TRUE((*a)->RegisterMemory(*local, kLen).ok());
    ASSERT_TRUE((*b)->RegisterMemory(*remote, kLen).ok());
    auto peer = (*a)->OpenSegment((*b)->segment_name());
    ASSERT_TRUE(peer.ok());
    for (size_t i = 0; i < kLen; ++i) static_cast<unsigned char*>(*local)[i] = static_cast<unsigned char>(i * 7 + 1);
    const size_t before = watch->streams().size();
    TransferRequest r{OpCode::kWrite, *local, *peer, reinterpret_cast<uint64_t>(*remote), kLen};
    ASSERT_TRUE((*a)->TransferSync({r}, kTimeout).ok());
    EXPECT_EQ(0, memcmp(*local, *remote, kLen));
    auto used = watch->streams();
    used.erase(used.begin(), used.begin() + static_cast<long>(before));
    ASSERT_EQ(used.size(), 6u) << "one copy per 1 MiB slice";
    EXPECT_EQ(std::count(used.begin(), used.end(), nullptr), 0) << "a copy on the platform's own stream";
    EXPECT_EQ(std::set<void*>(used.begin(), used.end()).size(), 3u) << "the slices spread over the 3 streams";
    a->reset();
    b->reset();
    EXPECT_TRUE(watch->Free(*local, kLen, AllocationKind::kDevice).ok());
    EXPECT_TRUE(watch->Free(*remote, kLen, AllocationKind::kDevice).ok());
  }
  unsetenv("MC_NVLINK_INTRA_SLICE_SIZE");
  unsetenv("MC_NVLINK_INTRA_STREAMS");
  PlatformRegistry::Get().Register(original);
}

}  // namespace
}  // namespace mooncake::te::nvlink_intra
