#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_CONFIG_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_CONFIG_H_

#include <cstddef>
#include <string>
#include <vector>

#include "transfer_engine/transport/options.h"

namespace mooncake::te::file {

/// The file transport's settings: option "file.<key>" of EngineOptions::transport_options, else the MC_FILE_*
/// variable, else the default. Plain value type.
struct FileConfig {
  unsigned queue_depth = 64;     ///< queue_depth / MC_FILE_QUEUE_DEPTH: submissions in flight per ring (1..4096)
  bool direct = true;            ///< direct / MC_FILE_DIRECT: open files O_DIRECT where the file system allows
  size_t slice_size = 1 << 20;   ///< slice_size / MC_FILE_SLICE_SIZE: bytes per slice (4 KiB..64 MiB)
  /// allowed_dirs / MC_FILE_ALLOWED_DIRS: ':'-separated directories the paths of a descriptor must lie under
  /// (after resolving symlinks); empty: none (a descriptor names paths on this host: only allowed ones open).
  std::vector<std::string> allowed_dirs;
  /// local_name / MC_FILE_LOCAL_NAME: the key this host is known by in local_path_map (tried first; then the
  /// engine's segment name, its host part and the host name).
  std::string local_name;
  /// cufile_lib / MC_CUFILE_LIB: the cuFile library for GPU memory (GDS), a soname or a path.
  std::string cufile_lib = "libcufile.so.0";

  static FileConfig From(const TransportOptions& options);
};

}  // namespace mooncake::te::file

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_CONFIG_H_
