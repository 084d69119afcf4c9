// HTTP metadata backend: GET/PUT/DELETE <uri>?key=<urlencoded key> against a server speaking the protocol of
// mooncake_http_metadata_server (python/mooncake/http_metadata_server.py). Keys do not expire (engines remove
// theirs when they exit cleanly). The server keeps them in memory only, so every MC_METADATA_LEASE_TTL seconds
// the engine checks its keys and writes back any the server lost (a restarted server is repopulated).
#include <map>
#include <memory>
#include <mutex>

#include "transfer_engine/common/log.h"
#include "transfer_engine/core/metadata.h"
#include "transfer_engine/metadata/common/periodic.h"
#include "transfer_engine/metadata/http/http_client.h"

namespace mooncake::te {
namespace {

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
    {
      std::lock_guard lock(mu_);
      owned_[key] = value;
    }
    auto r = Call("PUT", key, &value);
    if (!r.ok()) return r.status();
    if (r->code != 200) return Unexpected("PUT", key, *r);
    return Status::Ok();
  }

  Status Delete(const std::string& key) override {
    {
      std::lock_guard lock(mu_);
      owned_.erase(key);
    }
    auto r = Call("DELETE", key, nullptr);
    if (!r.ok()) return r.status();
    if (r->code != 200 && r->code != 404) return Unexpected("DELETE", key, *r);
    return Status::Ok();
  }

 private:
  StatusOr<HttpResponse> Call(const char* method, const std::string& key, const std::string* body) {
    std::string url = uri_ + (uri_.find('?') == std::string::npos ? "?key=" : "&key=") + client_.Escape(key);
    auto r = client_.Request(method, url, body);
    if (!r.ok()) {
      return Status(ErrorCode::kMetadata, r.status().message() +
                                              " (is the metadata server running? start one with "
                                              "mooncake_http_metadata_server)");
    }
    return r;
  }

  Status Unexpected(const char* method, const std::string& key, const HttpResponse& r) {
    return Status(ErrorCode::kMetadata, std::string(method) + " " + uri_ + " key '" + key + "' returned HTTP " +
                                            std::to_string(r.code) + ": " + r.body.substr(0, 200));
  }

  void Republish() {
    std::map<std::string, std::string> owned;
    {
      std::lock_guard lock(mu_);
      owned = owned_;
    }
    for (const auto& [key, value] : owned) {
      auto r = Call("GET", key, nullptr);
      if (!r.ok() || r->code != 404) continue;  // present, or the server is unreachable right now
      auto put = Call("PUT", key, &value);
      if (put.ok() && put->code == 200) MC_LOG(kInfo) << "metadata server had lost '" << key << "'; published again";
    }
  }

  std::string uri_;
  HttpClient client_;
  std::mutex mu_;  // guards owned_
  std::map<std::string, std::string> owned_;
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
