#include "transfer_engine/transport/device_ipc/handle_hex.h"

namespace mooncake::te::device_ipc {
namespace {

int Digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string HandleToHex(std::string_view handle) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(handle.size() * 2);
  for (unsigned char c : handle) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

StatusOr<std::string> HandleFromHex(std::string_view hex) {
  if (hex.empty() || hex.size() % 2 != 0 || hex.size() / 2 > kMaxHandleBytes) {
    return Status(ErrorCode::kMalformedJson, "shm_name must be 2 to " +
                                                 std::to_string(2 * kMaxHandleBytes) +
                                                 " hex digits, an even count (got " + std::to_string(hex.size()) + ")");
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = Digit(hex[2 * i]), lo = Digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return Status(ErrorCode::kMalformedJson,
                    "shm_name has a non-hex character at " + std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
    }
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace mooncake::te::device_ipc
