#include "transfer_engine/platform/cuda/cuda_ipc_handle.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "transfer_engine/platform/util/parse.h"

namespace mooncake::te::cuda {
namespace {

constexpr std::string_view kPrefix = "mc-cuda-ipc:v1:";
constexpr char kHex[] = "0123456789abcdef";


int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Status Bad(std::string_view text, const std::string& why) {
  return InvalidArgument("not a cuda IPC handle (" + why + "): \"" + std::string(text.substr(0, 200)) +
                         (text.size() > 200 ? "...\"" : "\""));
}

std::vector<std::string_view> Split(std::string_view s) {
  std::vector<std::string_view> out;
  while (true) {
    size_t colon = s.find(':');
    out.push_back(s.substr(0, colon));
    if (colon == std::string_view::npos) return out;
    s = s.substr(colon + 1);
  }
}

}  // namespace

std::string CudaIpcHandle::Encode() const {
  std::string out(kPrefix);
  out += kind == Kind::kLegacy ? "legacy:" : kind == Kind::kFabric ? "fabric:" : "fd:";
  out += std::to_string(pid) + ":" + std::to_string(device) + ":" + std::to_string(offset) + ":" +
         std::to_string(length) + ":";
  if (kind == Kind::kFabric) out += std::to_string(allocation_size) + ":";
  if (kind != Kind::kPosixFd) {
    for (uint8_t b : legacy) {
      out += kHex[b >> 4];
      out += kHex[b & 15];
    }
  } else {
    out += std::to_string(fd) + ":" + std::to_string(allocation_size) + ":" + std::to_string(allocation_id);
  }
  return out;
}

StatusOr<CudaIpcHandle> CudaIpcHandle::Decode(std::string_view text) {
  if (text.substr(0, kPrefix.size()) != kPrefix) return Bad(text, "wrong prefix");
  std::vector<std::string_view> f = Split(text.substr(kPrefix.size()));
  CudaIpcHandle h;
  if (f[0] == "legacy") {
    h.kind = Kind::kLegacy;
    if (f.size() != 6) return Bad(text, "expected legacy:pid:device:offset:length:handle");
  } else if (f[0] == "fabric") {
    h.kind = Kind::kFabric;
    if (f.size() != 7) return Bad(text, "expected fabric:pid:device:offset:length:allocation_size:handle");
  } else if (f[0] == "fd") {
    h.kind = Kind::kPosixFd;
    if (f.size() != 8) return Bad(text, "expected fd:pid:device:offset:length:fd:allocation_size:allocation_id");
  } else {
    return Bad(text, "unknown kind");
  }
  if (!platform_util::ParseDecimalInt(f[1], &h.pid) || h.pid <= 0) return Bad(text, "bad pid");
  if (!platform_util::ParseDecimalInt(f[2], &h.device)) return Bad(text, "bad device");
  if (!platform_util::ParseDecimal(f[3], UINT64_MAX, &h.offset)) return Bad(text, "bad offset");
  if (!platform_util::ParseDecimal(f[4], UINT64_MAX, &h.length) || h.length == 0) return Bad(text, "bad length");
  if (h.offset + h.length < h.offset) return Bad(text, "offset + length overflows");
  if (h.kind == Kind::kFabric &&
      (!platform_util::ParseDecimal(f[5], UINT64_MAX, &h.allocation_size) || h.offset + h.length > h.allocation_size)) {
    return Bad(text, "the range must lie inside allocation_size");
  }
  if (h.kind != Kind::kPosixFd) {
    const std::string_view bytes = f[h.kind == Kind::kFabric ? 6 : 5];
    if (bytes.size() != 2 * h.legacy.size()) return Bad(text, "the handle must be 128 hex digits");
    for (size_t i = 0; i < h.legacy.size(); ++i) {
      int hi = HexValue(bytes[2 * i]), lo = HexValue(bytes[2 * i + 1]);
      if (hi < 0 || lo < 0) return Bad(text, "the handle must be 128 hex digits");
      h.legacy[i] = static_cast<uint8_t>(hi << 4 | lo);
    }
  } else {
    if (!platform_util::ParseDecimalInt(f[5], &h.fd)) return Bad(text, "bad fd");
    if (!platform_util::ParseDecimal(f[6], UINT64_MAX, &h.allocation_size) || h.offset + h.length > h.allocation_size) {
      return Bad(text, "the range must lie inside allocation_size");
    }
    if (!platform_util::ParseDecimal(f[7], UINT64_MAX, &h.allocation_id)) return Bad(text, "bad allocation_id");
  }
  return h;
}

}  // namespace mooncake::te::cuda
