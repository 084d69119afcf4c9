// What the engine hands its transports for device memory: with the host emulation platform (a CUDA stand-in
// whose ExportDmabuf returns a dup of the allocation's memfd), RegisterRegion sees a dma-buf fd whose offset
// holds the registered bytes and the device's locality; the engine closes the fd once every transport has
// registered. Host memory gets no fd.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te {
namespace {

struct Seen {
  int fd = -1;
  bool fd_valid = false;
  uint64_t offset = 0;
  bool bytes_match = false;
  DeviceLocality locality;
  MemoryKind kind;
};
std::mutex g_mu;
std::vector<Seen> g_seen;

/// Records what the engine passes to RegisterRegion; moves nothing.
class DmabufProbeTransport : public Transport {
 public:
  std::string name() const override { return "dmabuf_probe"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.same_host = true;
    c.memory = {{MemoryType::kCuda, MemoryType::kCuda}};
    return c;
  }
  Status Configure(const TransportOptions&) override { return Status::Ok(); }
  Status Start(const TransportContext&) override { return Status::Ok(); }
  void Stop() override {}
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override {
    Seen s;
    s.fd = region.backing_fd;
    s.offset = region.backing_offset;
    s.kind = region.kind;
    s.locality = region.locality;
    if (s.fd >= 0) {
      s.fd_valid = fcntl(s.fd, F_GETFD) != -1;
      std::vector<char> got(region.length);
      s.bytes_match = pread(s.fd, got.data(), got.size(), static_cast<off_t>(s.offset)) ==
                          static_cast<ssize_t>(got.size()) &&
                      memcmp(got.data(), reinterpret_cast<const void*>(region.start), got.size()) == 0;
    }
    std::lock_guard lock(g_mu);
    g_seen.push_back(s);
    return RegionRegistration{};
  }
  void WithdrawRegion(const MemoryRegion&) override {}
  void UnregisterRegion(const MemoryRegion&) override {}
  void Describe(nlohmann::json&) const override {}
  bool CanReach(const SegmentDescriptor&) const override { return false; }
  void Submit(const SegmentDescriptor&, const std::vector<Slice*>& slices) override {
    for (Slice* s : slices) s->Complete(Status(ErrorCode::kNotImplemented, "probe moves nothing"));
  }
  size_t slice_size() const override { return 1 << 20; }
};

const bool kRegistered = [] {
  (void)TransportRegistry::Get().Register(TransportPlugin{
      "dmabuf_probe", {"dmabuf_probe"}, "", nullptr,
      [] { return std::unique_ptr<Transport>(new DmabufProbeTransport()); }});
  return true;
}();

TEST(EngineDmabufTest, DeviceMemoryCarriesADmabufDuringRegistrationOnly) {
  auto platform = MakeHostEmulationPlatform(2, {DeviceLocality{}, DeviceLocality{1, "0000:3b:00.0"}});
  PlatformRegistry::Get().Register(platform);
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "dmabuf_probe";
  o.transports = {"dmabuf_probe"};
  auto e = TransferEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();

  constexpr size_t kAlloc = 1 << 20, kOffset = 8192 + 100, kLen = 4096;
  auto dev = platform->Allocate(kAlloc, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  char* base = static_cast<char*>(*dev);
  for (size_t i = 0; i < kAlloc; ++i) base[i] = static_cast<char>(i * 7 + 3);
  ASSERT_TRUE((*e)->RegisterMemory(base + kOffset, kLen, "*").ok());

  std::vector<char> host(kLen, 'h');
  ASSERT_TRUE((*e)->RegisterMemory(host.data(), host.size(), "cpu:0").ok());

  std::vector<Seen> seen;
  {
    std::lock_guard lock(g_mu);
    seen = g_seen;
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].kind, (MemoryKind{MemoryType::kCuda, 1}));
  ASSERT_GE(seen[0].fd, 0) << "no dma-buf for device memory";
  EXPECT_TRUE(seen[0].fd_valid);
  EXPECT_TRUE(seen[0].bytes_match) << "offset " << seen[0].offset << " does not hold the registered bytes";
  EXPECT_EQ(seen[0].locality.numa_node, 1);
  EXPECT_EQ(seen[0].locality.pci_bus_id, "0000:3b:00.0");
  // The engine's fd is closed once the transports have registered.
  errno = 0;
  EXPECT_EQ(fcntl(seen[0].fd, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);

  EXPECT_EQ(seen[1].fd, -1);
  EXPECT_EQ(seen[1].locality.numa_node, -1);
  EXPECT_TRUE(seen[1].locality.pci_bus_id.empty());

  EXPECT_TRUE((*e)->UnregisterMemory(base + kOffset).ok());
  EXPECT_TRUE((*e)->UnregisterMemory(host.data()).ok());
  e->reset();
  EXPECT_TRUE(platform->Free(base, kAlloc, AllocationKind::kDevice).ok());
  PlatformRegistry::Get().Unregister(platform->name());
}

}  // namespace
}  // namespace mooncake::te
