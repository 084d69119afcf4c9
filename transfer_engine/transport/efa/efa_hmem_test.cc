// Device memory (FI_HMEM) decisions against the providers installed here, with the host emulation platform's
// device buffers (MC_PLATFORM_EMULATION=1: "cuda" memory that is host memory underneath):
// - tcp;ofi_rxm does not offer FI_HMEM: device memory is declined, naming FI_HMEM, the kind and the provider;
// - shm offers FI_HMEM: its domain is opened with it (where a device platform is usable), the transport says
//   it moves cuda memory, and registering cuda:0 memory goes to fi_mr_regattr with FI_HMEM_CUDA, which this
//   host's libfabric refuses (no CUDA driver): the region is declined with libfabric's answer (the engine then
//   stages it through another transport), and host memory registers as before;
// - efa.hmem=0, or no usable device platform: FI_HMEM is not asked for;
// - the probe says which; the kind to interface mapping;
// - with FakeHmemFabric (testing/: FI_HMEM faked over tcp;ofi_rxm), device memory is registered through
//   fi_mr_regattr with FI_HMEM_CUDA and its ordinal, published with keys, and RMA moves its bytes.
// FI_PROVIDER stays unset: libfabric loads every provider, and each transport names its own (efa.provider).

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <map>
#include <string>
#include <vector>

#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/platform/platform.h"
#include "transfer_engine/transport/efa/efa_transport.h"
#include "transfer_engine/transport/efa/fabric_domain.h"
#include "transfer_engine/transport/efa/testing/fake_hmem_fabric.h"

namespace mooncake::te::efa {
namespace {

bool SetUpEnvironment() {
  unsetenv("FI_PROVIDER");
  setenv(kPlatformEmulationEnv, "1", 1);
  return true;
}
const bool kEnvironment = SetUpEnvironment();

class EfaHmemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(HostEmulationRequestedByEnv());
    PlatformRegistry::Get().Register(MakeHostEmulationPlatform());
    platform_ = PlatformRegistry::Get().ForType(MemoryType::kCuda);
    ASSERT_TRUE(platform_) << "the host emulation platform is not registered";
  }
  std::unique_ptr<EfaTransport> Make(const std::string& provider, std::map<std::string, std::string> opts,
                                     bool with_platforms = true, const FabricApi* api = nullptr) {
    opts["efa.provider"] = provider;
    auto t = api ? std::make_unique<EfaTransport>(api) : std::make_unique<EfaTransport>();
    EXPECT_TRUE(t->Configure(TransportOptions("efa", opts)).ok());
    TransportContext ctx;
    ctx.config = &config_;
    ctx.memory = &memory_;
    ctx.platforms = with_platforms ? &PlatformRegistry::Get() : nullptr;
    ctx.advertised_ip = "127.0.0.1";
    ctx.device_filter = provider == "shm" ? "" : "lo";
    ctx.protocol = "efa";
    Status st = t->Start(ctx);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? std::move(t) : nullptr;
  }
  // Device memory of the emulation platform, as the engine describes it to transports.
  MemoryRegion DeviceRegion(void* mem, size_t len) {
    MemoryRegion r;
    r.start = reinterpret_cast<uint64_t>(mem);
    r.length = len;
    r.kind = PlatformRegistry::Get().Classify(mem);
    r.remote_accessible = true;
    return r;
  }
  EngineConfig config_;
  MemoryRegistry memory_;
  std::shared_ptr<Platform> platform_;
};

TEST_F(EfaHmemTest, KindsMapToLibfabricInterfaces) {
  auto cuda = HmemTargetFor(MemoryKind{MemoryType::kCuda, 3});
  ASSERT_TRUE(cuda);
  EXPECT_EQ(cuda->iface, FI_HMEM_CUDA);
  EXPECT_EQ(cuda->device, 3u);
  auto rocm = HmemTargetFor(MemoryKind{MemoryType::kRocm, 1});
  ASSERT_TRUE(rocm);
  EXPECT_EQ(rocm->iface, FI_HMEM_ROCR);
  EXPECT_FALSE(HmemTargetFor(MemoryKind{MemoryType::kNpu, 0}));
  EXPECT_FALSE(HmemTargetFor(MemoryKind{MemoryType::kMusa, 0}));
  EXPECT_FALSE(HmemTargetFor(MemoryKind{MemoryType::kHost, -1}));
}

TEST_F(EfaHmemTest, TcpDoesNotOfferHmemSoDeviceMemoryIsDeclined) {
  auto t = Make("tcp;ofi_rxm", {});
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->domain_info().hmem);
  EXPECT_FALSE(t->capabilities().Moves(MemoryType::kCuda, MemoryType::kHost));
  auto mem = platform_->Allocate(1 << 20, AllocationKind::kDevice, 0);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  auto r = t->RegisterRegion(DeviceRegion(*mem, 1 << 20));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->declined);
  EXPECT_NE(r->why_declined.find("does not offer"), std::string::npos) << r->why_declined;
  EXPECT_NE(r->why_declined.find("FI_HMEM"), std::string::npos) << r->why_declined;
  EXPECT_NE(r->why_declined.find("cuda:0"), std::string::npos) << r->why_declined;
  EXPECT_NE(r->why_declined.find("tcp;ofi_rxm"), std::string::npos) << r->why_declined;
  t->Stop();
  EXPECT_TRUE(platform_->Free(*mem, 1 << 20, AllocationKind::kDevice).ok());
}

