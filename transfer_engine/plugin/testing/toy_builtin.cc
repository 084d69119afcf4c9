// Transport "toy_builtin" (no probe: always usable). Linked into the loader's test, its .so must be refused there
// (a linked-in plugin of the same name wins).
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/plugin/testing/toy_transport.h"

namespace mooncake::te::testing {
namespace {

struct ToyBuiltin : ToyTransport {
  ToyBuiltin() : ToyTransport("toy_builtin") {}
};

}  // namespace

MC_TRANSPORT_PLUGIN("toy_builtin", ToyBuiltin, {}, "", nullptr);

}  // namespace mooncake::te::testing
