#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_NET_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_NET_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "transfer_engine/api/status.h"

namespace mooncake::te::net {

using Clock = std::chrono::steady_clock;

struct HostPort {
  std::string host;  ///< without IPv6 brackets
  uint16_t port = 0;
  /// "host:port", with brackets around IPv6 hosts.
  std::string ToString() const;
};

/// Parses "host", "host:port", "[v6]", "[v6]:port". A missing port yields `default_port`.
StatusOr<HostPort> ParseHostPort(std::string_view s, uint16_t default_port = 0);

/// Resolves a host name or literal to a numeric address (first result; IPv4 preferred).
StatusOr<std::string> ResolveHost(const std::string& host);

/// First non-loopback IPv4 address of an interface that is up, or "127.0.0.1".
std::string FirstLanIp();

/// True when `ip` is assigned to one of this host's interfaces (or is a loopback address).
bool IsLocalAddress(const std::string& ip);
/// Whether `host` (an address or a name) certainly means this host, so that a refused connection to it
/// proves nothing listens there: a loopback literal (127.0.0.0/8, ::1), "localhost" or this host's own name,
/// or a name or address that is (resolves to) an address of one of this host's interfaces. A name that
/// resolves to loopback here but is not ours (a stale /etc/hosts entry) is not: it may mean another host.
bool IsThisHost(const std::string& host);

/// Connects with a timeout, from `bind_ip` when not empty (so the traffic leaves through that NIC). Returns a
/// blocking socket with TCP_NODELAY set. Errors name the peer; `refused`, when given, is set to whether the
/// peer's host actively refused the connection (nothing listens there), as opposed to any other failure.
StatusOr<int> Connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                      const std::string& bind_ip = "", bool* refused = nullptr);

/// Binds and listens on ip:port (port 0 = ephemeral; ip "" or "0.0.0.0" = all). SO_REUSEADDR is set.
StatusOr<int> Listen(const std::string& ip, uint16_t port, int backlog);

uint16_t LocalPort(int fd);
std::string PeerName(int fd);

Status SetNonBlocking(int fd, bool on);
void SetNoDelay(int fd);

/// Blocking helpers for sockets, bounded by `deadline`; EINTR-safe. Errors say what was being done.
Status SendAll(int fd, const void* data, size_t len, Clock::time_point deadline);
Status RecvAll(int fd, void* data, size_t len, Clock::time_point deadline);

}  // namespace mooncake::te::net

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_NET_H_