TEST_F(EfaHmemTest, ShmOffersHmemAndDeviceRegistrationGoesToMrRegattr) {
  auto t = Make("shm", {});
  ASSERT_TRUE(t);
  ASSERT_TRUE(t->domain_info().hmem) << "shm offers FI_HMEM (with FI_MR_HMEM)";
  EXPECT_NE(t->domain_info().mr_mode & FI_MR_HMEM, 0u);
  EXPECT_TRUE(t->capabilities().Moves(MemoryType::kCuda, MemoryType::kHost));
  EXPECT_TRUE(t->capabilities().Moves(MemoryType::kHost, MemoryType::kCuda));
  EXPECT_TRUE(t->capabilities().Moves(MemoryType::kRocm, MemoryType::kRocm));
  auto mem = platform_->Allocate(1 << 20, AllocationKind::kDevice, 0);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  auto r = t->RegisterRegion(DeviceRegion(*mem, 1 << 20));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // libfabric here has no CUDA driver ("Hmem iface FI_HMEM_CUDA not supported"): refused, so declined.
  EXPECT_TRUE(r->declined);
  EXPECT_NE(r->why_declined.find("fi_mr_regattr"), std::string::npos) << r->why_declined;
  EXPECT_NE(r->why_declined.find("cuda:0"), std::string::npos) << r->why_declined;
  // Host memory registers on the FI_HMEM domain as before.
  std::vector<char> host(1 << 16);
  MemoryRegion hr;
  hr.start = reinterpret_cast<uint64_t>(host.data());
  hr.length = host.size();
  hr.remote_accessible = true;
  auto h = t->RegisterRegion(hr);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_FALSE(h->declined) << h->why_declined;
  t->UnregisterRegion(hr);
  t->Stop();
  EXPECT_TRUE(platform_->Free(*mem, 1 << 20, AllocationKind::kDevice).ok());
}

TEST_F(EfaHmemTest, HmemIsNotAskedForWhenOffOrWithoutADevicePlatform) {
  for (bool off : {true, false}) {
    auto t = off ? Make("shm", {{"efa.hmem", "0"}}) : Make("shm", {}, /*with_platforms=*/false);
    ASSERT_TRUE(t);
    EXPECT_FALSE(t->domain_info().hmem);
    EXPECT_EQ(t->domain_info().mr_mode & FI_MR_HMEM, 0u);
    EXPECT_FALSE(t->capabilities().Moves(MemoryType::kCuda, MemoryType::kHost));
    auto mem = platform_->Allocate(4096, AllocationKind::kDevice, 0);
    ASSERT_TRUE(mem.ok());
    auto r = t->RegisterRegion(DeviceRegion(*mem, 4096));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->declined);
    EXPECT_NE(r->why_declined.find(off ? "efa.hmem is off" : "no usable cuda or rocm platform"), std::string::npos)
        << r->why_declined;
    t->Stop();
    EXPECT_TRUE(platform_->Free(*mem, 4096, AllocationKind::kDevice).ok());
  }
}

TEST_F(EfaHmemTest, ProbeSaysWhetherTheProviderOffersHmem) {
  auto t = Make("tcp;ofi_rxm", {});  // libfabric is initialised with every provider before FI_PROVIDER is set
  ASSERT_TRUE(t);
  t->Stop();
  for (const char* provider : {"shm", "tcp;ofi_rxm"}) {
    setenv("FI_PROVIDER", provider, 1);
    TransportProbe p = ProbeEfa();
    unsetenv("FI_PROVIDER");
    EXPECT_TRUE(p.usable) << p.reason;
    const bool shm = std::string(provider) == "shm";
    EXPECT_NE(p.reason.find(shm ? "offers FI_HMEM" : "does not offer FI_HMEM"), std::string::npos) << p.reason;
  }
}

