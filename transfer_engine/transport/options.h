#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_OPTIONS_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace mooncake::te {

/// One transport's settings: entries of EngineOptions::transport_options named "<transport>.<key>" (prefix
/// stripped), falling back to the transport's MC_* environment variable, then to the default. A malformed or
/// out-of-range value is ignored with a warning naming where it came from. Plain value type.
class TransportOptions {
 public:
  TransportOptions() = default;
  /// The entries of `all` that start with "<transport>.".
  TransportOptions(const std::string& transport, const std::map<std::string, std::string>& all);

  long long Int(const std::string& key, const char* env, long long fallback, long long min, long long max) const;
  bool Bool(const std::string& key, const char* env, bool fallback) const;
  std::string String(const std::string& key, const char* env, const std::string& fallback = "") const;
  std::chrono::milliseconds Millis(const std::string& key, const char* env, std::chrono::milliseconds fallback,
                                   long long min_ms, long long max_ms) const {
    return std::chrono::milliseconds(Int(key, env, fallback.count(), min_ms, max_ms));
  }
  const std::map<std::string, std::string>& entries() const { return entries_; }

 private:
  /// The raw text for `key` (options map first, then `env`) and where it came from; false when unset.
  bool Lookup(const std::string& key, const char* env, std::string* value, std::string* source) const;

  std::string transport_;
  std::map<std::string, std::string> entries_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_OPTIONS_H_
