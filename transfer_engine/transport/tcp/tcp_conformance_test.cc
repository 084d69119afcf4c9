#include "transfer_engine/transport/conformance/conformance.h"

namespace mooncake::te::conformance {
namespace {

TransportUnderTest Tcp() {
  TransportUnderTest t;
  t.name = "tcp";
  t.only_this_transport = true;  // transports = {"tcp"}: it carries even same-host traffic
  t.same_host = true;
  t.remote_hosts = true;
  t.withdrawn_memory_error = ErrorCode::kRemoteRejected;  // the target's listener refuses the range
  t.device_memory = {MemoryType::kCuda};  // through pinned staging (the host emulation here, MC_PLATFORM_EMULATION=1)
  return t;
}

INSTANTIATE_TEST_SUITE_P(Tcp, TransportConformanceTest, ::testing::ValuesIn(ConformanceCases(Tcp())),
                         ConformanceName);

}  // namespace
}  // namespace mooncake::te::conformance
