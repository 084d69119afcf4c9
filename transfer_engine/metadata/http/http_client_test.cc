#include "transfer_engine/metadata/http/http_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

namespace mooncake::te {
namespace {

// Serves one connection on 127.0.0.1 (ephemeral port): reads the request head, writes `reply` verbatim.
class OneShotServer {
 public:
  explicit OneShotServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd_, 1) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      timeval tv{5, 0};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        head.append(buf, static_cast<size_t>(n));
      }
      (void)send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
      close(c);
    });
  }
  ~OneShotServer() {
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/metadata?key=k"; }

 private:
  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// Header names come back lowercase whatever case the server sends; values are trimmed of blanks and CRLF.
TEST(HttpClientTest, ReturnsHeadersByLowercaseNameWithTrimmedValues) {
  OneShotServer server(
      "HTTP/1.1 200 OK\r\n"
      "Content-Length: 5\r\n"
      "X-Mooncake-Metadata-VERSION:   4611686018427387904 \t\r\n"
      "x-mooncake-metadata-features: if_absent,if_version\r\n"
      "X-Empty:\r\n"
      "Connection: close\r\n"
      "\r\n"
      "hello");
  HttpClient client;
  auto r = client.Request("GET", server.url(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->code, 200);
  EXPECT_EQ(r->body, "hello");
  EXPECT_EQ(r->headers["x-mooncake-metadata-version"], "4611686018427387904");
  EXPECT_EQ(r->headers["x-mooncake-metadata-features"], "if_absent,if_version");
  EXPECT_EQ(r->headers.count("x-empty"), 1u);
  EXPECT_EQ(r->headers["x-empty"], "");
  EXPECT_EQ(r->headers.count("X-Mooncake-Metadata-VERSION"), 0u);
}

TEST(HttpClientTest, ErrorStatusStillCarriesHeadersAndBody) {
  OneShotServer server("HTTP/1.1 412 Precondition Failed\r\nContent-Length: 16\r\nX-A: b\r\nConnection: close\r\n\r\n"
                       "metadata changed");
  HttpClient client;
  auto r = client.Request("DELETE", server.url(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->code, 412);
  EXPECT_EQ(r->body, "metadata changed");
  EXPECT_EQ(r->headers["x-a"], "b");
}

}  // namespace
}  // namespace mooncake::te
