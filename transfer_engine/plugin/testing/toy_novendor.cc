// Transport "toy_novendor": a good plugin whose .so NEEDs libmc_missing_vendor.so.1, a library that exists only
// at link time (missing_vendor_stub.cc), so dlopen of the installed .so fails the way a missing vendor library
// would.
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/plugin/testing/toy_transport.h"

namespace mooncake::te::testing {
namespace {

struct ToyNoVendor : ToyTransport {
  ToyNoVendor() : ToyTransport("toy_novendor") {}
};

}  // namespace

MC_TRANSPORT_PLUGIN("toy_novendor", ToyNoVendor, {}, "", nullptr);

}  // namespace mooncake::te::testing
