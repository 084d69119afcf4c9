// EfaTransport's registration hooks over tcp;ofi_rxm on lo: regions longer than efa.max_mr_size are registered
// in chunks and published with a key per chunk; device memory (the host emulation platform's "cuda" memory,
// MC_PLATFORM_EMULATION=1) is declined with the reason; the descriptor has efa_-prefixed field names, and
// Mooncake's too when the engine publishes "efa".

#include "transfer_engine/transport/efa/efa_transport.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <vector>

#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::efa {
namespace {

bool SetUpEnvironment() {
  setenv("FI_PROVIDER", "tcp;ofi_rxm", 1);
  setenv(kPlatformEmulationEnv, "1", 1);
  return true;
}
const bool kEnvironment = SetUpEnvironment();

class EfaTransportTest : public ::testing::Test {
 protected:
  std::unique_ptr<EfaTransport> Make(const std::string& protocol, const std::map<std::string, std::string>& opts) {
    auto t = std::make_unique<EfaTransport>();
    EXPECT_TRUE(t->Configure(TransportOptions("efa", opts)).ok());
    TransportContext ctx;
    ctx.config = &config_;
    ctx.memory = &memory_;
    ctx.advertised_ip = "127.0.0.1";
    ctx.device_filter = "lo";
    ctx.protocol = protocol;
    Status st = t->Start(ctx);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? std::move(t) : nullptr;
  }
  EngineConfig config_;
  MemoryRegistry memory_;
};

TEST_F(EfaTransportTest, LongRegionsAreRegisteredInChunksWithAKeyEach) {
  auto t = Make("efa", {{"efa.max_mr_size", "65537"}});
  ASSERT_TRUE(t);
  std::vector<char> buf((1 << 20) + 5);
  MemoryRegion region;
  region.start = reinterpret_cast<uint64_t>(buf.data());
  region.length = buf.size();
  auto r = t->RegisterRegion(region);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const nlohmann::json& f = r->descriptor_fields;
  ASSERT_EQ(f.value("efa_mr_chunk", 0u), 65537u) << f.dump();
  const size_t chunks = (buf.size() + 65536) / 65537;
  ASSERT_TRUE(f["efa_chunk_rkeys"].is_array() && f["efa_chunk_rkeys"].size() == 1) << f.dump();
  ASSERT_EQ(f["efa_chunk_rkeys"][0].size(), chunks);
  EXPECT_EQ(f["rkey"][0], f["efa_chunk_rkeys"][0][0]);
  std::set<uint64_t> unique;
  for (const auto& k : f["efa_chunk_rkeys"][0]) unique.insert(k.get<uint64_t>());
  EXPECT_EQ(unique.size(), chunks) << "tcp needs a distinct key per registration";

  // A region within the limit has one registration and no chunk fields.
  std::vector<char> small(65537);
  MemoryRegion one;
  one.start = reinterpret_cast<uint64_t>(small.data());
  one.length = small.size();
  auto r1 = t->RegisterRegion(one);
  ASSERT_TRUE(r1.ok());
  EXPECT_FALSE(r1->descriptor_fields.contains("efa_mr_chunk")) << r1->descriptor_fields.dump();
  t->Stop();
}

TEST_F(EfaTransportTest, FieldNamesFollowThePublishedProtocol) {
  for (const std::string protocol : {"efa", "rdma"}) {
    auto t = Make(protocol, {});
    ASSERT_TRUE(t);
    nlohmann::json d = nlohmann::json::object();
    t->Describe(d);
    const bool mooncake = protocol == "efa";
    ASSERT_TRUE(d.contains("efa_devices")) << d.dump();
    EXPECT_EQ(d.contains("devices"), mooncake) << d.dump();
    const auto& dev = d["efa_devices"][0];
    if (mooncake) {
      EXPECT_EQ(d["devices"], d["efa_devices"]);
    }
    EXPECT_EQ(dev["name"], "lo");
    EXPECT_EQ(dev["lid"], 0);
    EXPECT_EQ(dev["gid"], t->domain_info().address);
    std::vector<char> buf(4096);
    MemoryRegion region;
    region.start = reinterpret_cast<uint64_t>(buf.data());
    region.length = buf.size();
    auto r = t->RegisterRegion(region);
    ASSERT_TRUE(r.ok());
    const nlohmann::json& f = r->descriptor_fields;
    EXPECT_TRUE(f.contains("efa_rkey") && f.contains("efa_lkey")) << f.dump();
    EXPECT_EQ(f.contains("rkey") && f.contains("lkey"), mooncake) << f.dump();
    t->Stop();
  }
}

TEST_F(EfaTransportTest, DeviceMemoryIsDeclinedWithTheReason) {
  ASSERT_TRUE(HostEmulationRequestedByEnv());
  PlatformRegistry::Get().Register(MakeHostEmulationPlatform());  // enabled, whenever the linked one was made
  auto platform = PlatformRegistry::Get().ForType(MemoryType::kCuda);
  ASSERT_TRUE(platform) << "the host emulation platform is not registered";
  auto mem = platform->Allocate(1 << 20, AllocationKind::kDevice, 0);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  MemoryRegion region;
  region.start = reinterpret_cast<uint64_t>(*mem);
  region.length = 1 << 20;
  region.kind = PlatformRegistry::Get().Classify(*mem);
  ASSERT_EQ(region.kind.type, MemoryType::kCuda) << region.kind.ToString();
  auto t = Make("efa", {});
  ASSERT_TRUE(t);
  auto r = t->RegisterRegion(region);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->declined);
  EXPECT_NE(r->why_declined.find("FI_HMEM"), std::string::npos) << r->why_declined;
  EXPECT_NE(r->why_declined.find("cuda:0"), std::string::npos) << r->why_declined;
  EXPECT_NE(r->why_declined.find("tcp;ofi_rxm"), std::string::npos) << r->why_declined;
  EXPECT_FALSE(t->domain_info().hmem) << "tcp;ofi_rxm is known to refuse FI_HMEM";
  t->Stop();
  EXPECT_TRUE(platform->Free(*mem, 1 << 20, AllocationKind::kDevice).ok());
}

}  // namespace
}  // namespace mooncake::te::efa
