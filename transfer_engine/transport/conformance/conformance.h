#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_CONFORMANCE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "transfer_engine/api/engine.h"

namespace mooncake::te::conformance {

/// How a transport is brought into play for the shared suite: two engines in this process configured so
/// that every transfer between them goes through the transport under test.
struct TransportUnderTest {
  std::string name;                     ///< the transport's registry name; its Stats() must show the traffic
  std::function<void(EngineOptions&)> configure;
  ErrorCode withdrawn_memory_error;     ///< what a transfer into memory the target unregistered reports
};

/// The suite every transport runs (transport_conformance.cc). Instantiate it from the transport's own test:
///   INSTANTIATE_TEST_SUITE_P(Tcp, TransportConformanceTest, ::testing::Values(TransportUnderTest{...}),
///                            ConformanceName);
class TransportConformanceTest : public ::testing::TestWithParam<TransportUnderTest> {};

std::string ConformanceName(const ::testing::TestParamInfo<TransportUnderTest>& info);

}  // namespace mooncake::te::conformance

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_CONFORMANCE_H_
