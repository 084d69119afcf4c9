// The conformance suite over the rdma transport on the FAKE verbs provider (testing/fake_verbs.h): two fake HCAs
// on one fake host, RC semantics between processes. The test process links the transport (InProcess); the target
// of the TwoProcess mode (conformance_peer) loads libmc_transport_rdma.so from MC_PLUGIN_DIR and the fake from
// MC_RDMA_FAKE_LIBRARY, both set here, so both forms of the plugin run.

#include <stdlib.h>

#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/transport/conformance/conformance.h"
#include "transfer_engine/transport/rdma/testing/fake_env.h"

namespace mooncake::te::conformance {
namespace {

const bool kEnvironment = [] {
  rdma::fake::UseFakeVerbs("fake_mlx5_0,fake_mlx5_1");
  // "cuda" memory from the host emulation platform, registered through the fake's peer-memory path (the engine
  // hands the transport no dma-buf fd for it: the platform interface has no dma-buf export).
  setenv("MC_RDMA_FAKE_PEERMEM", "1", 1);
  PlatformRegistry::Get().Register(MakeHostEmulationPlatform(2));
  return true;
}();

TransportUnderTest Rdma() {
  TransportUnderTest t;
  t.name = "rdma";
  t.only_this_transport = true;
  t.same_host = true;
  t.remote_hosts = true;
  // The target's HCA refuses the withdrawn key (IBV_WC_REM_ACCESS_ERR, kRefreshPeer); the refreshed descriptor
  // lacks the range.
  t.withdrawn_memory_error = ErrorCode::kAddressNotRegistered;
  t.device_memory = {MemoryType::kCuda};
  return t;
}

INSTANTIATE_TEST_SUITE_P(Rdma, TransportConformanceTest, ::testing::ValuesIn(ConformanceCases(Rdma())),
                         ConformanceName);

}  // namespace
}  // namespace mooncake::te::conformance
