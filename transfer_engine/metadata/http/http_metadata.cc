// HTTP metadata backend: GET/PUT/DELETE <uri>?key=<urlencoded key> against a server speaking the protocol of
// mooncake_http_metadata_server (python/mooncake/http_metadata_server.py). Keys do not expire (engines remove
// theirs when they exit cleanly). The server keeps them in memory only, so every MC_METADATA_LEASE_TTL seconds
// the engine checks its keys and writes back any the server lost (a restarted server is repopulated); a key
// another engine holds by then is never overwritten, and is given up with the keys it guards.
//
// Our server announces conditional requests in every response (header X-Mooncake-Metadata-Features:
// "if_absent" for PUT ...&if_absent=1; "if_version" for DELETE ...&if_version=N, where N is the version its
// GET returned in X-Mooncake-Metadata-Version, changed by every PUT that stores a body; both answered 412 when
// the condition fails): Create is then atomic, and DeleteIfValue removes only the very entry it read holding
// the value (not one written again since, even with the same value). Against other servers (Mooncake's own),
// which would ignore the parameters, they fall back to a read then a plain write.
#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "transfer_engine/common/log.h"
#include "transfer_engine/core/metadata.h"
#include "transfer_engine/metadata/common/owned_keys.h"
#include "transfer_engine/metadata/common/periodic.h"
#include "transfer_engine/metadata/http/http_client.h"

namespace mooncake::te {
namespace {

constexpr char kFeaturesHeader[] = "x-mooncake-metadata-features";
constexpr char kVersionHeader[] = "x-mooncake-metadata-version";

// A version as the server sends it: a decimal integer (it goes into a URL unescaped).
bool IsVersion(const std::string& s) {
  return !s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos;
}

class HttpKeyValueStore : public KeyValueStore {
 public:
  HttpKeyValueStore(std::string uri, std::chrono::seconds refresh) : uri_(std::move(uri)) {
    refresher_ = std::make_unique<Periodic>(std::chrono::duration_cast<std::chrono::milliseconds>(refresh),
                                            [this] { Republish(); });
  }
  ~HttpKeyValueStore() override { refresher_.reset(); }

  StatusOr<std::string> Get(const std::string& key) override {
    auto r = Call("GET", key, nullptr);
    if (!r.ok()) return r.status();
    if (r->code == 404) return NotFound("no metadata under key '" + key + "' at " + uri_);
    if (r->code != 200) return Unexpected("GET", key, *r);
    return std::move(r->body);
  }

  Status Put(const std::string& key, const std::string& value) override {
    MC_RETURN_IF_ERROR(PutRaw(key, value));
    Own(key, value, "");
    return Status::Ok();
  }

  StatusOr<bool> Create(const std::string& key, const std::string& value) override {
    auto created = CreateRaw(key, value);
    if (created.ok() && *created) Own(key, value, "");
    return created;
  }

  // The entry was just read holding `value`: nothing to change on the server, only to keep it from now on.
  StatusOr<bool> Adopt(const std::string& key, const std::string& value) override {
    Own(key, value, "");
    return true;
  }

  StatusOr<bool> PutGuarded(const std::string& key, const std::string& value, const std::string& guard,
                            const std::string& guard_value) override {
    auto put = PutGuardedRaw(key, value, guard, guard_value);
    if (put.ok() && *put) Own(key, value, guard);
    return put;
  }

  bool Owns(const std::string& key) override {
    std::lock_guard lock(mu_);
    return owned_.Contains(key);
  }

  Status DeleteIfValue(const std::string& key, const std::string& value) override {
    {
      std::lock_guard lock(mu_);
      owned_.EraseIfValue(key, value);
    }
    auto current = Call("GET", key, nullptr);  // also tells whether the server deletes conditionally
    if (!current.ok()) return current.status();
    if (current->code == 404) return Status::Ok();
    if (current->code != 200) return Unexpected("GET", key, *current);
    if (current->body != value) return Status::Ok();  // someone else's by now
    std::string condition;
    if (Supports("if_version")) {
      auto v = current->headers.find(kVersionHeader);
      if (v == current->headers.end() || !IsVersion(v->second)) {
        return Status(ErrorCode::kMetadata, "GET " + uri_ + " key '" + key +
                                                "' announced if_version but sent no valid "
                                                "X-Mooncake-Metadata-Version header; the key is left in place");
      }
      condition = "&if_version=" + v->second;
    }
    auto r = Call("DELETE", key, nullptr, condition);
    if (!r.ok()) return r.status();
    if (r->code != 200 && r->code != 404 && !(!condition.empty() && r->code == 412)) {
      return Unexpected("DELETE", key, *r);
    }
    return Status::Ok();
  }

 private:
  StatusOr<HttpResponse> Call(const char* method, const std::string& key, const std::string* body,
                              const std::string& extra_query = "") {
    std::string url =
        uri_ + (uri_.find('?') == std::string::npos ? "?key=" : "&key=") + client_.Escape(key) + extra_query;
    auto r = client_.Request(method, url, body);
    if (!r.ok()) {
      return Status(ErrorCode::kMetadata, r.status().message() +
                                              " (is the metadata server running? start one with "
                                              "mooncake_http_metadata_server)");
    }
    auto f = r->headers.find(kFeaturesHeader);
    std::lock_guard lock(mu_);
    features_ = f == r->headers.end() ? "" : "," + f->second + ",";
    return r;
  }

