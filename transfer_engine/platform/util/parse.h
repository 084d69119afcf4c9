#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_PARSE_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_PARSE_H_

#include <cstdint>
#include <string_view>

namespace mooncake::te::platform_util {

/// A whole unsigned decimal number (digits only: no sign, no spaces) no greater than `max`; false (out untouched)
/// otherwise. For the fields of IPC handle strings, which other processes write.
bool ParseDecimal(std::string_view s, uint64_t max, uint64_t* out);
/// As ParseDecimal, into an int (0 to INT_MAX).
bool ParseDecimalInt(std::string_view s, int* out);

}  // namespace mooncake::te::platform_util

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_PARSE_H_
