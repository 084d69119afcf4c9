#ifndef MOONCAKE_TRANSFER_ENGINE_METADATA_HTTP_HTTP_CLIENT_H_
#define MOONCAKE_TRANSFER_ENGINE_METADATA_HTTP_HTTP_CLIENT_H_

#include <map>
#include <mutex>
#include <string>

#include "transfer_engine/api/status.h"

typedef void CURL;

namespace mooncake::te {

struct HttpResponse {
  long code = 0;
  std::string body;
  std::map<std::string, std::string> headers;  ///< by lowercase name; values trimmed
};

/// A libcurl easy handle behind a mutex: one keep-alive connection per client. Thread-safe.
/// Transport failures (refused, timeout, DNS) are kMetadata errors naming the URL; any HTTP status is a response.
class HttpClient {
 public:
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  StatusOr<HttpResponse> Request(const std::string& method, const std::string& url, const std::string* body,
                                 long timeout_ms = 3000, long connect_timeout_ms = 1500);
  /// Percent-encodes a query parameter value.
  std::string Escape(const std::string& s);

 private:
  std::mutex mu_;
  CURL* curl_ = nullptr;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_METADATA_HTTP_HTTP_CLIENT_H_
