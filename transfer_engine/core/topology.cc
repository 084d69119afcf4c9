#include "transfer_engine/core/topology.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace mooncake::te {
namespace {

int ReadInt(const std::string& path, int fallback) {
  std::ifstream f(path);
  int v;
  if (f >> v) return v;
  return fallback;
}

std::set<std::string> SplitComma(const std::string& s) {
  std::set<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.insert(item);
  }
  return out;
}

std::vector<int> NumaNodes() {
  std::vector<int> nodes;
  if (DIR* d = opendir("/sys/devices/system/node")) {
    while (dirent* e = readdir(d)) {
      int n;
      if (sscanf(e->d_name, "node%d", &n) == 1) nodes.push_back(n);
    }
    closedir(d);
  }
  if (nodes.empty()) nodes.push_back(0);
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

}  // namespace

std::vector<NicInfo> DiscoverNics(const std::string& filter) {
  std::set<std::string> allow = SplitComma(filter);
  std::vector<NicInfo> out;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* p = ifs; p; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET) continue;
    if ((p->ifa_flags & IFF_UP) == 0 || (p->ifa_flags & IFF_LOOPBACK)) continue;
    std::string name = p->ifa_name;
    if (!allow.empty() && !allow.count(name)) continue;
    NicInfo nic;
    nic.name = name;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, buf, sizeof(buf));
    nic.ipv4 = buf;
    if (p->ifa_netmask) {
      uint32_t mask = ntohl(reinterpret_cast<sockaddr_in*>(p->ifa_netmask)->sin_addr.s_addr);
      nic.prefix_len = __builtin_popcount(mask);
    }
    nic.numa_node = std::max(0, ReadInt("/sys/class/net/" + name + "/device/numa_node", 0));
    nic.speed_mbps = ReadInt("/sys/class/net/" + name + "/speed", -1);
    out.push_back(nic);
  }
  freeifaddrs(ifs);
  return out;
}

StatusOr<std::vector<NicInfo>> SelectNics(const std::string& filter, const std::string& custom_topology_path) {
  if (!filter.empty() || custom_topology_path.empty()) return DiscoverNics(filter);
  std::ifstream f(custom_topology_path);
  if (!f) return InvalidArgument("cannot read MC_CUSTOM_TOPO_JSON file '" + custom_topology_path + "'");
  std::stringstream text;
  text << f.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Status(ErrorCode::kMalformedJson, "MC_CUSTOM_TOPO_JSON '" + custom_topology_path +
                                                 "' is not a JSON object like {\"cpu:0\": [[\"eth0\"], [\"eth1\"]]}");
  }
  std::string names;
  for (const auto& [location, lists] : j.items()) {
    if (!lists.is_array()) return Status(ErrorCode::kMalformedJson, "topology entry '" + location + "' is not a list");
    for (const auto& list : lists) {
      if (!list.is_array()) return Status(ErrorCode::kMalformedJson, "topology entry '" + location + "' is malformed");
      for (const auto& nic : list) {
        if (nic.is_string()) names += (names.empty() ? "" : ",") + nic.get<std::string>();
      }
    }
  }
  if (names.empty()) return InvalidArgument("MC_CUSTOM_TOPO_JSON '" + custom_topology_path + "' names no NIC");
  return DiscoverNics(names);
}

bool InSubnet(const NicInfo& nic, const std::string& ip) {
  in_addr a, b;
  if (inet_pton(AF_INET, nic.ipv4.c_str(), &a) != 1 || inet_pton(AF_INET, ip.c_str(), &b) != 1) return false;
  uint32_t mask = nic.prefix_len <= 0 ? 0 : (nic.prefix_len >= 32 ? 0xffffffffu : ~((1u << (32 - nic.prefix_len)) - 1));
  return (ntohl(a.s_addr) & mask) == (ntohl(b.s_addr) & mask);
}

std::string LocalHostId() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  auto ns = [](const char* path) {
    struct stat st;
    return stat(path, &st) == 0 ? std::to_string(st.st_ino) : std::string("?");
  };
  return boot + "/" + ns("/proc/self/ns/net") + "/" + ns("/proc/self/ns/pid");
}

std::string DescribeHostJson(const std::string& filter) {
  nlohmann::json nics = nlohmann::json::array();
  for (const auto& n : DiscoverNics(filter)) {
    nics.push_back({{"name", n.name}, {"ipv4", n.ipv4}, {"prefix_len", n.prefix_len}, {"numa_node", n.numa_node},
                    {"speed_mbps", n.speed_mbps}});
  }
  nlohmann::json nodes = nlohmann::json::object();
  for (int node : NumaNodes()) {
    std::ifstream f("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
    std::string cpus;
    std::getline(f, cpus);
    nodes[std::to_string(node)] = {{"cpus", cpus}};
  }
  return nlohmann::json{{"nics", nics}, {"numa_nodes", nodes}, {"host_id", LocalHostId()}}.dump();
}

std::string DiscoverTopologyJson(const std::string& filter) {
  auto nics = DiscoverNics(filter);
  nlohmann::json matrix = nlohmann::json::object();
  for (int node : NumaNodes()) {
    nlohmann::json preferred = nlohmann::json::array(), available = nlohmann::json::array();
    for (const auto& n : nics) (n.numa_node == node ? preferred : available).push_back(n.name);
    matrix["cpu:" + std::to_string(node)] = {preferred, available};
  }
  return matrix.dump();
}

}  // namespace mooncake::te
