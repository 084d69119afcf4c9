#include "transfer_engine/transport/file/file_config.h"

#include <sstream>

namespace mooncake::te::file {

FileConfig FileConfig::From(const TransportOptions& options) {
  FileConfig c;
  c.queue_depth = static_cast<unsigned>(options.Int("queue_depth", "MC_FILE_QUEUE_DEPTH", c.queue_depth, 1, 4096));
  c.direct = options.Bool("direct", "MC_FILE_DIRECT", c.direct);
  c.slice_size = static_cast<size_t>(
      options.Int("slice_size", "MC_FILE_SLICE_SIZE", static_cast<long long>(c.slice_size), 4096, 64 << 20));
  std::string dirs = options.String("allowed_dirs", "MC_FILE_ALLOWED_DIRS");
  std::stringstream ss(dirs);
  for (std::string d; std::getline(ss, d, ':');) {
    if (!d.empty()) c.allowed_dirs.push_back(d);
  }
  c.local_name = options.String("local_name", "MC_FILE_LOCAL_NAME");
  std::string lib = options.String("cufile_lib", "MC_CUFILE_LIB");
  if (!lib.empty()) c.cufile_lib = lib;
  return c;
}

}  // namespace mooncake::te::file
