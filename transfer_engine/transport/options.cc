#include "transfer_engine/transport/options.h"

#include <cstdlib>

#include "transfer_engine/common/env.h"
#include "transfer_engine/common/log.h"

namespace mooncake::te {

TransportOptions::TransportOptions(const std::string& transport, const std::map<std::string, std::string>& all)
    : transport_(transport) {
  const std::string prefix = transport + ".";
  for (const auto& [key, value] : all) {
    if (key.compare(0, prefix.size(), prefix) == 0) entries_[key.substr(prefix.size())] = value;
  }
}

bool TransportOptions::Lookup(const std::string& key, const char* env, std::string* value, std::string* source) const {
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    *value = it->second;
    *source = "option " + transport_ + "." + key;
    return true;
  }
  if (env != nullptr) {
    const char* v = getenv(env);
    if (v != nullptr && *v != '\0') {
      *value = v;
      *source = env;
      return true;
    }
  }
  return false;
}

long long TransportOptions::Int(const std::string& key, const char* env, long long fallback, long long min,
                                long long max) const {
  std::string text, source;
  if (!Lookup(key, env, &text, &source)) return fallback;
  long long x;
  if (ParseBoundedInt(text, min, max, &x)) return x;
  MC_LOG(kWarning) << "ignoring " << source << "='" << text << "': expected an integer in [" << min << ", " << max
                   << "]; using " << fallback;
  return fallback;
}

bool TransportOptions::Bool(const std::string& key, const char* env, bool fallback) const {
  std::string text, source;
  if (!Lookup(key, env, &text, &source)) return fallback;
  return ParseFlag(text);
}

std::string TransportOptions::String(const std::string& key, const char* env, const std::string& fallback) const {
  std::string text, source;
  return Lookup(key, env, &text, &source) ? text : fallback;
}

}  // namespace mooncake::te
