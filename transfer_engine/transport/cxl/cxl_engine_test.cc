// allocate_managed_buffer through the engine when cxl is the preferred protocol: ranges carved from the device,
// disjoint between engines, registered with their device offset, freed again.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/cxl/cxl_device.h"

namespace mooncake::te::cxl {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSize = 64 * kMiB;

class CxlEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/dev/shm/mc-cxl-engine-test-XXXXXX";
    int fd = mkstemp(path_.data());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, kSize), 0);
    close(fd);
    setenv("MC_CXL_DEV_PATH", path_.c_str(), 1);
    setenv("MC_CXL_DEV_SIZE", std::to_string(kSize).c_str(), 1);
  }
  void TearDown() override {
    unsetenv("MC_CXL_DEV_PATH");
    unlink(path_.c_str());
  }
  std::unique_ptr<TransferEngine> Engine(const std::string& protocol = "cxl") {
    EngineOptions o;
    o.local_server_name = "127.0.0.1";
    o.protocol = protocol;
    auto e = TransferEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e.value()) : nullptr;
  }
  std::string path_;
};

TEST_F(CxlEngineTest, ManagedBuffersAreDisjointRangesOfTheDevice) {
  auto a = Engine(), b = Engine();
  ASSERT_TRUE(a && b);
  auto pa = a->AllocateManaged(3 * kMiB);
  auto pb = b->AllocateManaged(kMiB);
  ASSERT_TRUE(pa.ok() && pb.ok()) << pa.status().ToString() << pb.status().ToString();
  auto on_device = a->AllocateManaged(kMiB, 0);  // the shared device's memory is on no accelerator
  EXPECT_EQ(on_device.status().code(), ErrorCode::kInvalidArgument) << on_device.status().ToString();
  auto dev = CxlDevice::Open(path_, kSize);
  ASSERT_TRUE(dev.ok());
  auto all = (*dev)->Allocations();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].tag, a->segment_name());
  EXPECT_EQ(all[1].tag, b->segment_name());
  EXPECT_GE(all[1].offset, all[0].offset + 3 * kMiB);  // disjoint
  EXPECT_TRUE(b->IsRegistered(*pb, kMiB));
  // a writes into b's managed buffer; b sees it in its memory, and so does anyone mapping the device.
  std::vector<char> src(kMiB, 'm');
  ASSERT_TRUE(a->RegisterMemory(src.data(), src.size()).ok());
  auto h = a->OpenSegment(b->segment_name());
  ASSERT_TRUE(h.ok());
  TransferRequest r{OpCode::kWrite, src.data(), *h, reinterpret_cast<uint64_t>(*pb), kMiB};
  Status st = a->TransferSync({r}, std::chrono::seconds(10));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(memcmp(*pb, src.data(), kMiB), 0);
  EXPECT_EQ(memcmp((*dev)->base() + all[1].offset, src.data(), kMiB), 0);
  EXPECT_NE(a->StatsJson().find("\"cxl\""), std::string::npos);
  EXPECT_EQ(b->FreeManaged(*pb, 2 * kMiB).code(), ErrorCode::kInvalidArgument);  // wrong length
  ASSERT_TRUE(b->FreeManaged(*pb, kMiB).ok());
  EXPECT_FALSE(b->IsRegistered(*pb, kMiB));
  EXPECT_EQ((*dev)->Allocations().size(), 1u);
  a.reset();  // a stopping frees what it allocated
  EXPECT_TRUE((*dev)->Allocations().empty());
}

TEST_F(CxlEngineTest, OtherProtocolsKeepTheEnginesAllocator) {
  auto e = Engine("tcp");  // cxl installed too, but not preferred
  ASSERT_TRUE(e);
  auto p = e->AllocateManaged(kMiB);
  ASSERT_TRUE(p.ok());
  auto dev = CxlDevice::Open(path_, kSize);
  ASSERT_TRUE(dev.ok());
  EXPECT_TRUE((*dev)->Allocations().empty());
  EXPECT_TRUE(e->FreeManaged(*p, kMiB).ok());
}

TEST_F(CxlEngineTest, UnconfiguredCxlIsAClearError) {
  unsetenv("MC_CXL_DEV_PATH");
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.protocol = "cxl";
  auto e = TransferEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("MC_CXL_DEV_PATH"), std::string::npos) << e.status().message();
  o.protocol = "tcp";
  auto plain = TransferEngine::Create(o);  // cxl unusable, skipped: other engines are undisturbed
  ASSERT_TRUE(plain.ok());
  for (const auto& t : (*plain)->InstalledTransports()) EXPECT_NE(t, "cxl");
}

}  // namespace
}  // namespace mooncake::te::cxl
