#include "transfer_engine/transport/conformance/conformance.h"

namespace mooncake::te::conformance {

INSTANTIATE_TEST_SUITE_P(Tcp, TransportConformanceTest,
                         ::testing::Values(TransportUnderTest{
                             "tcp", [](EngineOptions& o) { o.config.force_tcp = true; },
                             ErrorCode::kRemoteRejected}),  // the target's listener refuses the range
                         ConformanceName);

}  // namespace mooncake::te::conformance
