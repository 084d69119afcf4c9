#include "transfer_engine/common/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace mooncake::te::net {
namespace {

std::string Errno(const char* what) { return std::string(what) + ": " + strerror(errno); }

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

Status WaitFd(int fd, short events, Clock::time_point deadline, const char* what) {
  while (true) {
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, RemainingMs(deadline));
    if (r > 0) return Status::Ok();
    if (r == 0) return Status(ErrorCode::kTimeout, std::string("timed out while ") + what);
    if (errno != EINTR) return Status(ErrorCode::kSocket, Errno(what));
  }
}

}  // namespace

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

StatusOr<HostPort> ParseHostPort(std::string_view s, uint16_t default_port) {
  HostPort hp;
  hp.port = default_port;
  std::string_view rest;
  if (!s.empty() && s.front() == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos) return InvalidArgument("unterminated '[' in address '" + std::string(s) + "'");
    hp.host = std::string(s.substr(1, close - 1));
    rest = s.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return InvalidArgument("bad address '" + std::string(s) + "'");
    if (!rest.empty()) rest.remove_prefix(1);
    else rest = {};
  } else {
    size_t colon = s.rfind(':');
    if (colon != std::string_view::npos && s.find(':') == colon) {
      hp.host = std::string(s.substr(0, colon));
      rest = s.substr(colon + 1);
      if (rest.empty()) return InvalidArgument("empty port in address '" + std::string(s) + "'");
    } else {
      hp.host = std::string(s);  // bare host or bare IPv6 literal
    }
  }
  if (hp.host.empty()) return InvalidArgument("empty host in address '" + std::string(s) + "'");
  if (!rest.empty()) {
    unsigned long v = 0;
    for (char c : rest) {
      if (c < '0' || c > '9') return InvalidArgument("bad port in address '" + std::string(s) + "'");
      v = v * 10 + (c - '0');
      if (v > 65535) return InvalidArgument("port out of range in address '" + std::string(s) + "'");
    }
    hp.port = static_cast<uint16_t>(v);
  }
  return hp;
}

StatusOr<std::string> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return Status(ErrorCode::kDns, "cannot resolve '" + host + "': " + gai_strerror(rc));
  std::string out;
  for (int pass = 0; pass < 2 && out.empty(); ++pass) {
    for (addrinfo* p = res; p; p = p->ai_next) {
      char buf[INET6_ADDRSTRLEN];
      if (pass == 0 && p->ai_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ai_addr)->sin_addr, buf, sizeof(buf));
        out = buf;
        break;
      }
      if (pass == 1 && p->ai_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(p->ai_addr)->sin6_addr, buf, sizeof(buf));
        out = buf;
        break;
      }
    }
  }
  freeaddrinfo(res);
  if (out.empty()) return Status(ErrorCode::kDns, "no address for '" + host + "'");
  return out;
}

std::string FirstLanIp() {
  ifaddrs* ifs = nullptr;
  std::string out = "127.0.0.1";
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* p = ifs; p; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET) continue;
    if ((p->ifa_flags & IFF_UP) == 0 || (p->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, buf, sizeof(buf));
    out = buf;
    break;
  }
  freeifaddrs(ifs);
  return out;
}

bool IsLocalAddress(const std::string& ip) {
  if (ip.rfind("127.", 0) == 0 || ip == "::1" || ip == "0.0.0.0") return true;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (ifaddrs* p = ifs; p && !found; p = p->ifa_next) {
    if (!p->ifa_addr) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (p->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, buf, sizeof(buf));
    } else if (p->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(p->ifa_addr)->sin6_addr, buf, sizeof(buf));
    }
    found = ip == buf;
  }
  freeifaddrs(ifs);
  return found;
}

static bool IsLoopbackLiteral(const std::string& ip) { return ip.rfind("127.", 0) == 0 || ip == "::1"; }

