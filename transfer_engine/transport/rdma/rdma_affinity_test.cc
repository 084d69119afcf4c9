// NIC choice by memory locality on the FAKE verbs provider: two fake HCAs on different NUMA nodes
// (fake_mlx5_0 on node 1, fake_mlx5_1 on node 0); this process (fake host "hostA") writes to a target engine in
// a child process (fake host "hostB"). Buffers use the NICs nearest their memory; the striping by measured
// throughput stays among those, and the others take over when the near ones fail.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/transport/conformance/pattern.h"
#include "transfer_engine/transport/conformance/target.h"
#include "transfer_engine/transport/rdma/rdma_nic.h"
#include "transfer_engine/transport/rdma/testing/fake_env.h"
#include "transfer_engine/transport/rdma/testing/fake_verbs.h"

namespace mooncake::te::rdma {
namespace {

using conformance::Digest;
using conformance::FillPattern;

const std::string kState = [] {
  // fake_mlx5_0 is on NUMA node 1 under PCIe root pci0000:80, fake_mlx5_1 on node 0 under pci0000:00.
  std::string s = fake::UseFakeVerbs("fake_mlx5_0:numa=1:pcie_root=80,fake_mlx5_1:numa=0:pcie_root=00");
  setenv("MC_RDMA_FAKE_HOST", "hostA", 1);
  setenv("MC_RDMA_FAKE_PEERMEM", "1", 1);  // "cuda" memory of the host emulation registers (peer memory)
  // The devices' locality, as the engine core reads it from the platform (MemoryRegion::locality): cuda:0 on
  // NUMA node 1 at an unknown PCI address; cuda:1 on node 1 too, at 0000:3b:00.0 (below root pci0000:00).
  PlatformRegistry::Get().Register(
      MakeHostEmulationPlatform(2, {DeviceLocality{1, ""}, DeviceLocality{1, "0000:3b:00.0"}}));
  return s;
}();

constexpr size_t kSize = 4 << 20;

EngineOptions Options() {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "rdma";
  o.transports = {"rdma"};
  o.transport_options["rdma.backoff_ms"] = "200";
  return o;
}

// Host memory bound to NUMA node 0 (mbind), so that where it lives does not depend on the CPU the test runs on
// (a multi-socket machine); node() reads back where its first page is.
class HostBuffer {
 public:
  explicit HostBuffer(size_t len) : len_(len) {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    unsigned long node0 = 1;
    constexpr int kMpolBind = 2;
    if (data_ && syscall(SYS_mbind, data_, len, kMpolBind, &node0, sizeof(node0) * 8, 0) != 0) bind_error_ = errno;
  }
  ~HostBuffer() {
    if (data_) munmap(data_, len_);
  }
  uint8_t* data() { return data_; }
  /// The NUMA node of the first page (touch it first), or -1.
  int node() const {
    int n = -1;
    constexpr unsigned long kNodeOfAddr = 1 | 2;  // MPOL_F_NODE | MPOL_F_ADDR
    return syscall(SYS_get_mempolicy, &n, nullptr, 0, data_, kNodeOfAddr) == 0 ? n : -1;
  }
  std::string bind_result() const { return bind_error_ ? strerror(bind_error_) : "bound to node 0"; }

 private:
  size_t len_;
  uint8_t* data_ = nullptr;
  int bind_error_ = 0;
};

class RdmaAffinityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* host : {"hostA", "hostB"}) {
      for (const char* dev : {"fake_mlx5_0", "fake_mlx5_1"}) fake::SetFault(kState, host, dev, "");
    }
  }
  void TearDown() override {
    SetUp();
    unsetenv("MC_CUSTOM_TOPO_JSON");
  }
  void Make() {
    auto e = TransferEngine::Create(Options());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    a_ = std::move(e.value());
    src_ = std::make_unique<HostBuffer>(kSize);
    ASSERT_NE(src_->data(), nullptr);
    FillPattern(src_->data(), kSize, 3, 0);
    ASSERT_TRUE(a_->RegisterMemory(src_->data(), kSize).ok());
    conformance::TargetOptions to;
    to.engine = Options();
    to.buffer_size = kSize;
    setenv("MC_RDMA_FAKE_HOST", "hostB", 1);  // inherited by the child only
    auto t = conformance::StartPeerProcessTarget(to);
    setenv("MC_RDMA_FAKE_HOST", "hostA", 1);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    target_ = std::move(t.value());
    auto h = a_->OpenSegment(target_->segment_name());
    ASSERT_TRUE(h.ok());
    h_ = *h;
  }
  Status Write(const uint8_t* from, size_t len) {
    std::vector<TransferRequest> reqs;
    for (size_t o = 0; o < len; o += 65536) {
      reqs.push_back({OpCode::kWrite, const_cast<uint8_t*>(from) + o, h_, target_->buffer_address() + o, 65536});
    }
    Status st = a_->TransferSync(reqs, std::chrono::seconds(20));
    if (!st.ok()) return st;
    auto digest = target_->DigestOf(0, len);
    if (!digest.ok()) return digest.status();
    return *digest == Digest(from, len) ? Status::Ok() : Status(ErrorCode::kMemory, "data arrived damaged");
  }
  // Bytes carried by the paths of local NIC `nic` so far.
  uint64_t BytesVia(const std::string& nic) {
    uint64_t sum = 0;
    nlohmann::json s = nlohmann::json::parse(a_->StatsJson(), nullptr, false)["rdma"][target_->segment_name()];
    for (const auto& [label, p] : s["paths"].items()) {
      if (label.rfind(nic + "->", 0) == 0) sum += p["bytes"].get<uint64_t>();
    }
    return sum;
  }

  std::unique_ptr<TransferEngine> a_;
  std::unique_ptr<conformance::Target> target_;
  std::unique_ptr<HostBuffer> src_;
  SegmentHandle h_{};
};