  // Whether the server that answered last announced `feature`.
  bool Supports(const std::string& feature) {
    std::lock_guard lock(mu_);
    return features_.find("," + feature + ",") != std::string::npos;
  }

  Status PutRaw(const std::string& key, const std::string& value) {
    auto r = Call("PUT", key, &value);
    if (!r.ok()) return r.status();
    if (r->code != 200) return Unexpected("PUT", key, *r);
    return Status::Ok();
  }

  // Create-if-absent: atomic where the server supports if_absent; elsewhere a read then a write, where a lost
  // race on an rpc_meta key shows as the server's refusal to replace it (400 "Duplicate rpc_meta key").
  StatusOr<bool> CreateRaw(const std::string& key, const std::string& value) {
    auto existing = Get(key);
    if (existing.ok()) return false;
    if (existing.status().code() != ErrorCode::kNotFound) return existing.status();
    bool conditional = Supports("if_absent");
    auto r = Call("PUT", key, &value, conditional ? "&if_absent=1" : "");
    if (!r.ok()) return r.status();
    if (conditional && r->code == 412) return false;
    if (r->code == 400 && r->body.find("Duplicate") != std::string::npos) return false;
    if (r->code != 200) return Unexpected("PUT", key, *r);
    return true;
  }

  // A read of the guard, then the write (the server has no guarded write; an rpc_meta guard changes hands
  // only by a delete and a create, so the window is that of one request).
  StatusOr<bool> PutGuardedRaw(const std::string& key, const std::string& value, const std::string& guard,
                               const std::string& guard_value) {
    auto current = Get(guard);
    if (!current.ok() && current.status().code() == ErrorCode::kNotFound) return false;
    if (!current.ok()) return current.status();
    if (*current != guard_value) return false;
    MC_RETURN_IF_ERROR(PutRaw(key, value));
    return true;
  }

  void Own(const std::string& key, const std::string& value, const std::string& guard) {
    std::lock_guard lock(mu_);
    owned_.Set(key, value, guard);
  }

  Status Unexpected(const char* method, const std::string& key, const HttpResponse& r) {
    return Status(ErrorCode::kMetadata, std::string(method) + " " + uri_ + " key '" + key + "' returned HTTP " +
                                            std::to_string(r.code) + ": " + r.body.substr(0, 200));
  }

  // Writes back what the server lost; gives up a key (and what it guards) another engine holds by now.
  // Claims (guards) first; a guarded key only while its guard is still ours.
  void Republish() {
    std::vector<std::string> order;
    {
      std::lock_guard lock(mu_);
      order = owned_.GuardsFirst();
    }
    for (const std::string& key : order) {
      OwnedKeys::Entry e;
      std::string guard_value;
      {
        std::lock_guard lock(mu_);
        const OwnedKeys::Entry* found = owned_.Find(key);
        if (!found) continue;  // deleted, or dropped with its guard
        e = *found;
        if (!e.guard.empty()) {
          const std::string* gv = owned_.GuardValue(key);
          if (!gv) continue;
          guard_value = *gv;
        }
      }
      auto current = Get(key);
      StatusOr<bool> kept = true;
      if (current.ok()) {
        kept = *current == e.value;
      } else if (current.status().code() == ErrorCode::kNotFound) {
        kept = e.guard.empty() ? CreateRaw(key, e.value) : PutGuardedRaw(key, e.value, e.guard, guard_value);
        if (kept.ok() && *kept) MC_LOG(kInfo) << "metadata server had lost '" << key << "'; published again";
      } else {
        continue;  // unreachable right now
      }
      if (!kept.ok() || *kept) continue;
      std::lock_guard lock(mu_);
      const OwnedKeys::Entry* now = owned_.Find(key);
      if (!now || now->value != e.value) continue;  // rewritten meanwhile: the next round looks again
      MC_LOG(kError) << "metadata: '" << key << "' is held by another engine by now; not publishing it (nor what "
                     << "it guards) again";
      owned_.Drop(key);
    }
  }

  std::string uri_;
  HttpClient client_;
  std::mutex mu_;  // guards owned_, features_
  OwnedKeys owned_;
  std::string features_;  // ",feature,...," as the server last announced them
  std::unique_ptr<Periodic> refresher_;  // last: stops before the members it uses go away
};

StatusOr<std::unique_ptr<MetadataBackend>> CreateHttpBackend(const MetadataContext& ctx) {
  if (ctx.location.empty()) return InvalidArgument("empty HTTP metadata URL '" + ctx.uri + "'");
  return std::unique_ptr<MetadataBackend>(
      new KeyValueMetadataBackend(std::make_unique<HttpKeyValueStore>(ctx.uri, ctx.config->metadata_lease_ttl),
                                  ctx.config->metadata_cluster_id));
}

}  // namespace

MC_REGISTER_METADATA_BACKEND("http", http, CreateHttpBackend);
MC_REGISTER_METADATA_BACKEND("https", https, CreateHttpBackend);

}  // namespace mooncake::te
