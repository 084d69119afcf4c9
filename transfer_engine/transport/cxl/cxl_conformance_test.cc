// The shared conformance suite over a file standing in for a CXL device (MC_CXL_TEST_DIR: /dev/shm or /tmp,
// one test binary each). Both engines, and the target's buffer, map the same file MAP_SHARED.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "transfer_engine/transport/conformance/conformance.h"

namespace mooncake::te::conformance {
namespace {

constexpr uint64_t kDeviceSize = 64 << 20;

// A fresh device file for this test process, removed at exit; MC_CXL_DEV_PATH names it (the child inherits it).
const std::string& DevicePath() {
  static const std::string path = [] {
    std::string tmpl = std::string(MC_CXL_TEST_DIR) + "/mc-cxl-conformance-XXXXXX";
    int fd = mkstemp(tmpl.data());
    if (fd < 0 || ftruncate(fd, kDeviceSize) != 0) abort();
    close(fd);
    setenv("MC_CXL_DEV_PATH", tmpl.c_str(), 1);
    setenv("MC_CXL_DEV_SIZE", std::to_string(kDeviceSize).c_str(), 1);
    static std::string remove_at_exit;
    remove_at_exit = tmpl;
    atexit([] { unlink(remove_at_exit.c_str()); });
    return tmpl;
  }();
  return path;
}

TransportUnderTest Cxl() {
  TransportUnderTest t;
  t.name = "cxl";
  t.only_this_transport = true;
  t.same_host = true;
  t.remote_hosts = true;  // another PID namespace mapping the same file
  // The target's slot epoch moved on (kStaleMetadata, kRefreshPeer); the refreshed descriptor lacks the range.
  t.withdrawn_memory_error = ErrorCode::kAddressNotRegistered;
  t.target_buffer_file = DevicePath();
  t.target_buffer_offset = 8 << 20;
  t.configure = [](EngineOptions& o) {
    o.transport_options["cxl.dev_path"] = DevicePath();
    o.transport_options["cxl.dev_size"] = std::to_string(kDeviceSize);
  };
  return t;
}

INSTANTIATE_TEST_SUITE_P(Cxl, TransportConformanceTest, ::testing::ValuesIn(ConformanceCases(Cxl())),
                         ConformanceName);

}  // namespace
}  // namespace mooncake::te::conformance
