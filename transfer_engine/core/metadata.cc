#include "transfer_engine/core/metadata.h"

#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

#include "transfer_engine/common/log.h"

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
  std::lock_guard lock(mu_);
  if (auto gone = released_.find(name); gone != released_.end()) {
    return Status(ErrorCode::kMetadata, "segment '" + name + "' is no longer published by this engine: " + gone->second);
  }
  std::string key = SegmentKey(name);
  std::string rpc_key = RpcKey(name);
  auto claim = published_.find(rpc_key);
  if (claim == published_.end()) {  // no claim made through this backend: nothing to guard the write with
    MC_RETURN_IF_ERROR(store_->Put(key, descriptor_json));
    published_[key] = descriptor_json;
    return Status::Ok();
  }
  auto put = store_->PutGuarded(key, descriptor_json, rpc_key, claim->second);
  if (!put.ok()) return put.status();
  if (*put) {
    published_[key] = descriptor_json;
    return Status::Ok();
  }
  // Our claim is not in place: lost for now (lease lost, server restarted: the store writes it back), or to
  // another engine.
  auto current = store_->Get(rpc_key);
  if (!current.ok() && current.status().code() != ErrorCode::kNotFound) return current.status();
  if (!current.ok() && store_->Owns(rpc_key)) {
    return Status(ErrorCode::kMetadata, "the rpc_meta entry of segment '" + name +
                                            "' is missing right now (metadata server restarted, or lease lost); "
                                            "it is being published again: retry");
  }
  std::string why = "another engine took the name over (rpc_meta holds " +
                    (current.ok() ? *current : std::string("nothing")) + ")";
  MC_LOG(kError) << "segment name '" << name << "' was lost: " << why << "; no longer publishing it";
  Status removed = ReleaseLocked(name, why);
  if (!removed.ok()) MC_LOG(kWarning) << "could not remove the keys of '" << name << "': " << removed.message();
  return Status(ErrorCode::kMetadata, "segment '" + name + "': " + why);
}

StatusOr<net::HostPort> KeyValueMetadataBackend::ParseRpcValue(const std::string& name, const std::string& value) {
  auto j = nlohmann::json::parse(value, nullptr, false);
  bool ok = !j.is_discarded() && j.is_object() && j.contains("ip_or_host_name") && j.contains("rpc_port") &&
            j["ip_or_host_name"].is_string() && j["rpc_port"].is_number_unsigned() &&
            !j["ip_or_host_name"].get<std::string>().empty();
  uint64_t port = ok ? j["rpc_port"].get<uint64_t>() : 0;
  if (!ok || port == 0 || port > 65535) {
    return Status(ErrorCode::kMalformedJson, "malformed rpc_meta entry for '" + name + "': " + value);
  }
  return net::HostPort{j["ip_or_host_name"].get<std::string>(), static_cast<uint16_t>(port)};
}

Status KeyValueMetadataBackend::PublishRpcAddress(const std::string& name, const net::HostPort& rpc,
                                                  const OwnerCheck& owner_gone) {
  std::lock_guard lock(mu_);
  std::string key = RpcKey(name);
  std::string value = nlohmann::json{{"ip_or_host_name", rpc.host}, {"rpc_port", rpc.port}}.dump();
  // Create-if-absent; an existing entry is either ours already (an earlier run of this engine at the same
  // address: adopted), or another engine's: replaced only when that engine is provably gone. A few rounds:
  // another engine may be claiming the name at the same time.
  for (int round = 0; round < 3; ++round) {
    auto created = store_->Create(key, value);
    if (!created.ok()) return created.status();
    auto current = *created ? StatusOr<std::string>(value) : store_->Get(key);
    if (!current.ok() && current.status().code() == ErrorCode::kNotFound) continue;  // just removed: retry
    if (!current.ok()) return current.status();
    if (*current == value) {
      // Nobody else can hold our address (we are bound to it): the entry is ours and must live on our lease.
      auto mine = *created ? StatusOr<bool>(true) : store_->Adopt(key, value);
      if (!mine.ok()) return mine.status();
      if (!*mine) continue;  // changed meanwhile
      published_[key] = value;
      released_.erase(name);
      return Status::Ok();
    }
    auto owner = ParseRpcValue(name, *current);
    if (owner.ok()) {
      Status gone = owner_gone(*owner);
      if (!gone.ok()) return gone;
      MC_LOG(kWarning) << "segment name '" << name << "' was held by an engine at " << owner->ToString()
                       << " that is gone (" << *current << "); taking it over";
    } else {  // a malformed entry leads nobody to a live engine
      MC_LOG(kWarning) << owner.status().message() << "; replacing it";
    }
    MC_RETURN_IF_ERROR(store_->DeleteIfValue(key, *current));
  }
  return Status(ErrorCode::kMetadata, "segment name '" + name + "' is being claimed by another engine right now");
}

Status KeyValueMetadataBackend::ReleaseLocked(const std::string& name, const std::string& why) {
  released_[name] = why;
  Status first;
  // The descriptor first: while the claim is ours, nobody else has written one.
  for (const std::string& key : {SegmentKey(name), RpcKey(name)}) {
    auto it = published_.find(key);
    if (it == published_.end()) continue;  // never ours: leave it to whoever wrote it
    std::string value = std::move(it->second);
    published_.erase(it);
    Status st = store_->DeleteIfValue(key, value);
    if (first.ok()) first = st;
  }
  return first;
}

Status KeyValueMetadataBackend::Unpublish(const std::string& name) {
  std::lock_guard lock(mu_);
  return ReleaseLocked(name, "it was unpublished");
}

StatusOr<std::string> KeyValueMetadataBackend::FetchSegment(const std::string& name) {
  return store_->Get(SegmentKey(name));
}

StatusOr<net::HostPort> KeyValueMetadataBackend::ResolveRpcAddress(const std::string& name) {
  auto value = store_->Get(RpcKey(name));
  if (!value.ok()) return value.status();
  return ParseRpcValue(name, *value);
}

}  // namespace mooncake::te
