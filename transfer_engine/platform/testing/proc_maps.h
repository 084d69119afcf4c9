// Tests only: this process's mappings as /proc/self/maps lists them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mooncake::te::testing {

struct MapEntry {
  uintptr_t lo = 0, hi = 0;  ///< [lo, hi)
  std::string perms;         ///< e.g. "rw-s", "r--p"
  std::string path;          ///< the mapped file ("" for anonymous memory)
};

/// Every mapping of this process (empty when /proc/self/maps cannot be read).
std::vector<MapEntry> ProcSelfMaps();

/// The permissions of the mapping holding `p` ("" when none).
std::string MapsPermissions(const void* p);

}  // namespace mooncake::te::testing
