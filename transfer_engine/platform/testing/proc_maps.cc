#include "transfer_engine/platform/testing/proc_maps.h"

#include <cstdio>
#include <fstream>

namespace mooncake::te::testing {

std::vector<MapEntry> ProcSelfMaps() {
  std::vector<MapEntry> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0;
    char mode[8] = {};
    int path_at = 0;
    if (sscanf(line.c_str(), "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, mode, &path_at) < 3) continue;
    out.push_back({lo, hi, mode, path_at > 0 ? line.substr(static_cast<size_t>(path_at)) : std::string()});
  }
  return out;
}

std::string MapsPermissions(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (const MapEntry& m : ProcSelfMaps()) {
    if (at >= m.lo && at < m.hi) return m.perms;
  }
  return "";
}

}  // namespace mooncake::te::testing