TEST_F(RdmaAffinityTest, HostMemoryUsesTheNicsOfItsNumaNode) {
  Make();
  // fake_mlx5_0 is on node 1, fake_mlx5_1 on node 0.
  const int node = src_->node();
  ASSERT_TRUE(node == 0 || node == 1) << "the buffer is on NUMA node " << node << " (mbind: " << src_->bind_result()
                                      << "); the fake NICs are on nodes 0 and 1";
  const std::string near = node == 0 ? "fake_mlx5_1" : "fake_mlx5_0";
  const std::string far = node == 0 ? "fake_mlx5_0" : "fake_mlx5_1";
  ASSERT_TRUE(Write(src_->data(), kSize).ok());
  EXPECT_EQ(BytesVia(near), kSize) << a_->StatsJson();
  EXPECT_EQ(BytesVia(far), 0u) << "a NIC of another NUMA node carried traffic: " << a_->StatsJson();
  // The near NIC fails: the far one takes over (the preference never strands a transfer).
  ASSERT_TRUE(fake::SetFault(kState, "hostA", near, "wc_error"));
  Status st = Write(src_->data(), 1 << 20);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(BytesVia(far), uint64_t{1} << 20);
}

TEST_F(RdmaAffinityTest, TheTopologyMatrixChoosesPerLocation) {
  const char* tmp = getenv("TEST_TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/rdma_affinity_topology.json";
  std::ofstream(path) << R"({"cpu:0": [["fake_mlx5_0"], ["fake_mlx5_1"]],)"
                      << R"( "cuda:0": [["fake_mlx5_1"], ["fake_mlx5_0"]]})";
  setenv("MC_CUSTOM_TOPO_JSON", path.c_str(), 1);
  Make();
  ASSERT_TRUE(Write(src_->data(), kSize).ok());
  EXPECT_EQ(BytesVia("fake_mlx5_0"), kSize) << "cpu:0 memory ignored the matrix: " << a_->StatsJson();
  EXPECT_EQ(BytesVia("fake_mlx5_1"), 0u) << a_->StatsJson();
  // Device memory: the matrix's entry for its device.
  auto platform = PlatformRegistry::Get().ForType(MemoryType::kCuda);
  ASSERT_NE(platform, nullptr);
  auto dev = platform->Allocate(kSize, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  auto copy = platform->CopyAsync(*dev, src_->data(), kSize, 0);
  ASSERT_TRUE(copy.ok() && (*copy)->Wait().ok());
  ASSERT_TRUE(a_->RegisterMemory(*dev, kSize, "cuda:0").ok());
  ASSERT_TRUE(Write(static_cast<const uint8_t*>(*dev), kSize).ok());
  EXPECT_EQ(BytesVia("fake_mlx5_1"), kSize) << "cuda:0 memory ignored the matrix: " << a_->StatsJson();
  ASSERT_TRUE(a_->UnregisterMemory(*dev).ok());
  a_.reset();
  ASSERT_TRUE(platform->Free(*dev, kSize, AllocationKind::kDevice).ok());
}

// Device memory without a topology matrix entry prefers the NICs on its device's NUMA node (the locality the
// engine core got from the platform): cuda:0 is on node 1, as is fake_mlx5_0.
TEST_F(RdmaAffinityTest, DeviceMemoryUsesTheNicsOfItsDevicesNumaNode) {
  unsetenv("MC_CUSTOM_TOPO_JSON");
  Make();
  auto platform = PlatformRegistry::Get().ForType(MemoryType::kCuda);
  ASSERT_NE(platform, nullptr);
  auto dev = platform->Allocate(kSize, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  auto copy = platform->CopyAsync(*dev, src_->data(), kSize, 0);
  ASSERT_TRUE(copy.ok() && (*copy)->Wait().ok());
  ASSERT_TRUE(a_->RegisterMemory(*dev, kSize, "cuda:0").ok());
  ASSERT_TRUE(Write(static_cast<const uint8_t*>(*dev), kSize).ok());
  EXPECT_EQ(BytesVia("fake_mlx5_0"), kSize) << "cuda:0 memory (NUMA node 1) ignored its locality: " << a_->StatsJson();
  EXPECT_EQ(BytesVia("fake_mlx5_1"), 0u) << a_->StatsJson();
  ASSERT_TRUE(a_->UnregisterMemory(*dev).ok());
  a_.reset();
  ASSERT_TRUE(platform->Free(*dev, kSize, AllocationKind::kDevice).ok());
}

// Device memory without a matrix entry prefers the NICs under its device's PCIe root, before its NUMA node:
// cuda:1 (0000:3b:00.0, NUMA node 1) is below root pci0000:00 (the highest root bus not above 0x3b among
// the fake sysfs's pci0000:00 and pci0000:80), as is fake_mlx5_1, which is on NUMA node 0.
TEST_F(RdmaAffinityTest, DeviceMemoryUsesTheNicsUnderItsPcieRoot) {
  unsetenv("MC_CUSTOM_TOPO_JSON");
  Make();
  auto platform = PlatformRegistry::Get().ForType(MemoryType::kCuda);
  ASSERT_NE(platform, nullptr);
  auto dev = platform->Allocate(kSize, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok());
  auto copy = platform->CopyAsync(*dev, src_->data(), kSize, 1);
  ASSERT_TRUE(copy.ok() && (*copy)->Wait().ok());
  ASSERT_TRUE(a_->RegisterMemory(*dev, kSize, "cuda:1").ok());
  ASSERT_TRUE(Write(static_cast<const uint8_t*>(*dev), kSize).ok());
  EXPECT_EQ(BytesVia("fake_mlx5_1"), kSize) << "cuda:1 memory ignored its PCIe root: " << a_->StatsJson();
  EXPECT_EQ(BytesVia("fake_mlx5_0"), 0u) << a_->StatsJson();
  ASSERT_TRUE(a_->UnregisterMemory(*dev).ok());
  a_.reset();
  ASSERT_TRUE(platform->Free(*dev, kSize, AllocationKind::kDevice).ok());
}

TEST(RdmaPcieRootTest, RootsOfPathsAndBusIds) {
  std::string root, dir;
  ASSERT_TRUE(PcieRootOfPath("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", &root, &dir));
  EXPECT_EQ(root, "pci0000:3a");
  EXPECT_EQ(dir, "/sys/devices");
  EXPECT_FALSE(PcieRootOfPath("/sys/devices/virtual/net/lo", &root, &dir));
  EXPECT_FALSE(PcieRootOfPath("/x/pcie0000:3a/y", &root, &dir));
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string roots = std::string(tmp ? tmp : "/tmp") + "/pcie_roots";
  mkdir(roots.c_str(), 0777);
  for (const char* r : {"pci0000:00", "pci0000:3a", "pci0000:80", "pci0001:00", "platform"}) {
    mkdir((roots + "/" + r).c_str(), 0777);
  }
  EXPECT_EQ(PcieRootOf("0000:3b:00.0", {roots}), "pci0000:3a");
  EXPECT_EQ(PcieRootOf("0000:3a:00.0", {roots}), "pci0000:3a");
  EXPECT_EQ(PcieRootOf("0000:17:00.1", {roots}), "pci0000:00");
  EXPECT_EQ(PcieRootOf("0000:ca:00.0", {roots}), "pci0000:80");
  EXPECT_EQ(PcieRootOf("0001:05:00.0", {roots}), "pci0001:00");
  EXPECT_EQ(PcieRootOf("0002:05:00.0", {roots}), "");  // no root of that domain
  EXPECT_EQ(PcieRootOf("not a bus id", {roots}), "");
  EXPECT_EQ(PcieRootOf("0000:3b:00.0", {}), "");
}

}  // namespace
}  // namespace mooncake::te::rdma
