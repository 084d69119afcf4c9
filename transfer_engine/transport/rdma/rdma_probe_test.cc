// The plugin on this host's real libibverbs (Debian's, no RDMA device and no rdma_rxe in the kernel): it loads,
// and its probe and Start say "no RDMA device" with libibverbs' reason; an engine asked for "rdma" fails with it.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <string>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/rdma/rdma_transport.h"
#include "transfer_engine/transport/rdma/verbs_api.h"

namespace mooncake::te::rdma {
namespace {

const bool kNoFake = [] {
  unsetenv("MC_RDMA_FAKE_LIBRARY");
  return true;
}();

TEST(RdmaProbeTest, RealLibibverbsLoadsAndFindsNoDevice) {
  std::string why;
  const VerbsApi* api = LoadVerbsApi(&why);
  if (api == nullptr) {
    // A host without libibverbs.so.1: the probe says that instead.
    TransportProbe p = ProbeRdma();
    EXPECT_FALSE(p.usable);
    EXPECT_NE(p.reason.find("libibverbs"), std::string::npos) << p.reason;
    GTEST_SKIP() << "libibverbs.so.1 is not installed: " << why;
  }
  EXPECT_FALSE(api->is_fake());
  EXPECT_NE(api->post_send, nullptr);
  EXPECT_NE(api->poll_cq, nullptr);
  int n = -1;
  ibv_device** list = api->get_device_list(&n);
  if (list != nullptr && n > 0) {
    api->free_device_list(list);
    GTEST_SKIP() << "this host has RDMA devices";
  }
  if (list) api->free_device_list(list);
  TransportProbe p = ProbeRdma();
  EXPECT_FALSE(p.usable);
  EXPECT_NE(p.reason.find("no RDMA device"), std::string::npos) << p.reason;
  // Which device-memory paths exist: dma-buf when this libibverbs exports ibv_reg_dmabuf_mr (v34+), peer memory
  // when the kernel has a peer-memory client (never on this machine).
  EXPECT_NE(p.reason.find(api->reg_dmabuf_mr ? "dma-buf: available" : "dma-buf: unavailable"), std::string::npos)
      << p.reason;
  ASSERT_NE(api->peer_memory, nullptr);
  EXPECT_NE(p.reason.find(api->peer_memory() ? "peer memory: available" : "peer memory: unavailable"),
            std::string::npos)
      << p.reason;

  RdmaTransport t;
  TransportContext ctx;
  Status st = t.Start(ctx);
  EXPECT_EQ(st.code(), ErrorCode::kDeviceNotFound) << st.ToString();
  EXPECT_NE(st.message().find("no RDMA device"), std::string::npos) << st.ToString();
}

TEST(RdmaProbeTest, AnEngineAskedForRdmaFailsWithTheReason) {
  int n = 0;
  std::string why;
  const VerbsApi* api = LoadVerbsApi(&why);
  if (api) {
    ibv_device** list = api->get_device_list(&n);
    if (list) api->free_device_list(list);
    if (n > 0) GTEST_SKIP() << "this host has RDMA devices";
  }
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "rdma";
  auto e = TransferEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find(api ? "no RDMA device" : "libibverbs"), std::string::npos)
      << e.status().ToString();
}

// The memory_peers interface without a registered client pins nothing: only a client entry (or nvidia_peermem)
// means ibv_reg_mr takes device pointers.
TEST(RdmaProbeTest, PeerMemoryNeedsALoadedClientNotJustTheInterface) {
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string root = std::string(tmp ? tmp : "/tmp") + "/sysfs_peermem";
  for (const std::string& d : {root, root + "/kernel", root + "/kernel/mm", root + "/module"}) mkdir(d.c_str(), 0755);
  EXPECT_FALSE(PeerMemoryClientLoaded(root)) << "no interface, no module";
  ASSERT_EQ(mkdir((root + "/kernel/mm/memory_peers").c_str(), 0755), 0);
  EXPECT_FALSE(PeerMemoryClientLoaded(root)) << "the interface alone has no client";
  ASSERT_EQ(mkdir((root + "/kernel/mm/memory_peers/nv_mem").c_str(), 0755), 0);
  EXPECT_TRUE(PeerMemoryClientLoaded(root));
  rmdir((root + "/kernel/mm/memory_peers/nv_mem").c_str());
  ASSERT_EQ(mkdir((root + "/module/nvidia_peermem").c_str(), 0755), 0);
  EXPECT_TRUE(PeerMemoryClientLoaded(root));
}

}  // namespace
}  // namespace mooncake::te::rdma
