#include "transfer_engine/platform/host_emulation/emulation_handle.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "transfer_engine/platform/util/parse.h"

namespace mooncake::te::host_emulation {
namespace {

constexpr std::string_view kPrefix = "mc-host-emulation-ipc:v1:";


Status Bad(std::string_view text, const char* why) {
  std::string shown(text.substr(0, 120));
  return InvalidArgument("not a host-emulation IPC handle (" + std::string(why) + "): \"" + shown +
                         (text.size() > 120 ? "...\"" : "\""));
}

}  // namespace

std::string EmulationHandle::Encode() const {
  return std::string(kPrefix) + std::to_string(pid) + ":" + std::to_string(fd) + ":" + std::to_string(serial) + ":" +
         std::to_string(offset) + ":" + std::to_string(length) + ":" + std::to_string(device);
}

StatusOr<EmulationHandle> EmulationHandle::Decode(std::string_view text) {
  if (text.substr(0, kPrefix.size()) != kPrefix) return Bad(text, "wrong prefix");
  std::vector<std::string_view> fields;
  std::string_view rest = text.substr(kPrefix.size());
  while (true) {
    size_t colon = rest.find(':');
    fields.push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) break;
    rest = rest.substr(colon + 1);
  }
  if (fields.size() != 6) return Bad(text, "expected the fields pid:fd:serial:offset:length:device");
  EmulationHandle h;
  if (!platform_util::ParseDecimalInt(fields[0], &h.pid) || h.pid <= 0) return Bad(text, "bad pid");
  if (!platform_util::ParseDecimalInt(fields[1], &h.fd)) return Bad(text, "bad fd");
  if (!platform_util::ParseDecimal(fields[2], UINT64_MAX, &h.serial)) return Bad(text, "bad serial");
  if (!platform_util::ParseDecimal(fields[3], UINT64_MAX, &h.offset)) return Bad(text, "bad offset");
  if (!platform_util::ParseDecimal(fields[4], UINT64_MAX, &h.length) || h.length == 0) return Bad(text, "bad length");
  if (h.offset + h.length < h.offset) return Bad(text, "offset + length overflows");
  if (!platform_util::ParseDecimalInt(fields[5], &h.device)) return Bad(text, "bad device");
  return h;
}

std::string MemfdName(int device, uint64_t serial) {
  return "mc-host-emulation-cuda" + std::to_string(device) + "-" + std::to_string(serial);
}

}  // namespace mooncake::te::host_emulation
