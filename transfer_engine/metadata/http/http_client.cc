#include "transfer_engine/metadata/http/http_client.h"

#include <curl/curl.h>

#include <cctype>

namespace mooncake::te {
namespace {

size_t AppendBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// One header line ("Name: value\r\n"; also the status line and the final empty line, which have no colon).
size_t AppendHeader(char* data, size_t size, size_t n, void* out) {
  std::string line(data, size * n);
  auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    for (auto& c : name) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    size_t b = line.find_first_not_of(" \t", colon + 1);
    size_t e = line.find_last_not_of(" \t\r\n");
    (*static_cast<std::map<std::string, std::string>*>(out))[name] =
        b == std::string::npos || e < b ? "" : line.substr(b, e - b + 1);
  }
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
  curl_easy_setopt(curl_, CURLOPT_HEADERFUNCTION, AppendHeader);
  curl_easy_setopt(curl_, CURLOPT_HEADERDATA, &response.headers);
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
