#include "transfer_engine/core/metadata.h"

#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

namespace mooncake::te {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::pair<std::string, MetadataFactory>> factories;
};

Registry& GetRegistry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void RegisterMetadataBackend(const std::string& scheme, MetadataFactory factory) {
  auto& r = GetRegistry();
  std::lock_guard lock(r.mu);
  r.factories.emplace_back(scheme, std::move(factory));
}

std::vector<std::string> MetadataBackendSchemes() {
  auto& r = GetRegistry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> out;
  for (auto& [s, f] : r.factories) out.push_back(s);
  return out;
}

StatusOr<std::unique_ptr<MetadataBackend>> CreateMetadataBackend(const std::string& conn,
                                                                  const EngineConfig& config) {
  MetadataContext ctx;
  ctx.uri = conn;
  ctx.config = &config;
  std::string scheme;
  if (conn == "P2PHANDSHAKE" || conn == "p2phandshake") {
    scheme = "p2p";
  } else if (auto pos = conn.find("://"); pos != std::string::npos) {
    scheme = conn.substr(0, pos);
    ctx.location = conn.substr(pos + 3);
  } else {
    scheme = "etcd";  // Mooncake treats a bare "host:port" as etcd
    ctx.location = conn;
    ctx.uri = "etcd://" + conn;
  }
  MetadataFactory factory;
  {
    auto& r = GetRegistry();
    std::lock_guard lock(r.mu);
    for (auto& [s, f] : r.factories) {
      if (s == scheme) factory = f;
    }
  }
  if (!factory) {
    std::string known;
    for (const auto& s : MetadataBackendSchemes()) known += (known.empty() ? "" : ", ") + s;
    return Status(ErrorCode::kMetadata, "no metadata backend for '" + conn + "' (scheme '" + scheme +
                                            "'); built-in: " + known + ", or P2PHANDSHAKE");
  }
  return factory(ctx);
}

KeyValueMetadataBackend::KeyValueMetadataBackend(std::unique_ptr<KeyValueStore> store, std::string cluster_id)
    : store_(std::move(store)), prefix_("mooncake/") {
  if (!cluster_id.empty()) prefix_ += cluster_id + "/";
}

std::string KeyValueMetadataBackend::SegmentKey(const std::string& name) const {
  // Mooncake: names containing '/' are stored as mooncake/<name>, others under ram/.
  return name.find('/') == std::string::npos ? prefix_ + "ram/" + name : prefix_ + name;
}

std::string KeyValueMetadataBackend::RpcKey(const std::string& name) const { return prefix_ + "rpc_meta/" + name; }

Status KeyValueMetadataBackend::PublishSegment(const std::string& name, const std::string& descriptor_json) {
  return store_->Put(SegmentKey(name), descriptor_json);
}

Status KeyValueMetadataBackend::PublishRpcAddress(const std::string& name, const net::HostPort& rpc) {
  nlohmann::json j{{"ip_or_host_name", rpc.host}, {"rpc_port", rpc.port}};
  return store_->Put(RpcKey(name), j.dump());
}

Status KeyValueMetadataBackend::Unpublish(const std::string& name) {
  Status a = store_->Delete(SegmentKey(name));
  Status b = store_->Delete(RpcKey(name));
  return a.ok() ? b : a;
}

StatusOr<std::string> KeyValueMetadataBackend::FetchSegment(const std::string& name) {
  return store_->Get(SegmentKey(name));
}

StatusOr<net::HostPort> KeyValueMetadataBackend::ResolveRpcAddress(const std::string& name) {
  auto value = store_->Get(RpcKey(name));
  if (!value.ok()) return value.status();
  auto j = nlohmann::json::parse(*value, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ip_or_host_name") || !j.contains("rpc_port") ||
      !j["ip_or_host_name"].is_string() || !j["rpc_port"].is_number_unsigned()) {
    return Status(ErrorCode::kMalformedJson, "malformed rpc_meta entry for '" + name + "': " + *value);
  }
  return net::HostPort{j["ip_or_host_name"].get<std::string>(), j["rpc_port"].get<uint16_t>()};
}

}  // namespace mooncake::te
