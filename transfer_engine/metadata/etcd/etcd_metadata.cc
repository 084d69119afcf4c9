// etcd metadata backend ("etcd://host:port[;host:port...]", also a bare "host:port"), over etcd's v3 JSON
// gateway with libcurl (no gRPC/Go dependency). Every key this engine writes is bound to one lease of
// MC_METADATA_LEASE_TTL seconds, kept alive from a background thread: a crashed engine's keys vanish when the
// lease expires; a clean exit revokes the lease (and deletes the keys). Names are claimed with transactions
// (create-if-absent, delete-if-unchanged), so two engines never both hold one key.
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/common/log.h"
#include "transfer_engine/core/metadata.h"
#include "transfer_engine/metadata/common/leased_store.h"
#include "transfer_engine/metadata/common/periodic.h"
#include "transfer_engine/metadata/http/http_client.h"

namespace mooncake::te {
namespace {

const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64Encode(const std::string& in) {
  std::string out;
  int val = 0, bits = -6;
  for (unsigned char c : in) {
    val = (val << 8) + c;
    bits += 8;
    while (bits >= 0) {
      out.push_back(kB64[(val >> bits) & 0x3F]);
      bits -= 6;
    }
  }
  if (bits > -6) out.push_back(kB64[((val << 8) >> (bits + 8)) & 0x3F]);
  while (out.size() % 4) out.push_back('=');
  return out;
}

std::string Base64Decode(const std::string& in) {
  std::string out;
  int val = 0, bits = -8;
  for (unsigned char c : in) {
    const char* p = strchr(kB64, c);
    if (c == '=' || p == nullptr || c == 0) break;
    val = (val << 6) + static_cast<int>(p - kB64);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

class EtcdKeyValueStore : public LeasedKeyValueStore {
 public:
  EtcdKeyValueStore(std::vector<std::string> endpoints, std::chrono::seconds ttl)
      : endpoints_(std::move(endpoints)), ttl_(ttl) {}

  ~EtcdKeyValueStore() override {
    keepalive_.reset();
    std::lock_guard lock(mu_);
    if (!lease_.empty()) {
      auto r = Post("/v3/lease/revoke", nlohmann::json{{"ID", lease_}});
      if (!r.ok()) MC_LOG(kWarning) << "etcd: could not revoke lease " << lease_ << ": " << r.status().message();
    }
  }

  Status Start() {
    std::lock_guard lock(mu_);
    MC_RETURN_IF_ERROR(GrantLocked());
    auto interval = std::chrono::duration_cast<std::chrono::milliseconds>(ttl_) / 3;
    keepalive_ = std::make_unique<Periodic>(interval, [this] { KeepAlive(); });
    return Status::Ok();
  }

  StatusOr<std::string> Get(const std::string& key) override {
    auto r = Post("/v3/kv/range", nlohmann::json{{"key", Base64Encode(key)}});
    if (!r.ok()) return r.status();
    auto kvs = r->find("kvs");
    if (kvs == r->end() || !kvs->is_array() || kvs->empty()) return NotFound("no key '" + key + "' in etcd");
    return Base64Decode((*kvs)[0].value("value", ""));
  }

  Status DeleteIfValue(const std::string& key, const std::string& value) override {
    {
      std::lock_guard lock(mu_);
      owned_.EraseIfValue(key, value);
    }
    nlohmann::json txn = {
        {"compare", {{{"key", Base64Encode(key)}, {"target", "VALUE"}, {"result", "EQUAL"},
                      {"value", Base64Encode(value)}}}},
        {"success", {{{"request_delete_range", {{"key", Base64Encode(key)}}}}}}};
    auto r = Post("/v3/kv/txn", txn);
    return r.ok() ? Status::Ok() : r.status();
  }

 private:
  Status GrantLocked() {
    auto r = Post("/v3/lease/grant", nlohmann::json{{"TTL", std::to_string(ttl_.count())}});
    if (!r.ok()) return r.status();
    std::string id = r->value("ID", "");
    if (id.empty()) return Status(ErrorCode::kMetadata, "etcd did not grant a lease: " + r->dump());
    lease_ = id;
    return Status::Ok();
  }

  // A transaction: put (on our lease) only if the key has never been created (or was deleted since).
  StatusOr<bool> CreateLocked(const std::string& key, const std::string& value) override {
    nlohmann::json txn = {
        {"compare", {{{"key", Base64Encode(key)}, {"target", "CREATE"}, {"result", "EQUAL"},
                      {"create_revision", "0"}}}},
        {"success", {{{"request_put", {{"key", Base64Encode(key)}, {"value", Base64Encode(value)},
                                       {"lease", lease_}}}}}}};
    auto r = Post("/v3/kv/txn", txn);
    if (!r.ok()) return r.status();
    return r->value("succeeded", false);  // proto3 JSON leaves out a false
  }

  // A transaction: put `key` (on our lease) only while `guard` holds `guard_value`.
  StatusOr<bool> PutIfValueLocked(const std::string& key, const std::string& value, const std::string& guard,
                                  const std::string& guard_value) override {
    nlohmann::json txn = {
        {"compare", {{{"key", Base64Encode(guard)}, {"target", "VALUE"}, {"result", "EQUAL"},
                      {"value", Base64Encode(guard_value)}}}},
        {"success", {{{"request_put", {{"key", Base64Encode(key)}, {"value", Base64Encode(value)},
                                       {"lease", lease_}}}}}}};
    auto r = Post("/v3/kv/txn", txn);
    if (!r.ok()) return r.status();
    return r->value("succeeded", false);
  }

  Status PutLocked(const std::string& key, const std::string& value) override {
    auto r = Post("/v3/kv/put",
                  nlohmann::json{{"key", Base64Encode(key)}, {"value", Base64Encode(value)}, {"lease", lease_}});
    return r.ok() ? Status::Ok() : r.status();
  }

  // Renews the lease; if etcd lost it (expired while unreachable, or etcd restarted), takes a new one and
  // writes the keys again (until all are back: a failed write is retried on the next round).
  void KeepAlive() {
    std::lock_guard lock(mu_);
    if (!republish_pending_) {
      auto r = Post("/v3/lease/keepalive", nlohmann::json{{"ID", lease_}});
      if (!r.ok()) {
        MC_LOG(kWarning) << "etcd keep-alive failed: " << r.status().message();
        return;
      }
      auto result = r->find("result");
      std::string ttl = result != r->end() && result->is_object() ? result->value("TTL", "0") : "0";
      if (ttl != "0") return;
      MC_LOG(kWarning) << "etcd lease " << lease_ << " was lost; re-publishing " << owned_.size() << " key(s)";
      if (!GrantLocked().ok()) return;
      republish_pending_ = true;
    }
    // Our keys went with the lease: write each back unless another engine created it meanwhile; claims
    // (guards) first, and a guarded key only while its guard is still ours.
    bool failed = false;
    for (const std::string& key : owned_.GuardsFirst()) {
      const OwnedKeys::Entry* e = owned_.Find(key);
      if (!e) continue;  // dropped with its guard
      StatusOr<bool> written = false;
      if (e->guard.empty()) {
        written = CreateLocked(key, e->value);
        // Written by us before a failed round (the write landed, its answer did not).
        if (written.ok() && !*written) written = PutIfValueLocked(key, e->value, key, e->value);
      } else if (const std::string* gv = owned_.GuardValue(key)) {
        written = PutIfValueLocked(key, e->value, e->guard, *gv);
      }
      if (!written.ok()) {
        MC_LOG(kWarning) << "etcd: re-publishing '" << key << "' failed: " << written.status().message();
        failed = true;
      } else if (!*written) {
        MC_LOG(kError) << "etcd: '" << key << "' was taken by another engine while our lease was lost; "
                       << "not publishing it (nor what it guards) again";
        owned_.Drop(key);
      }
    }
    republish_pending_ = failed;
  }

  // POSTs to the first endpoint that answers (starting with the last one that did).
  StatusOr<nlohmann::json> Post(const std::string& path, const nlohmann::json& body) {
    std::string payload = body.dump();
    Status last;
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      size_t idx = (good_.load(std::memory_order_relaxed) + i) % endpoints_.size();
      auto r = http_.Request("POST", "http://" + endpoints_[idx] + path, &payload);
      if (!r.ok()) {
        last = r.status();
        continue;
      }
      good_.store(idx, std::memory_order_relaxed);
      auto j = nlohmann::json::parse(r->body, nullptr, false);
      if (r->code != 200 || j.is_discarded() || !j.is_object()) {
        return Status(ErrorCode::kMetadata, "etcd " + path + " returned HTTP " + std::to_string(r->code) + ": " +
                                                r->body.substr(0, 200));
      }
      return j;
    }
    return Status(ErrorCode::kMetadata, "no etcd endpoint answered (" + last.message() + ")");
  }

  std::vector<std::string> endpoints_;
  std::chrono::seconds ttl_;
  HttpClient http_;
  std::atomic<size_t> good_{0};  // the endpoint that answered last (any thread)
  std::string lease_;  // lease_ and republish_pending_: guarded by mu_ (the base's)
  bool republish_pending_ = false;  // a new lease was granted; not every key is back on it yet
  std::unique_ptr<Periodic> keepalive_;
};

StatusOr<std::unique_ptr<MetadataBackend>> CreateEtcdBackend(const MetadataContext& ctx) {
  std::vector<std::string> endpoints;
  std::stringstream ss(ctx.location);
  std::string item;
  while (std::getline(ss, item, ';')) {
    if (item.rfind("http://", 0) == 0) item = item.substr(7);
    while (!item.empty() && item.back() == '/') item.pop_back();
    if (!item.empty()) endpoints.push_back(item);
  }
  if (endpoints.empty()) return InvalidArgument("no etcd endpoint in '" + ctx.uri + "'");
  auto store = std::make_unique<EtcdKeyValueStore>(endpoints, ctx.config->metadata_lease_ttl);
  Status st = store->Start();
  if (!st.ok()) return Status(ErrorCode::kMetadata, "etcd at " + ctx.location + ": " + st.message());
  return std::unique_ptr<MetadataBackend>(
      new KeyValueMetadataBackend(std::move(store), ctx.config->metadata_cluster_id));
}

}  // namespace

MC_REGISTER_METADATA_BACKEND("etcd", etcd, CreateEtcdBackend);

}  // namespace mooncake::te
