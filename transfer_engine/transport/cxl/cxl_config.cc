#include "transfer_engine/transport/cxl/cxl_config.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mooncake::te::cxl {

CxlConfig CxlConfig::From(const TransportOptions& o) {
  CxlConfig c;
  c.dev_path = o.String("dev_path", "MC_CXL_DEV_PATH");
  c.dev_size = static_cast<uint64_t>(o.Int("dev_size", "MC_CXL_DEV_SIZE", 0, 0, 1LL << 50));
  c.flush = o.Bool("flush", "MC_CXL_FLUSH", c.flush);
  c.slice_size = static_cast<size_t>(o.Int("slice_size", "MC_CXL_SLICE_SIZE", c.slice_size, 4096, 1LL << 32));
  c.threads = static_cast<int>(o.Int("threads", "MC_CXL_THREADS", c.threads, 1, 64));
  return c;
}

TransportProbe ProbeCxl() {
  const char* path = getenv("MC_CXL_DEV_PATH");
  if (path == nullptr || *path == '\0') {
    return {false, "no CXL device configured (set MC_CXL_DEV_PATH to /dev/daxX.Y or a shared file, with "
                   "MC_CXL_DEV_SIZE for a file)"};
  }
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return {false, std::string("MC_CXL_DEV_PATH ") + path + ": " + strerror(errno)};
  close(fd);
  return {true, ""};
}

}  // namespace mooncake::te::cxl
