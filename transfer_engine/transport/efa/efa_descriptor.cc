#include "transfer_engine/transport/efa/efa_descriptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

namespace mooncake::te::efa {

namespace {

constexpr size_t kMaxDevices = 64;
constexpr uint64_t kMaxChunks = 1 << 20;

const char* DevicesKey(bool mooncake) { return mooncake ? "devices" : "efa_devices"; }
const char* RkeyKey(bool mooncake) { return mooncake ? "rkey" : "efa_rkey"; }
const char* LkeyKey(bool mooncake) { return mooncake ? "lkey" : "efa_lkey"; }

// An array of unsigned numbers of exactly `n` entries (any n when n == SIZE_MAX).
std::optional<std::vector<uint64_t>> UintArray(const nlohmann::json& j, size_t n) {
  if (!j.is_array() || (n != SIZE_MAX && j.size() != n)) return std::nullopt;
  std::vector<uint64_t> out;
  out.reserve(j.size());
  for (const auto& v : j) {
    if (!v.is_number_unsigned()) return std::nullopt;
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

// The bytes of a hex string of at most 1024 digits.
std::optional<std::vector<uint8_t>> FromHex(const std::string& s) {
  if (s.empty() || s.size() % 2 != 0 || s.size() > 1024) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<uint8_t> out;
  for (size_t i = 0; i < s.size(); i += 2) {
    int hi = nibble(s[i]), lo = nibble(s[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<uint8_t>(hi << 4 | lo));
  }
  return out;
}

}  // namespace

std::optional<uint32_t> GidIpv4(const std::string& gid) {
  auto bytes = FromHex(gid);
  if (!bytes || bytes->size() != sizeof(struct sockaddr_in)) return std::nullopt;
  struct sockaddr_in sin;
  memcpy(&sin, bytes->data(), sizeof(sin));
  if (sin.sin_family != AF_INET) return std::nullopt;
  return ntohl(sin.sin_addr.s_addr);
}

bool GidIsLoopback(const std::string& gid) {
  if (auto ip = GidIpv4(gid)) return (*ip >> 24) == 127;
  auto bytes = FromHex(gid);
  if (!bytes || bytes->size() != sizeof(struct sockaddr_in6)) return false;
  struct sockaddr_in6 sin6;
  memcpy(&sin6, bytes->data(), sizeof(sin6));
  return sin6.sin6_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&sin6.sin6_addr);
}

bool RemoteKeys::Lookup(size_t device, uint64_t offset, uint64_t* key, uint64_t* chunk_offset) const {
  if (device >= keys.size()) return false;
  const uint64_t index = chunk == 0 ? 0 : offset / chunk;
  if (index >= keys[device].size()) return false;
  *key = keys[device][index];
  *chunk_offset = offset - index * chunk;
  return true;
}

StatusOr<PeerFabric> ReadPeerFabric(const SegmentDescriptor& d) {
  auto bad = [&](const std::string& why) {
    return Status(ErrorCode::kMalformedJson, "segment '" + d.name + "': efa fields: " + why);
  };
  PeerFabric p;
  auto it = d.json.find("efa_devices");
  if (it == d.json.end() && d.protocol == "efa") {
    it = d.json.find("devices");
    p.mooncake_names = true;
  }
  if (it == d.json.end()) return bad("no device list");
  if (!it->is_array() || it->empty() || it->size() > kMaxDevices) return bad("the device list is empty or not a list");
  for (const auto& dev : *it) {
    FabricDevice f;
    auto gid = JsonString(dev, "gid");
    if (!gid || gid->empty()) return bad("a device without a gid");
    f.gid = *gid;
    f.name = JsonString(dev, "name").value_or("");
    f.provider = JsonString(dev, "provider").value_or("efa");
    p.devices.push_back(std::move(f));
  }
  if (auto v = d.json.find("efa_virt_addr"); v != d.json.end()) {
    if (!v->is_boolean()) return bad("efa_virt_addr is not a boolean");
    p.virt_addr = v->get<bool>();
  }
  const bool any_epoch = d.json.contains("efa_epoch") || d.json.contains("efa_epoch_addr") ||
                         d.json.contains("efa_epoch_rkey");
  if (any_epoch) {
    auto epoch = JsonUint(d.json, "efa_epoch");
    auto addr = JsonUint(d.json, "efa_epoch_addr");
    if (!epoch || !addr) return bad("efa_epoch / efa_epoch_addr are not unsigned numbers");
    auto found = d.json.find("efa_epoch_rkey");
    const nlohmann::json keys = found != d.json.end() ? *found : nlohmann::json();
    if (keys.is_number_unsigned()) {
      if (p.devices.size() != 1) return bad("one efa_epoch_rkey for several devices");
      p.epoch_rkeys = {keys.get<uint64_t>()};
    } else if (auto list = UintArray(keys, p.devices.size())) {
      p.epoch_rkeys = std::move(*list);
    } else {
      return bad("efa_epoch_rkey is not one key per device");
    }
    p.has_epoch = true;
    p.epoch = *epoch;
    p.epoch_addr = *addr;
    if (d.json.contains("efa_epoch_lease_us")) {
      auto lease = JsonUint(d.json, "efa_epoch_lease_us");
      if (!lease || *lease > kMaxEpochLeaseUs) return bad("efa_epoch_lease_us is not a number of at most 10 s");
      p.epoch_lease_us = *lease;
    }
  }
  return p;
}

std::optional<RemoteKeys> ReadBufferKeys(const BufferDescriptor& b, const PeerFabric& p) {
  auto it = b.json.find(RkeyKey(p.mooncake_names));
  if (it == b.json.end()) return std::nullopt;
  auto first = UintArray(*it, p.devices.size());
  if (!first) return std::nullopt;
  RemoteKeys k;
  auto chunk = JsonUint(b.json, "efa_mr_chunk");
  if (!chunk) {
    if (b.json.contains("efa_mr_chunk")) return std::nullopt;
    for (uint64_t key : *first) k.keys.push_back({key});
    return k;
  }
  if (*chunk == 0) return std::nullopt;
  const uint64_t chunks = b.length / *chunk + (b.length % *chunk != 0);
  if (chunks == 0 || chunks > kMaxChunks) return std::nullopt;
  auto table = b.json.find("efa_chunk_rkeys");
  if (table == b.json.end() || !table->is_array() || table->size() != p.devices.size()) return std::nullopt;
  for (size_t dev = 0; dev < p.devices.size(); ++dev) {
    auto row = UintArray((*table)[dev], static_cast<size_t>(chunks));
    if (!row || row->front() != (*first)[dev]) return std::nullopt;
    k.keys.push_back(std::move(*row));
  }
  k.chunk = *chunk;
  return k;
}

void WriteFabric(nlohmann::json& d, bool mooncake_names, const std::vector<FabricDevice>& devices, bool virt_addr,
                 uint64_t epoch, uint64_t epoch_addr, const std::vector<uint64_t>& epoch_rkeys,
                 uint64_t epoch_lease_us) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& dev : devices) {
    list.push_back({{"name", dev.name}, {"lid", 0}, {"gid", dev.gid}, {"provider", dev.provider}});
  }
  d[DevicesKey(false)] = list;
  if (mooncake_names) d[DevicesKey(true)] = std::move(list);
  d["efa_virt_addr"] = virt_addr;
  d["efa_epoch"] = epoch;
  d["efa_epoch_addr"] = epoch_addr;
  d["efa_epoch_rkey"] = epoch_rkeys;
  if (epoch_lease_us != 0) d["efa_epoch_lease_us"] = epoch_lease_us;
}

nlohmann::json BufferFields(bool mooncake_names, uint64_t chunk, const std::vector<std::vector<uint64_t>>& keys,
                            bool remote) {
  nlohmann::json out = nlohmann::json::object();
  nlohmann::json first = nlohmann::json::array();
  bool chunked = false;
  for (const auto& row : keys) {
    first.push_back(row.empty() ? 0 : row.front());
    chunked = chunked || row.size() > 1;
  }
  out[LkeyKey(false)] = first;
  if (mooncake_names) out[LkeyKey(true)] = first;
  if (!remote) return out;
  out[RkeyKey(false)] = first;
  if (mooncake_names) out[RkeyKey(true)] = first;
  if (chunked) {
    out["efa_mr_chunk"] = chunk;
    out["efa_chunk_rkeys"] = keys;
  }
  return out;
}

}  // namespace mooncake::te::efa