// FakeHmemFabric's tcp;ofi_rxm offers FI_HMEM: a domain opened with it registers emulated cuda:1 memory
// through fi_mr_regattr (FI_HMEM_CUDA, ordinal 1), and RMA moves bytes out of it and into it; a real tcp
// domain refuses device registrations.
TEST_F(EfaHmemTest, FakeHmemDomainRegistersDeviceMemoryWithItsInterface) {
  auto fake = testing::FakeHmemFabricApi();
  ASSERT_TRUE(fake.ok()) << fake.status().ToString();
  auto real = LoadFabricApi();
  ASSERT_TRUE(real.ok());
  FabricDomain::Options o;
  o.provider = "tcp;ofi_rxm";
  o.domain_filter = "lo";
  auto a = FabricDomain::Open(*fake, o);
  auto b = FabricDomain::Open(*real, o);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << " " << b.status().ToString();
  ASSERT_TRUE((*a)->info().hmem);
  EXPECT_FALSE((*b)->info().hmem);
  constexpr size_t kLen = 1 << 16;
  auto mem = platform_->Allocate(kLen, AllocationKind::kDevice, 1);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  const MemoryKind kind = PlatformRegistry::Get().Classify(*mem);
  ASSERT_EQ(kind.ToString(), "cuda:1");
  auto* dev = static_cast<unsigned char*>(*mem);
  for (size_t i = 0; i < kLen; ++i) dev[i] = static_cast<unsigned char>(i * 13 + 5);
  const size_t before = testing::FakeHmemRegistrations().size();
  auto dev_mr = (*a)->Register(dev, kLen, FabricDomain::RemoteAccess::kNone, *HmemTargetFor(kind));
  ASSERT_TRUE(dev_mr.ok()) << dev_mr.status().ToString();
  auto regs = testing::FakeHmemRegistrations();
  ASSERT_EQ(regs.size(), before + 1);
  EXPECT_EQ(regs.back().iface, FI_HMEM_CUDA);
  EXPECT_EQ(regs.back().device, 1u);
  EXPECT_EQ(regs.back().addr, dev);
  EXPECT_EQ(regs.back().length, kLen);
  auto refused = (*b)->Register(dev, kLen, FabricDomain::RemoteAccess::kNone, *HmemTargetFor(kind));
  EXPECT_EQ(refused.status().code(), ErrorCode::kNotImplemented) << refused.status().ToString();

  std::vector<unsigned char> dst(kLen, 0);
  auto dst_mr = (*b)->Register(dst.data(), kLen, FabricDomain::RemoteAccess::kReadWrite);
  ASSERT_TRUE(dst_mr.ok());
  auto peer = (*a)->Insert((*b)->info().address);
  ASSERT_TRUE(peer.ok());
  auto rma = [&](FabricOp::Kind kind_of_op) {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status result;
    auto op = std::make_unique<FabricOp>();
    op->kind = kind_of_op;
    op->local = dev;
    op->length = kLen;
    op->local_desc = (*dev_mr)->desc();
    op->dest = *peer;
    op->remote_addr = (*b)->info().virt_addr ? reinterpret_cast<uint64_t>(dst.data()) : 0;
    op->remote_key = (*dst_mr)->key();
    op->done = [&](const Status& st) {
      std::lock_guard lock(mu);
      result = st;
      done = true;
      cv.notify_all();
    };
    (*a)->Post(std::move(op));
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
    return result;
  };
  Status st = rma(FabricOp::Kind::kWrite);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(0, memcmp(dst.data(), dev, kLen));
  for (size_t i = 0; i < kLen; ++i) dst[i] = static_cast<unsigned char>(i * 3);
  st = rma(FabricOp::Kind::kRead);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(0, memcmp(dst.data(), dev, kLen));
  dev_mr->reset();
  (*a)->Stop();
  (*b)->Stop();
  EXPECT_TRUE(platform_->Free(*mem, kLen, AllocationKind::kDevice).ok());
}

// The transport over FakeHmemFabric: it says it moves cuda memory, and registers a cuda:0 region (every
// chunk through fi_mr_regattr) with keys in the descriptor fields instead of declining it.
TEST_F(EfaHmemTest, TransportRegistersDeviceMemoryWhereTheDomainTookHmem) {
  auto fake = testing::FakeHmemFabricApi();
  ASSERT_TRUE(fake.ok()) << fake.status().ToString();
  auto t = Make("tcp;ofi_rxm", {{"efa.max_mr_size", "65536"}}, /*with_platforms=*/true, *fake);
  ASSERT_TRUE(t);
  ASSERT_TRUE(t->domain_info().hmem);
  EXPECT_TRUE(t->capabilities().Moves(MemoryType::kCuda, MemoryType::kCuda));
  auto mem = platform_->Allocate(1 << 18, AllocationKind::kDevice, 0);
  ASSERT_TRUE(mem.ok());
  const size_t before = testing::FakeHmemRegistrations().size();
  auto r = t->RegisterRegion(DeviceRegion(*mem, 1 << 18));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->declined) << r->why_declined;
  EXPECT_TRUE(r->descriptor_fields.contains("efa_rkey")) << r->descriptor_fields.dump();
  auto regs = testing::FakeHmemRegistrations();
  ASSERT_EQ(regs.size(), before + 4);  // four 64 KiB chunks
  for (size_t i = before; i < regs.size(); ++i) {
    EXPECT_EQ(regs[i].iface, FI_HMEM_CUDA);
    EXPECT_EQ(regs[i].device, 0u);
  }
  t->UnregisterRegion(DeviceRegion(*mem, 1 << 18));
  t->Stop();
  EXPECT_TRUE(platform_->Free(*mem, 1 << 18, AllocationKind::kDevice).ok());
}

}  // namespace
}  // namespace mooncake::te::efa
