// The conformance suite over one libfabric provider, named at compile time by EFA_TEST_PROVIDER (BUILD.bazel
// builds this file once per provider, once more with EFA_TEST_MAX_MR_SIZE: every region registered in chunks,
// and once with EFA_TEST_TWO_NICS: two NICs per engine, slices striped over both). The test process links the transport (InProcess); the target of the
// TwoProcess mode (conformance_peer) loads libmc_transport_efa.so from MC_PLUGIN_DIR, set here to the .so's
// runfiles folder, so both forms of the plugin run.

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstdlib>
#include <string>

#include "transfer_engine/transport/conformance/conformance.h"

#ifndef EFA_TEST_PROVIDER
#error "EFA_TEST_PROVIDER must name a libfabric provider"
#endif

namespace mooncake::te::conformance {
namespace {

// Runs at static initialisation, before the suite's cases are made and before any engine loads plugins.
bool SetUpEnvironment() {
  setenv("FI_PROVIDER", EFA_TEST_PROVIDER, 1);
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir && workspace) {
    std::string dir = std::string(srcdir) + "/" + workspace + "/transfer_engine/transport/efa";
    setenv("MC_PLUGIN_DIR", dir.c_str(), 1);
  }
  return true;
}
const bool kEnvironment = SetUpEnvironment();

#ifdef EFA_TEST_TWO_NICS
// "lo,<the first other IPv4 interface that is up>": two NICs, both reaching this host; "lo" alone where the
// host has no other interface.
std::string TwoNics() {
  std::string filter = "lo";
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return filter;
  for (struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !(i->ifa_flags & IFF_LOOPBACK)) {
      filter += std::string(",") + i->ifa_name;
      break;
    }
  }
  freeifaddrs(list);
  return filter;
}
#endif

TransportUnderTest Efa() {
  const std::string provider = EFA_TEST_PROVIDER;
  TransportUnderTest t;
  t.name = "efa";
  t.only_this_transport = true;
  t.same_host = true;
  t.remote_hosts = provider != "shm";  // shm reaches processes of this host only
  // The target's epoch moved on (kStaleMetadata, kRefreshPeer); the refreshed descriptor lacks the range.
  t.withdrawn_memory_error = ErrorCode::kAddressNotRegistered;
  t.configure = [](EngineOptions& o) {
    o.transport_options["efa.op_timeout_ms"] = "5000";
#ifdef EFA_TEST_TWO_NICS
    // Two domains per engine: slices striped over two paths (lo -> lo, ethX -> ethX).
    static const std::string nics = TwoNics();
    o.device_filter = nics;
#endif
#ifdef EFA_TEST_MAX_MR_SIZE
    // Registrations in chunks of this many bytes (not a power of two: slices cross chunks at odd places).
    o.transport_options["efa.max_mr_size"] = EFA_TEST_MAX_MR_SIZE;
#endif
  };
  if (provider == "shm") {
    t.known_failures["TargetThatVanishedFailsInBoundedTime/InProcess"] =
        "libfabric 1.17's shm provider shares one mapping of a peer's region among the endpoints of a process; "
        "once the target endpoint of this process closed, a write to it crashes inside libfabric (SIGSEGV in "
        "its region lock). Between processes the case passes";
  }
  return t;
}

INSTANTIATE_TEST_SUITE_P(Efa, TransportConformanceTest, ::testing::ValuesIn(ConformanceCases(Efa())),
                         ConformanceName);

}  // namespace
}  // namespace mooncake::te::conformance
