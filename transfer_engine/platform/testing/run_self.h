// Tests only: runs this test binary again as a child process (a test's "other process"), with extra environment
// variables, and collects what it prints.
#pragma once

#include <string>
#include <vector>

namespace mooncake::te::testing {

struct ChildResult {
  int exit_code = -1;  ///< the child's exit status; 128 + signal when killed; -1 when it could not start
  std::string out;     ///< its stdout and stderr together (or why it could not start)
};

/// Spawns /proc/self/exe with this process's environment plus `vars` ("NAME=value") and waits for it.
ChildResult RunSelf(const std::vector<std::string>& vars);

}  // namespace mooncake::te::testing
