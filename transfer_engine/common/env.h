#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_ENV_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_ENV_H_

#include <string>

namespace mooncake::te {

/// Parses a whole decimal integer within [min, max]; false (out untouched) otherwise.
bool ParseBoundedInt(const std::string& text, long long min, long long max, long long* out);
/// False for "", "0", "false", "no", "off" (any case); true otherwise.
bool ParseFlag(const std::string& text);

/// Environment readers: false / empty when unset; a malformed integer is ignored with a warning naming the
/// variable and the accepted range.
bool EnvInt(const char* name, long long min, long long max, long long* out);
bool EnvFlag(const char* name);
std::string EnvString(const char* name);

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_ENV_H_
