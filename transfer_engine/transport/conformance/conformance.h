#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_CONFORMANCE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_CONFORMANCE_H_

// The shared transport conformance suite (Transport SDK v1). Every transport instantiates it from its own
// <name>_conformance_test.cc; the test binary needs //transfer_engine/transport/conformance (which brings the
// conformance_peer binary as data) and gtest_main:
//
//   INSTANTIATE_TEST_SUITE_P(Tcp, TransportConformanceTest,
//                            ::testing::ValuesIn(ConformanceCases(TransportUnderTest{...})), ConformanceName);
//
// Each case runs twice: `InProcess` (both engines in the test process) and `TwoProcess` (the target engine in a
// conformance_peer child process, same transport options). Test names read "<transport>_<mode>".

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/platform.h"
#include "transfer_engine/transport/conformance/target.h"

namespace mooncake::te::conformance {

/// A transport as the suite exercises it: how the engines are set up so that it carries the traffic, and what it
/// claims to do. Tests that need a capability the flags deny are skipped (GTEST_SKIP, with the reason).
struct TransportUnderTest {
  std::string name;  ///< the transport's registry name; its Stats() must show the traffic (per-path "bytes")
  /// The "only this transport" switch: both engines install only it (EngineOptions::transports = {name},
  /// protocol = name). Off: they install their default set, and the suite still asserts that this transport
  /// carried every byte (e.g. shm, which the engine prefers between engines of one host).
  bool only_this_transport = true;

  // --- capability flags (checked against the transport's own TransportCapabilities) ---
  bool same_host = true;      ///< reaches engines of other processes on this host
  bool remote_hosts = true;   ///< reaches engines of other hosts (emulated: another PID namespace)
  bool supports_notify = true;  ///< a notification sent with a batch arrives after its data
  /// Device memory kinds it moves between like kinds ((kCuda, kCuda), ...); host to host is always required.
  std::vector<MemoryType> device_memory;
  /// When not empty, the target's buffer is a MAP_SHARED mapping of this file at `target_buffer_offset` instead
  /// of anonymous memory (a transport that moves bytes through a shared device or file, e.g. cxl).
  std::string target_buffer_file;
  uint64_t target_buffer_offset = 0;

  /// What a transfer into memory the target unregistered (while the initiator's descriptor still lists it)
  /// reports.
  ErrorCode withdrawn_memory_error = ErrorCode::kRemoteRejected;
  /// Optional: adjusts both engines' options after the switch (transport options, device filter, ...). For the
  /// child process only protocol, transports, transport_options and device_filter are carried over; `config`
  /// comes from the environment.
  std::function<void(EngineOptions&)> configure;
  /// Tests this transport is known to fail, with the reason: "<test>" (both modes) or "<test>/<mode>" (e.g.
  /// "TargetThatVanishedFailsInBoundedTime/InProcess"). Skipped, saying so, unless
  /// MC_CONFORMANCE_RUN_KNOWN_FAILURES=1 runs them anyway.
  std::map<std::string, std::string> known_failures;

  bool same_host_only() const { return same_host && !remote_hosts; }
};

struct ConformanceCase {
  TransportUnderTest transport;
  PeerMode mode = PeerMode::kInProcess;
};

/// gtest's description of a case: "<name> <mode>".
void PrintTo(const ConformanceCase& c, std::ostream* os);

/// Both modes of `t`, for ::testing::ValuesIn.
std::vector<ConformanceCase> ConformanceCases(const TransportUnderTest& t);

/// "<name>_<mode>" (non-alphanumeric characters of the name become '_').
std::string ConformanceName(const ::testing::TestParamInfo<ConformanceCase>& info);

/// The options both engines of a case are created with: 127.0.0.1, P2P metadata, the switch, then `configure`.
EngineOptions ConformanceEngineOptions(const TransportUnderTest& t);

/// The suite (conformance.cc).
class TransportConformanceTest : public ::testing::TestWithParam<ConformanceCase> {
 protected:
  /// Skips a test listed in known_failures (see TransportUnderTest).
  void SetUp() override;
};

}  // namespace mooncake::te::conformance

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_CONFORMANCE_H_
