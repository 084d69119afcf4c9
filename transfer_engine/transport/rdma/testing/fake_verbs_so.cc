// libfake_ibverbs.so: the FAKE verbs provider (fake_verbs.h) as a shared object the rdma transport loads in place
// of libibverbs.so.1 when a test sets MC_RDMA_FAKE_LIBRARY to its path. Exports only mc_fake_verbs_api_v1.

#include "transfer_engine/transport/rdma/testing/fake_verbs.h"

extern "C" __attribute__((visibility("default"))) const mooncake::te::rdma::VerbsApi* mc_fake_verbs_api_v1(
    size_t struct_size) {
  if (struct_size != sizeof(mooncake::te::rdma::VerbsApi)) return nullptr;
  return mooncake::te::rdma::fake::FakeVerbs();
}
