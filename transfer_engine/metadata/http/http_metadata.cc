// HTTP metadata backend: GET/PUT/DELETE <uri>?key=<urlencoded key> against a server speaking the protocol of
// mooncake_http_metadata_server (python/mooncake/http_metadata_server.py). Uses libcurl.
#include <curl/curl.h>

#include <mutex>
#include <string>

#include "transfer_engine/core/metadata.h"

namespace mooncake::te {
namespace {

size_t AppendBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

/// One curl easy handle reused under a mutex (keep-alive connection to the server). Thread-safe.
class HttpKeyValueStore : public KeyValueStore {
 public:
  explicit HttpKeyValueStore(std::string uri) : uri_(std::move(uri)) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    curl_ = curl_easy_init();
  }
  ~HttpKeyValueStore() override {
    if (curl_) curl_easy_cleanup(curl_);
  }

  StatusOr<std::string> Get(const std::string& key) override {
    std::string body;
    long code = 0;
    MC_RETURN_IF_ERROR(Request("GET", key, nullptr, &body, &code));
    if (code == 404) return NotFound("no metadata under key '" + key + "' at " + uri_);
    if (code != 200) return Unexpected("GET", key, code, body);
    return body;
  }

  Status Put(const std::string& key, const std::string& value) override {
    std::string body;
    long code = 0;
    MC_RETURN_IF_ERROR(Request("PUT", key, &value, &body, &code));
    if (code != 200) return Unexpected("PUT", key, code, body);
    return Status::Ok();
  }

  Status Delete(const std::string& key) override {
    std::string body;
    long code = 0;
    MC_RETURN_IF_ERROR(Request("DELETE", key, nullptr, &body, &code));
    if (code != 200 && code != 404) return Unexpected("DELETE", key, code, body);
    return Status::Ok();
  }

 private:
  Status Unexpected(const char* method, const std::string& key, long code, const std::string& body) {
    return Status(ErrorCode::kMetadata, std::string(method) + " " + uri_ + " key '" + key + "' returned HTTP " +
                                            std::to_string(code) + ": " + body.substr(0, 200));
  }

  Status Request(const char* method, const std::string& key, const std::string* payload, std::string* body,
                 long* code) {
    std::lock_guard lock(mu_);
    if (!curl_) return Status(ErrorCode::kMetadata, "libcurl initialisation failed");
    char* escaped = curl_easy_escape(curl_, key.c_str(), static_cast<int>(key.size()));
    std::string url = uri_ + (uri_.find('?') == std::string::npos ? "?key=" : "&key=") + escaped;
    curl_free(escaped);
    curl_easy_reset(curl_);
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, 3000L);
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, 1500L);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, AppendBody);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, body);
    curl_slist* headers = nullptr;
    if (payload) {
      headers = curl_slist_append(headers, "Content-Type: application/json");
      curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, payload->data());
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload->size()));
    }
    CURLcode rc = curl_easy_perform(curl_);
    if (headers) curl_slist_free_all(headers);
    if (rc != CURLE_OK) {
      return Status(ErrorCode::kMetadata, std::string("cannot reach metadata server ") + uri_ + ": " +
                                              curl_easy_strerror(rc) +
                                              " (is it running? start one with mooncake_http_metadata_server)");
    }
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, code);
    return Status::Ok();
  }

  std::string uri_;
  std::mutex mu_;
  CURL* curl_ = nullptr;
};

StatusOr<std::unique_ptr<MetadataBackend>> CreateHttpBackend(const MetadataContext& ctx) {
  if (ctx.location.empty()) return InvalidArgument("empty HTTP metadata URL '" + ctx.uri + "'");
  return std::unique_ptr<MetadataBackend>(new KeyValueMetadataBackend(
      std::make_unique<HttpKeyValueStore>(ctx.uri), ctx.config->metadata_cluster_id));
}

}  // namespace

MC_REGISTER_METADATA_BACKEND("http", http, CreateHttpBackend);
MC_REGISTER_METADATA_BACKEND("https", https, CreateHttpBackend);

}  // namespace mooncake::te
