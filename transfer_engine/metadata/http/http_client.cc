#include "transfer_engine/metadata/http/http_client.h"

#include <curl/curl.h>

namespace mooncake::te {
namespace {

size_t AppendBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

HttpClient::HttpClient() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
}

HttpClient::~HttpClient() {
  if (curl_) curl_easy_cleanup(curl_);
}

std::string HttpClient::Escape(const std::string& s) {
  std::lock_guard lock(mu_);
  if (!curl_) return s;
  char* escaped = curl_easy_escape(curl_, s.c_str(), static_cast<int>(s.size()));
  std::string out = escaped ? escaped : s;
  curl_free(escaped);
  return out;
}

StatusOr<HttpResponse> HttpClient::Request(const std::string& method, const std::string& url,
                                           const std::string* body, long timeout_ms, long connect_timeout_ms) {
  std::lock_guard lock(mu_);
  if (!curl_) return Status(ErrorCode::kMetadata, "libcurl initialisation failed");
  HttpResponse response;
  curl_easy_reset(curl_);
  curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl_, CURLOPT_CUSTOMREQUEST, method.c_str());
  curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout_ms);
  curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &response.body);
  curl_slist* headers = nullptr;
  if (body) {
    headers = curl_slist_append(headers, "Content-Type: application/json");
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body->data());
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(body->size()));
  }
  CURLcode rc = curl_easy_perform(curl_);
  if (headers) curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    return Status(ErrorCode::kMetadata, "cannot reach " + url + ": " + curl_easy_strerror(rc));
  }
  curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &response.code);
  return response;
}

}  // namespace mooncake::te
