// Tests only: paths of files in the test's runfiles tree.
#pragma once

#include <string>

namespace mooncake::te::testing {

/// The file at workspace-relative `rel`: resolved from the working directory (bazel runs a test in its runfiles
/// root), else under $TEST_SRCDIR/mooncake_monorepo.
std::string Runfile(const std::string& rel);

/// The FAKE CUDA driver of //transfer_engine/platform/cuda/testing (`v1`: the form exporting only the CUDA 11.3
/// cuGetProcAddress); the test must carry it as data.
std::string FakeCudaDriver(bool v1 = false);

}  // namespace mooncake::te::testing
