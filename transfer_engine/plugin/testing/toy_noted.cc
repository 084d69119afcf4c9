// Transport "toy_noted": always usable, and its probe says so with a summary (as efa's "FI_HMEM ..."), which the
// loader must keep for plugins().
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/plugin/testing/toy_transport.h"

namespace mooncake::te::testing {
namespace {

struct ToyNoted : ToyTransport {
  ToyNoted() : ToyTransport("toy_noted") {}
};

TransportProbe ProbeNoted() { return TransportProbe{true, "FI_HMEM: toy device memory via dma-buf"}; }

}  // namespace

MC_TRANSPORT_PLUGIN("toy_noted", ToyNoted, {"toy_noted"}, "", ProbeNoted);

}  // namespace mooncake::te::testing
