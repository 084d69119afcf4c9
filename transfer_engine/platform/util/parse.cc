#include "transfer_engine/platform/util/parse.h"

#include <limits>

namespace mooncake::te::platform_util {

bool ParseDecimal(std::string_view s, uint64_t max, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (max - d) / 10 || v * 10 + d > max) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool ParseDecimalInt(std::string_view s, int* out) {
  uint64_t v = 0;
  if (!ParseDecimal(s, static_cast<uint64_t>(std::numeric_limits<int>::max()), &v)) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace mooncake::te::platform_util
