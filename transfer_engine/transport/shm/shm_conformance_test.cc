#include "transfer_engine/transport/conformance/conformance.h"

namespace mooncake::te::conformance {
namespace {

TransportUnderTest Shm() {
  TransportUnderTest t;
  t.name = "shm";
  t.only_this_transport = false;  // the default set: the engine picks shm between engines of one host
  t.same_host = true;
  t.remote_hosts = false;
  // The shared registration epoch moved on (kStaleMetadata, kRefreshPeer); the engine's refresh then finds the
  // range gone from the target's descriptor.
  t.withdrawn_memory_error = ErrorCode::kAddressNotRegistered;
  return t;
}

INSTANTIATE_TEST_SUITE_P(Shm, TransportConformanceTest, ::testing::ValuesIn(ConformanceCases(Shm())),
                         ConformanceName);

}  // namespace
}  // namespace mooncake::te::conformance
