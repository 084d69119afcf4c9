#include "transfer_engine/common/config.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "transfer_engine/common/env.h"
#include "transfer_engine/common/log.h"

namespace mooncake::te {

EngineConfig EngineConfig::FromEnv() {
  EngineConfig c;
  long long x;
  if (EnvInt("MC_TRANSFER_TIMEOUT", 1, 86400 * 365LL, &x)) c.transfer_timeout = std::chrono::seconds(std::max(5LL, x));
  if (EnvInt("MC_SLICE_SIZE", 4096, 1LL << 30, &x)) c.slice_size = static_cast<size_t>(x);
  if (EnvInt("MC_MIN_RPC_PORT", 1, 65535, &x)) c.min_rpc_port = static_cast<uint16_t>(x);
  if (EnvInt("MC_MAX_RPC_PORT", 1, 65535, &x)) c.max_rpc_port = static_cast<uint16_t>(x);
  if (c.max_rpc_port < c.min_rpc_port) {
    MC_LOG(kWarning) << "MC_MAX_RPC_PORT < MC_MIN_RPC_PORT; using the default range 15000-17000";
    c.min_rpc_port = 15000;
    c.max_rpc_port = 17000;
  }
  c.legacy_rpc_port_binding = EnvFlag("MC_LEGACY_RPC_PORT_BINDING");
  if (EnvInt("MC_HANDSHAKE_CONNECT_TIMEOUT", 1, 3600, &x)) c.handshake_connect_timeout = std::chrono::seconds(x);
  if (EnvInt("MC_HANDSHAKE_MAX_LENGTH", 1024, 128LL << 20, &x)) c.handshake_max_length = static_cast<size_t>(x);
  if (EnvInt("MC_HANDSHAKE_LISTEN_BACKLOG", 1, 65535, &x)) c.handshake_backlog = static_cast<int>(x);
  c.metadata_cluster_id = EnvString("MC_METADATA_CLUSTER_ID");
  if (EnvInt("MC_METADATA_LEASE_TTL", 2, 86400, &x)) c.metadata_lease_ttl = std::chrono::seconds(x);
  c.disable_metacache = EnvFlag("MC_DISABLE_METACACHE");
  if (EnvInt("MC_NOTIFY_QUEUE_BYTES", 4096, 1LL << 40, &x)) c.notify_queue_bytes = static_cast<size_t>(x);
  if (EnvInt("MC_RETRY_CNT", 0, 1000, &x)) c.retry_count = static_cast<int>(x);
  c.nic_filter = EnvString("MC_TE_FILTERS");
  c.custom_topology_path = EnvString("MC_CUSTOM_TOPO_JSON");
  return c;
}

}  // namespace mooncake::te
