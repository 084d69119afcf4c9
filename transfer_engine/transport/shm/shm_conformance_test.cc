#include "transfer_engine/transport/conformance/conformance.h"

namespace mooncake::te::conformance {

// Two engines in one process share a host: the same-host transport carries everything.
INSTANTIATE_TEST_SUITE_P(Shm, TransportConformanceTest,
                         ::testing::Values(TransportUnderTest{
                             "shm", [](EngineOptions&) {},
                             ErrorCode::kStaleMetadata}),  // the shared registration epoch moved on
                         ConformanceName);

}  // namespace mooncake::te::conformance
