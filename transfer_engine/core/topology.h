#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_TOPOLOGY_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_TOPOLOGY_H_

#include <string>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

struct NicInfo {
  std::string name;
  std::string ipv4;
  int prefix_len = 32;  ///< of the interface's subnet
  int numa_node = 0;
  int speed_mbps = -1;  ///< -1 when the driver does not report it (veth, lo)
};

/// Network interfaces that are up and have an IPv4 address, loopback excluded; `filter` is a comma-separated
/// allow-list (empty: all). Read from /sys/class/net and getifaddrs.
std::vector<NicInfo> DiscoverNics(const std::string& filter);

/// The NICs a transport should use: the allow-list `filter` when given, else the NICs named in the custom
/// priority matrix at `custom_topology_path` (MC_CUSTOM_TOPO_JSON) when given, else all. A matrix that cannot be
/// read is an error.
StatusOr<std::vector<NicInfo>> SelectNics(const std::string& filter, const std::string& custom_topology_path);

/// True when `ip` lies in `nic`'s subnet.
bool InSubnet(const NicInfo& nic, const std::string& ip);

/// Identifies "this host" for same-host transports: kernel boot id, network namespace and PID namespace
/// ("<boot_id>/<netns inode>/<pidns inode>"). Processes with equal ids can share memory and see each other in
/// /proc; network namespaces on one kernel count as different hosts (that is how multi-host tests run).
std::string LocalHostId();

/// What the engine sees of this host, as JSON: {"nics": [{name, ipv4, prefix_len, numa_node, speed_mbps}],
/// "numa_nodes": {"0": {"cpus": "0-15"}}, "host_id": ...}, NICs restricted by `filter` like SelectNics.
std::string DescribeHostJson(const std::string& filter);

/// Mooncake's priority matrix ({"cpu:N": [[NICs on node N], [other NICs]]}) for this host's NUMA nodes.
std::string DiscoverTopologyJson(const std::string& filter);

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_TOPOLOGY_H_
