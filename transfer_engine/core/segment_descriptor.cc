#include "transfer_engine/core/segment_descriptor.h"

namespace mooncake::te {

std::optional<uint64_t> JsonUint(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  if (!it->is_number_unsigned() && it->get<int64_t>() < 0) return std::nullopt;
  return it->get<uint64_t>();
}

std::optional<int64_t> JsonInt(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return it->get<int64_t>();
}

std::optional<std::string> JsonString(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

StatusOr<SegmentDescriptor> SegmentDescriptor::Parse(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  auto bad = [](const std::string& why) {
    return Status(ErrorCode::kMalformedJson, "corrupted segment descriptor: " + why);
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  SegmentDescriptor d;
  auto name = j.find("name");
  auto protocol = j.find("protocol");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return bad("missing name");
  if (protocol == j.end() || !protocol->is_string()) return bad("missing protocol");
  d.name = name->get<std::string>();
  d.protocol = protocol->get<std::string>();
  auto buffers = j.find("buffers");
  if (buffers != j.end()) {
    if (!buffers->is_array()) return bad("buffers is not a list");
    for (const auto& b : *buffers) {
      if (!b.is_object()) return bad("buffer is not an object");
      BufferDescriptor bd;
      auto bn = b.find("name");
      auto ba = b.find("addr");
      auto bl = b.find("length");
      if (bn == b.end() || !bn->is_string() || bn->get<std::string>().empty()) return bad("buffer without name");
      if (ba == b.end() || !ba->is_number_unsigned() || bl == b.end() || !bl->is_number_unsigned()) {
        return bad("buffer without addr/length");
      }
      bd.name = bn->get<std::string>();
      bd.addr = ba->get<uint64_t>();
      bd.length = bl->get<uint64_t>();
      if (bd.addr == 0 || bd.length == 0 || bd.addr + bd.length < bd.addr) return bad("buffer with bad range");
      bd.json = b;
      d.buffers.push_back(std::move(bd));
    }
  }
  // The engine's own fields (read with json::value(), which throws on a type mismatch).
  for (const char* key : {"instance", "host_id"}) {
    if (j.contains(key) && !j[key].is_string()) return bad(std::string(key) + " is not a string");
  }
  for (const char* key : {"pid", "pid_start"}) {
    if (j.contains(key) && !j[key].is_number_integer()) return bad(std::string(key) + " is not an integer");
  }
  d.json = std::move(j);
  return d;
}

std::string SegmentDescriptor::Serialize() const {
  nlohmann::json j = json.is_object() ? json : nlohmann::json::object();
  j["name"] = name;
  j["protocol"] = protocol;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& b : buffers) {
    nlohmann::json jb = b.json.is_object() ? b.json : nlohmann::json::object();
    jb["name"] = b.name;
    jb["addr"] = b.addr;
    jb["length"] = b.length;
    list.push_back(std::move(jb));
  }
  j["buffers"] = std::move(list);
  return j.dump();
}

const BufferDescriptor* SegmentDescriptor::FindBuffer(uint64_t addr, uint64_t len) const {
  if (addr + len < addr) return nullptr;
  for (const auto& b : buffers) {
    if (addr >= b.addr && addr + len <= b.addr + b.length) return &b;
  }
  return nullptr;
}

std::vector<const BufferDescriptor*> SegmentDescriptor::FindBufferRun(uint64_t addr, uint64_t len) const {
  std::vector<const BufferDescriptor*> run;
  if (len == 0 || addr + len < addr) return run;
  const uint64_t end = addr + len;
  uint64_t at = addr;
  while (at < end) {
    const BufferDescriptor* next = nullptr;
    if (run.empty()) {
      next = FindBuffer(at, 1);
    } else {
      for (const auto& b : buffers) {  // the next one starts exactly where the previous one ends
        if (b.addr == at) {
          next = &b;
          break;
        }
      }
    }
    if (!next || (!run.empty() && next->name != run.front()->name) || run.size() == buffers.size()) return {};
    run.push_back(next);
    at = next->addr + next->length;  // Parse refused buffers whose end wraps
  }
  return run;
}

}  // namespace mooncake::te
