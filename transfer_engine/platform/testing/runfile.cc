#include "transfer_engine/platform/testing/runfile.h"

#include <climits>
#include <cstdlib>

namespace mooncake::te::testing {

std::string Runfile(const std::string& rel) {
  char resolved[PATH_MAX];
  if (realpath(rel.c_str(), resolved) != nullptr) return resolved;
  const char* srcdir = getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/mooncake_monorepo/" + rel;
}

std::string FakeCudaDriver(bool v1) {
  return Runfile(v1 ? "transfer_engine/platform/cuda/testing/libfake_cuda_driver_v1.so"
                    : "transfer_engine/platform/cuda/testing/libfake_cuda_driver.so");
}

}  // namespace mooncake::te::testing
