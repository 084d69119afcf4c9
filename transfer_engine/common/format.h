#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_FORMAT_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_FORMAT_H_

#include <cstdint>
#include <sstream>
#include <string>

namespace mooncake::te {

/// "0x1f00": addresses in messages.
inline std::string Hex(uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

/// "[0x1000, +4096)": a range in messages.
inline std::string Range(uint64_t addr, uint64_t length) {
  return "[" + Hex(addr) + ", +" + std::to_string(length) + ")";
}

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_FORMAT_H_
