#include "transfer_engine/common/config.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "transfer_engine/common/log.h"

namespace mooncake::te {
namespace {

bool ReadInt(const char* name, long long min, long long max, long long* out) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return false;
  char* end = nullptr;
  long long x = strtoll(v, &end, 10);
  if (*end != '\0' || x < min || x > max) {
    MC_LOG(kWarning) << "ignoring " << name << "='" << v << "': expected an integer in [" << min << ", " << max
                     << "]";
    return false;
  }
  *out = x;
  return true;
}

bool ReadBool(const char* name) {
  const char* v = getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  return !(s.empty() || s == "0" || s == "false" || s == "FALSE" || s == "no" || s == "off");
}

std::string ReadString(const char* name) {
  const char* v = getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

EngineConfig EngineConfig::FromEnv() {
  EngineConfig c;
  long long x;
  if (ReadInt("MC_TRANSFER_TIMEOUT", 1, 86400 * 365LL, &x)) c.transfer_timeout = std::chrono::seconds(std::max(5LL, x));
  if (ReadInt("MC_SLICE_SIZE", 4096, 1LL << 30, &x)) c.slice_size = static_cast<size_t>(x);
  if (ReadInt("MC_TCP_SLICE_SIZE", 4096, 1LL << 30, &x)) c.tcp_slice_size = static_cast<size_t>(x);
  if (ReadInt("MC_TCP_IO_THREADS", 1, 64, &x)) c.tcp_io_threads = static_cast<int>(x);
  if (ReadInt("MC_TCP_LANES_PER_PEER", 1, 64, &x)) c.tcp_lanes_per_peer = static_cast<int>(x);
  if (ReadInt("MC_TCP_MAX_FRAME", 4096, 1LL << 31, &x)) c.tcp_max_frame = static_cast<size_t>(x);
  c.tcp_slice_size = std::min(c.tcp_slice_size, c.tcp_max_frame);
  c.force_tcp = ReadBool("MC_FORCE_TCP");
  c.tcp_bind_address = ReadString("MC_TCP_BIND_ADDRESS");
  if (ReadInt("MC_MIN_RPC_PORT", 1, 65535, &x)) c.min_rpc_port = static_cast<uint16_t>(x);
  if (ReadInt("MC_MAX_RPC_PORT", 1, 65535, &x)) c.max_rpc_port = static_cast<uint16_t>(x);
  if (c.max_rpc_port < c.min_rpc_port) {
    MC_LOG(kWarning) << "MC_MAX_RPC_PORT < MC_MIN_RPC_PORT; using the default range 15000-17000";
    c.min_rpc_port = 15000;
    c.max_rpc_port = 17000;
  }
  c.legacy_rpc_port_binding = ReadBool("MC_LEGACY_RPC_PORT_BINDING");
  if (ReadInt("MC_HANDSHAKE_CONNECT_TIMEOUT", 1, 3600, &x)) c.handshake_connect_timeout = std::chrono::seconds(x);
  if (ReadInt("MC_HANDSHAKE_MAX_LENGTH", 1024, 128LL << 20, &x)) c.handshake_max_length = static_cast<size_t>(x);
  if (ReadInt("MC_HANDSHAKE_LISTEN_BACKLOG", 1, 65535, &x)) c.handshake_backlog = static_cast<int>(x);
  c.metadata_cluster_id = ReadString("MC_METADATA_CLUSTER_ID");
  if (ReadInt("MC_METADATA_LEASE_TTL", 2, 86400, &x)) c.metadata_lease_ttl = std::chrono::seconds(x);
  c.disable_metacache = ReadBool("MC_DISABLE_METACACHE");
  if (ReadInt("MC_NOTIFY_QUEUE_BYTES", 4096, 1LL << 40, &x)) c.notify_queue_bytes = static_cast<size_t>(x);
  if (ReadInt("MC_TCP_STALL_TIMEOUT_MS", 100, 3600000, &x)) c.tcp_stall_timeout = std::chrono::milliseconds(x);
  if (ReadInt("MC_TCP_PROBE_INTERVAL_MS", 10, 3600000, &x)) c.tcp_probe_interval = std::chrono::milliseconds(x);
  if (ReadInt("MC_TCP_LANE_WINDOW", 4096, 1LL << 34, &x)) c.tcp_lane_window = static_cast<size_t>(x);
  if (ReadInt("MC_TCP_RECV_SPIN_US", 0, 10000, &x)) c.tcp_recv_spin = std::chrono::microseconds(x);
  if (ReadInt("MC_RETRY_CNT", 0, 1000, &x)) c.retry_count = static_cast<int>(x);
  c.nic_filter = ReadString("MC_TE_FILTERS");
  c.custom_topology_path = ReadString("MC_CUSTOM_TOPO_JSON");
  return c;
}

}  // namespace mooncake::te
