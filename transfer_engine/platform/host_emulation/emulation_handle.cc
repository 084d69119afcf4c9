#include "transfer_engine/platform/host_emulation/emulation_handle.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "transfer_engine/platform/util/parse.h"

namespace mooncake::te::host_emulation {
namespace {

constexpr std::string_view kPrefix = "mc-host-emulation-ipc:v1:";


Status Bad(std::string_view text, const char* why, const char* what = "IPC") {
  std::string shown(text.substr(0, 120));
  return InvalidArgument("not a host-emulation " + std::string(what) + " handle (" + std::string(why) + "): \"" +
                         shown + (text.size() > 120 ? "...\"" : "\""));
}

// The colon-separated fields after `prefix`; false when the prefix differs.
bool SplitFields(std::string_view text, std::string_view prefix, std::vector<std::string_view>* fields) {
  if (text.substr(0, prefix.size()) != prefix) return false;
  std::string_view rest = text.substr(prefix.size());
  while (true) {
    size_t colon = rest.find(':');
    fields->push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) return true;
    rest = rest.substr(colon + 1);
  }
}

constexpr std::string_view kFabricHandlePrefix = "mc-host-emulation-fabric:v1:";

}  // namespace

std::string EmulationHandle::Encode() const {
  return std::string(kPrefix) + std::to_string(pid) + ":" + std::to_string(fd) + ":" + std::to_string(serial) + ":" +
         std::to_string(offset) + ":" + std::to_string(length) + ":" + std::to_string(device);
}

StatusOr<EmulationHandle> EmulationHandle::Decode(std::string_view text) {
  std::vector<std::string_view> fields;
  if (!SplitFields(text, kPrefix, &fields)) return Bad(text, "wrong prefix");
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

std::string MemfdName(const std::string& type, int device, uint64_t serial) {
  return "mc-host-emulation-" + type + std::to_string(device) + "-" + std::to_string(serial);
}

std::string EmulationFabricHandle::Encode() const {
  return std::string(kFabricHandlePrefix) + type + ":" + name + ":" + std::to_string(offset) + ":" +
         std::to_string(length) + ":" + std::to_string(device);
}

StatusOr<EmulationFabricHandle> EmulationFabricHandle::Decode(std::string_view text) {
  std::vector<std::string_view> f;
  if (!SplitFields(text, kFabricHandlePrefix, &f)) return Bad(text, "wrong prefix", "fabric");
  if (f.size() != 5) return Bad(text, "expected the fields type:name:offset:length:device", "fabric");
  EmulationFabricHandle h;
  h.type = std::string(f[0]);
  if (h.type != "cuda" && h.type != "rocm") return Bad(text, "bad memory type", "fabric");
  const std::string_view prefix = kFabricPrefix;
  if (f[1].size() <= prefix.size() || f[1].size() > 200 || f[1].substr(0, prefix.size()) != prefix) {
    return Bad(text, "bad file name", "fabric");
  }
  for (char c : f[1]) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '-')) return Bad(text, "bad file name", "fabric");
  }
  h.name = std::string(f[1]);
  if (!platform_util::ParseDecimal(f[2], UINT64_MAX, &h.offset)) return Bad(text, "bad offset", "fabric");
  if (!platform_util::ParseDecimal(f[3], UINT64_MAX, &h.length) || h.length == 0) {
    return Bad(text, "bad length", "fabric");
  }
  if (h.offset + h.length < h.offset) return Bad(text, "offset + length overflows", "fabric");
  if (!platform_util::ParseDecimalInt(f[4], &h.device) || h.device < 0) return Bad(text, "bad device", "fabric");
  return h;
}

}  // namespace mooncake::te::host_emulation
