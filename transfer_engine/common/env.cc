#include "transfer_engine/common/env.h"

#include <cstdlib>
#include <strings.h>

#include "transfer_engine/common/log.h"

namespace mooncake::te {

bool ParseBoundedInt(const std::string& text, long long min, long long max, long long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long x = strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || x < min || x > max) return false;
  *out = x;
  return true;
}

bool ParseFlag(const std::string& s) {
  for (const char* no : {"", "0", "false", "no", "off"}) {
    if (strcasecmp(s.c_str(), no) == 0) return false;
  }
  return true;
}

bool EnvInt(const char* name, long long min, long long max, long long* out) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return false;
  if (ParseBoundedInt(v, min, max, out)) return true;
  MC_LOG(kWarning) << "ignoring " << name << "='" << v << "': expected an integer in [" << min << ", " << max << "]";
  return false;
}

bool EnvFlag(const char* name) {
  const char* v = getenv(name);
  return v != nullptr && ParseFlag(v);
}

std::string EnvString(const char* name) {
  const char* v = getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace mooncake::te
