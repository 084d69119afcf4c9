#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_ENV_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_ENV_H_

// Sets up a test process (and the processes it starts) to use the FAKE verbs provider: MC_RDMA_FAKE_LIBRARY
// names the runfiles' libfake_ibverbs.so, MC_RDMA_FAKE_STATE a fresh directory under TEST_TMPDIR, and
// MC_PLUGIN_DIR the folder of libmc_transport_rdma.so. Call before any engine is created (static
// initialisation). Returns the state directory.

#include <stdlib.h>

#include <string>

namespace mooncake::te::rdma::fake {

inline std::string UseFakeVerbs(const char* devices = nullptr) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  const char* tmp = getenv("TEST_TMPDIR");
  std::string dir = std::string(srcdir ? srcdir : ".") + "/" + (workspace ? workspace : "") +
                    "/transfer_engine/transport/rdma";
  setenv("MC_PLUGIN_DIR", dir.c_str(), 1);
  setenv("MC_RDMA_FAKE_LIBRARY", (dir + "/testing/libfake_ibverbs.so").c_str(), 1);
  std::string state = std::string(tmp ? tmp : "/tmp") + "/rdma_fake_state";
  setenv("MC_RDMA_FAKE_STATE", state.c_str(), 1);
  if (devices) setenv("MC_RDMA_FAKE_DEVICES", devices, 1);
  if (!getenv("MC_RDMA_FAKE_RETRY_MS")) setenv("MC_RDMA_FAKE_RETRY_MS", "300", 1);
  return state;
}

}  // namespace mooncake::te::rdma::fake

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_ENV_H_
