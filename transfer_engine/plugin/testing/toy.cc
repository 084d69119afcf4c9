// The good toy plugin: transport "toy" (protocols "toy", "toy_alias"), usable only with MC_TOY_DEVICE set.
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/plugin/testing/toy_transport.h"

namespace mooncake::te::testing {
namespace {

struct Toy : ToyTransport {
  Toy() : ToyTransport("toy") {}
};

}  // namespace

MC_TRANSPORT_PLUGIN("toy", Toy, {"toy", "toy_alias"}, "MC_TOY_ONLY", ProbeToyDevice);

}  // namespace mooncake::te::testing
