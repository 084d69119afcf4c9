// The fault transport with nothing to inject must be indistinguishable from the transport it wraps.
#include "transfer_engine/transport/conformance/conformance.h"
#include "transfer_engine/transport/testing/fault_transport.h"

namespace mooncake::te::conformance {
namespace {

TransportUnderTest FaultyTcp() {
  auto controller = testing::RegisterFaultTransport("faulty_tcp", "tcp");  // also registered in the peer process
  EXPECT_TRUE(controller.ok()) << controller.status().ToString();
  TransportUnderTest t;
  t.name = "faulty_tcp";
  t.only_this_transport = true;
  t.same_host = true;
  t.remote_hosts = true;
  t.withdrawn_memory_error = ErrorCode::kRemoteRejected;  // tcp's, passed through
  return t;
}

INSTANTIATE_TEST_SUITE_P(FaultyTcp, TransportConformanceTest, ::testing::ValuesIn(ConformanceCases(FaultyTcp())),
                         ConformanceName);

}  // namespace
}  // namespace mooncake::te::conformance