bool IsThisHost(const std::string& host) {
  if (host.empty()) return false;
  in6_addr any{};
  bool literal = inet_pton(AF_INET, host.c_str(), &any) == 1 || inet_pton(AF_INET6, host.c_str(), &any) == 1;
  if (literal) return IsLoopbackLiteral(host) || (host != "0.0.0.0" && IsLocalAddress(host));
  char self[256] = {0};
  if (host == "localhost" || (gethostname(self, sizeof(self) - 1) == 0 && host == self)) return true;
  auto ip = ResolveHost(host);
  return ip.ok() && !IsLoopbackLiteral(*ip) && *ip != "0.0.0.0" && IsLocalAddress(*ip);
}

static bool FillSockaddr(const std::string& ip, uint16_t port, sockaddr_storage* ss, socklen_t* len) {
  memset(ss, 0, sizeof(*ss));
  auto* v4 = reinterpret_cast<sockaddr_in*>(ss);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    *len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(ss);
  if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

StatusOr<int> Connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                      const std::string& bind_ip, bool* refused) {
  if (refused) *refused = false;
  auto ip = ResolveHost(host);
  if (!ip.ok()) return ip.status();
  sockaddr_storage ss;
  socklen_t len;
  if (!FillSockaddr(*ip, port, &ss, &len)) return InvalidArgument("bad address " + *ip);
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status(ErrorCode::kSocket, Errno("socket"));
  std::string peer = HostPort{*ip, port}.ToString();
  if (!bind_ip.empty()) {
    sockaddr_storage local;
    socklen_t local_len;
    if (!FillSockaddr(bind_ip, 0, &local, &local_len) || bind(fd, reinterpret_cast<sockaddr*>(&local), local_len) != 0) {
      Status st(ErrorCode::kSocket, "bind to " + bind_ip + " before connecting to " + peer + ": " + strerror(errno));
      close(fd);
      return st;
    }
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    if (errno != EINPROGRESS) {
      if (refused) *refused = errno == ECONNREFUSED;
      Status st(ErrorCode::kPeerUnreachable, "connect to " + peer + ": " + strerror(errno));
      close(fd);
      return st;
    }
    Status st = WaitFd(fd, POLLOUT, Clock::now() + timeout, ("connecting to " + peer).c_str());
    int err = 0;
    socklen_t elen = sizeof(err);
    if (st.ok()) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (!st.ok() || err != 0) {
      close(fd);
      if (!st.ok()) return Status(ErrorCode::kPeerUnreachable, st.message());
      if (refused) *refused = err == ECONNREFUSED;
      return Status(ErrorCode::kPeerUnreachable, "connect to " + peer + ": " + strerror(err));
    }
  }
  Status blocking = SetNonBlocking(fd, false);
  if (!blocking.ok()) {
    close(fd);
    return blocking;
  }
  SetNoDelay(fd);
  return fd;
}

StatusOr<int> Listen(const std::string& ip, uint16_t port, int backlog) {
  std::string bind_ip = ip.empty() ? "0.0.0.0" : ip;
  sockaddr_storage ss;
  socklen_t len;
  if (!FillSockaddr(bind_ip, port, &ss, &len)) return InvalidArgument("bad bind address '" + bind_ip + "'");
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(ErrorCode::kSocket, Errno("socket"));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || listen(fd, backlog) != 0) {
    Status st(ErrorCode::kSocket, "listen on " + HostPort{bind_ip, port}.ToString() + ": " + strerror(errno));
    close(fd);
    return st;
  }
  return fd;
}

uint16_t LocalPort(int fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

std::string PeerName(int fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = {0};
  uint16_t port;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  return HostPort{buf, port}.ToString();
}

Status SetNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return Status(ErrorCode::kSocket, Errno("fcntl"));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) != 0) return Status(ErrorCode::kSocket, Errno("fcntl"));
  return Status::Ok();
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Status SendAll(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      MC_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "sending"));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return Status(ErrorCode::kSocket, Errno("send"));
    }
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n == 0) {
      return Status(ErrorCode::kSocket, "connection closed by peer");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      MC_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "receiving"));
    } else if (errno != EINTR) {
      return Status(ErrorCode::kSocket, Errno("recv"));
    }
  }
  return Status::Ok();
}

}  // namespace mooncake::te::net
