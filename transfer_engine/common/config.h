#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_CONFIG_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_CONFIG_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake::te {

/// Engine-wide settings, read from the MC_* environment variables (Mooncake's names and defaults; see the
/// README's configuration table). Each transport reads its own settings in its folder (TransportOptions).
/// Plain value type.
struct EngineConfig {
  std::chrono::seconds transfer_timeout{30};  ///< MC_TRANSFER_TIMEOUT (min 5): a slice in flight longer fails
  size_t slice_size = 65536;                  ///< MC_SLICE_SIZE (generic slicing; transports may override)
  uint16_t min_rpc_port = 15000;              ///< MC_MIN_RPC_PORT
  uint16_t max_rpc_port = 17000;              ///< MC_MAX_RPC_PORT
  bool legacy_rpc_port_binding = false;       ///< MC_LEGACY_RPC_PORT_BINDING: RPC port from local_hostname
  std::chrono::milliseconds handshake_connect_timeout{5000};  ///< MC_HANDSHAKE_CONNECT_TIMEOUT (seconds)
  size_t handshake_max_length = 1 << 20;      ///< MC_HANDSHAKE_MAX_LENGTH
  int handshake_backlog = 128;                ///< MC_HANDSHAKE_LISTEN_BACKLOG
  std::string metadata_cluster_id;            ///< MC_METADATA_CLUSTER_ID: key namespace
  std::chrono::seconds metadata_lease_ttl{10};  ///< MC_METADATA_LEASE_TTL: etcd lease / Redis TTL of our keys
  bool disable_metacache = false;             ///< MC_DISABLE_METACACHE
  /// MC_NOTIFY_QUEUE_BYTES: most bytes (names + messages) of received notifications waiting for get_notifies
  size_t notify_queue_bytes = 64 << 20;
  int retry_count = 9;                                ///< MC_RETRY_CNT: path changes per slice before it fails
  std::string nic_filter;                             ///< MC_TE_FILTERS: NIC allow-list (device_name wins)
  std::string custom_topology_path;                   ///< MC_CUSTOM_TOPO_JSON

  /// Reads every variable; malformed values are ignored with a warning naming the variable.
  static EngineConfig FromEnv();
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_CONFIG_H_
