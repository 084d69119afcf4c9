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
    nic.numa_node = std::max(0, ReadInt("/sys/class/net/" + name + "/device/numa_node", 0));
    nic.speed_mbps = ReadInt("/sys/class/net/" + name + "/speed", -1);
    out.push_back(nic);
  }
  freeifaddrs(ifs);
  return out;
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
