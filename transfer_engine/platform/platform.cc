#include "transfer_engine/platform/platform.h"

#include <algorithm>
#include <utility>

#include "transfer_engine/platform/cpu/cpu_platform.h"

namespace mooncake::te {
namespace {

struct TypeName {
  MemoryType type;
  const char* name;
};
constexpr TypeName kTypeNames[] = {
    {MemoryType::kHost, "host"}, {MemoryType::kCuda, "cuda"}, {MemoryType::kRocm, "rocm"},
    {MemoryType::kNpu, "npu"},   {MemoryType::kMusa, "musa"}, {MemoryType::kFile, "file"},
    {MemoryType::kCxl, "cxl"},
};

bool HasOrdinal(MemoryType t) { return MemoryKind{t, 0}.is_device(); }

// A decimal ordinal: digits only (no sign, no spaces), fits in an int.
bool ParseOrdinal(std::string_view s, int* out) {
  if (s.empty() || s.size() > 9) return false;  // 9 digits always fit in an int
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

Status BadKind(std::string_view text, const std::string& why) {
  return InvalidArgument("bad memory location \"" + std::string(text) + "\": " + why +
                         " (expected host, cpu[:N], *, cuda:N, rocm:N, npu:N, musa:N, file or cxl)");
}

}  // namespace

const char* MemoryTypeName(MemoryType t) {
  for (const auto& e : kTypeNames) {
    if (e.type == t) return e.name;
  }
  return "unknown";
}

std::string MemoryKind::ToString() const {
  if (!HasOrdinal(type)) return MemoryTypeName(type);
  return std::string(MemoryTypeName(type)) + ":" + std::to_string(device);
}

StatusOr<MemoryKind> MemoryKind::Parse(std::string_view text) {
  if (text == "*" || text == "cpu" || text == "host") return MemoryKind{};
  std::string_view head = text;
  std::string_view tail;
  bool has_colon = false;
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    head = text.substr(0, colon);
    tail = text.substr(colon + 1);
    has_colon = true;
  }
  int ordinal = 0;
  if (head == "cpu") {  // Mooncake's "cpu:<numa node>": host memory; the node is not kept
    if (!ParseOrdinal(tail, &ordinal)) return BadKind(text, "the NUMA node must be a non-negative integer");
    return MemoryKind{};
  }
  for (const auto& e : kTypeNames) {
    if (head != e.name) continue;
    if (!HasOrdinal(e.type)) {
      if (has_colon) return BadKind(text, std::string(e.name) + " takes no device ordinal");
      return MemoryKind{e.type, -1};
    }
    if (!has_colon) return BadKind(text, "a device ordinal is required, e.g. " + std::string(e.name) + ":0");
    if (!ParseOrdinal(tail, &ordinal)) return BadKind(text, "the device ordinal must be a non-negative integer");
    return MemoryKind{e.type, ordinal};
  }
  return BadKind(text, "unknown memory type");
}

PlatformRegistry::PlatformRegistry() { platforms_.push_back(MakeCpuPlatform()); }

PlatformRegistry& PlatformRegistry::Get() {
  static PlatformRegistry* registry = new PlatformRegistry();  // never destroyed: used from static destructors
  return *registry;
}

void PlatformRegistry::Register(std::shared_ptr<Platform> platform) {
  if (platform == nullptr) return;
  const std::string name = platform->name();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : platforms_) {
    if (p->name() == name) {
      p = std::move(platform);
      return;
    }
  }
  platforms_.push_back(std::move(platform));
}

bool PlatformRegistry::Unregister(const std::string& name) {
  if (name == "cpu") return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(platforms_.begin(), platforms_.end(),
                         [&](const std::shared_ptr<Platform>& p) { return p->name() == name; });
  if (it == platforms_.end()) return false;
  platforms_.erase(it);
  return true;
}

std::vector<std::shared_ptr<Platform>> PlatformRegistry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  return platforms_;
}

std::shared_ptr<Platform> PlatformRegistry::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& p : platforms_) {
    if (p->name() == name) return p;
  }
  return nullptr;
}

std::shared_ptr<Platform> PlatformRegistry::ForType(MemoryType type) const {
  // Probe outside the lock: a first probe loads a vendor library and may take a while.
  for (const auto& p : All()) {
    if (p->device_type() == type && p->Probe().usable) return p;
  }
  return nullptr;
}

MemoryKind PlatformRegistry::Classify(const void* ptr) const {
  if (ptr == nullptr) return MemoryKind{};
  for (const auto& p : All()) {
    if (p->device_type() == MemoryType::kHost || !p->Probe().usable) continue;
    if (std::optional<MemoryKind> kind = p->Classify(ptr)) return *kind;
  }
  return MemoryKind{};
}

std::shared_ptr<Platform> PlatformRegistry::OwnerOf(const void* ptr, MemoryType type) const {
  if (ptr == nullptr || type == MemoryType::kHost || type == MemoryType::kFile || type == MemoryType::kCxl) {
    return nullptr;
  }
  for (const auto& p : All()) {
    if (p->device_type() != type || !p->Probe().usable) continue;
    std::optional<MemoryKind> kind = p->Classify(ptr);
    if (kind && kind->type == type) return p;
  }
  return nullptr;
}

StatusOr<DeviceLocality> PlatformRegistry::Locality(const MemoryKind& kind) const {
  if (!kind.is_device() || kind.device < 0) {
    return Status(ErrorCode::kInvalidArgument, "no device locality for " + kind.ToString() + " memory");
  }
  std::shared_ptr<Platform> p = ForType(kind.type);
  if (!p) {
    return Status(ErrorCode::kDeviceNotFound,
                  std::string("no usable platform serves ") + MemoryTypeName(kind.type) + " memory");
  }
  return p->Locality(kind.device);
}

}  // namespace mooncake::te
