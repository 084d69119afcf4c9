#include "transfer_engine/transport/rdma/rdma_nic.h"

#include <dirent.h>
#include <poll.h>

#include <algorithm>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transfer_engine/common/log.h"

namespace mooncake::te::rdma {

namespace {

// "pci<4 hex>:<2 hex>": a PCIe root's sysfs directory name; its domain and bus.
bool ParsePcieRoot(const std::string& name, unsigned* domain, unsigned* bus) {
  if (name.size() != 10 || name.compare(0, 3, "pci") != 0 || name[7] != ':') return false;
  char* end = nullptr;
  const std::string d = name.substr(3, 4), b = name.substr(8, 2);
  *domain = static_cast<unsigned>(strtoul(d.c_str(), &end, 16));
  if (*end != '\0') return false;
  *bus = static_cast<unsigned>(strtoul(b.c_str(), &end, 16));
  return *end == '\0' && isxdigit(static_cast<unsigned char>(d[0])) && isxdigit(static_cast<unsigned char>(b[0]));
}

}  // namespace

bool PcieRootOfPath(const std::string& path, std::string* root, std::string* roots_dir) {
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    unsigned domain, bus;
    if (ParsePcieRoot(part, &domain, &bus)) {
      *root = part;
      *roots_dir = start > 0 ? path.substr(0, start - 1) : std::string();
      return true;
    }
    start = end + 1;
  }
  return false;
}

std::string PcieRootOf(const std::string& bus_id, const std::vector<std::string>& roots_dirs) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (sscanf(bus_id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) != 4) return "";
  if (char* real = realpath(("/sys/bus/pci/devices/" + bus_id).c_str(), nullptr)) {
    std::string root, dir;
    const bool found = PcieRootOfPath(real, &root, &dir);
    free(real);
    if (found) return root;
  }
  std::string best;
  unsigned best_bus = 0;
  for (const std::string& dir : roots_dirs) {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) continue;
    while (dirent* e = readdir(d)) {
      unsigned rd, rb;
      if (!ParsePcieRoot(e->d_name, &rd, &rb) || rd != domain || rb > bus) continue;
      if (best.empty() || rb > best_bus) {
        best = e->d_name;
        best_bus = rb;
      }
    }
    closedir(d);
  }
  return best;
}

std::string GidText(const ibv_gid& gid) {
  char buf[48];
  char* p = buf;
  for (int i = 0; i < 16; i += 2) {
    p += snprintf(p, sizeof(buf) - (p - buf), "%s%02x%02x", i ? ":" : "", gid.raw[i], gid.raw[i + 1]);
  }
  return buf;
}

std::optional<ibv_gid> ParseGid(const std::string& text) {
  std::string hex;
  for (char c : text) {
    if (c == ':') continue;
    if (!isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
    hex += c;
  }
  if (hex.size() != 32) return std::nullopt;
  ibv_gid g;
  for (int i = 0; i < 16; ++i) g.raw[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return g;
}

namespace {

bool Empty(const ibv_gid& g) {
  for (uint8_t b : g.raw) {
    if (b) return false;
  }
  return true;
}

bool Ipv4Mapped(const ibv_gid& g) {
  for (int i = 0; i < 10; ++i) {
    if (g.raw[i]) return false;
  }
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}

// Higher is better: RoCEv2 IPv4-mapped, RoCEv2 other (IPv6), RoCEv1 / IB; 0 = unusable.
int GidScore(const ibv_gid& g, int type) {
  if (Empty(g)) return 0;
  if (type == IBV_GID_TYPE_ROCE_V2) return Ipv4Mapped(g) ? 4 : (g.raw[0] == 0xfe && g.raw[1] == 0x80 ? 2 : 3);
  if (type < 0) return Ipv4Mapped(g) ? 3 : 1;  // type unknown (old libibverbs)
  return 1;
}

const char* NodeTypeName(int t) {
  switch (t) {
    case IBV_NODE_CA: return "CA";
    case IBV_NODE_SWITCH: return "switch";
    case IBV_NODE_ROUTER: return "router";
    case IBV_NODE_RNIC: return "RNIC";
    default: return "unknown";
  }
}

}  // namespace

StatusOr<NicInfo> InspectDevice(const VerbsApi* api, ibv_device* device, const RdmaConfig& cfg) {
  NicInfo info;
  info.name = api->get_device_name(device);
  auto fail = [&](const std::string& why) {
    return Status(ErrorCode::kDeviceNotFound, "HCA " + info.name + " skipped: " + why);
  };
  if (device->node_type != IBV_NODE_CA) {
    return fail(std::string("node type ") + NodeTypeName(device->node_type) + " (only CA serves RC)");
  }
  ibv_context* ctx = api->open_device(device);
  if (ctx == nullptr) return fail(std::string("ibv_open_device: ") + strerror(errno));
  struct Closer {
    const VerbsApi* api;
    ibv_context* ctx;
    ~Closer() { api->close_device(ctx); }
  } closer{api, ctx};
  ibv_device_attr dev{};
  if (int rc = api->query_device(ctx, &dev)) return fail(std::string("ibv_query_device: ") + strerror(rc));
  if (cfg.ib_port > dev.phys_port_cnt) {
    return fail("no port " + std::to_string(cfg.ib_port) + " (MC_IB_PORT; it has " +
                std::to_string(dev.phys_port_cnt) + ")");
  }
  ibv_port_attr port{};
  if (int rc = api->query_port(ctx, static_cast<uint8_t>(cfg.ib_port), &port)) {
    return fail(std::string("ibv_query_port: ") + strerror(rc));
  }
  if (port.state != IBV_PORT_ACTIVE) {
    return fail("port " + std::to_string(cfg.ib_port) + " is not ACTIVE (state " + std::to_string(port.state) + ")");
  }
  if (port.link_layer != IBV_LINK_LAYER_ETHERNET && port.link_layer != IBV_LINK_LAYER_INFINIBAND) {
    return fail("link layer " + std::to_string(port.link_layer) + " is neither InfiniBand nor Ethernet");
  }
  if (cfg.pkey_index >= port.pkey_tbl_len) {
    return fail("pkey index " + std::to_string(cfg.pkey_index) + " outside its table of " +
                std::to_string(port.pkey_tbl_len));
  }
  info.ethernet = port.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (FILE* f = fopen((std::string(device->ibdev_path) + "/device/numa_node").c_str(), "re")) {
    if (fscanf(f, "%d", &info.numa_node) != 1) info.numa_node = -1;
    fclose(f);
  }
  if (char* real = realpath((std::string(device->ibdev_path) + "/device").c_str(), nullptr)) {
    PcieRootOfPath(real, &info.pcie_root, &info.pcie_roots_dir);
    free(real);
  }
  info.lid = port.lid;
  info.active_mtu = port.active_mtu;
  info.max_mr_size = dev.max_mr_size;
  info.max_qp_wr = dev.max_qp_wr;
  if (dev.max_qp_rd_atom > 0) info.max_rd_atom = std::min(16, dev.max_qp_rd_atom);
  if (dev.max_qp_init_rd_atom > 0) info.max_init_rd_atom = std::min(16, dev.max_qp_init_rd_atom);
  auto entry = [&](int index, ibv_gid* gid, int* type) {
    *type = -1;
    if (api->query_gid_ex) {
      ibv_gid_entry e{};
      if (api->query_gid_ex(ctx, static_cast<uint32_t>(cfg.ib_port), static_cast<uint32_t>(index), &e, 0) != 0) {
        return false;
      }
      *gid = e.gid;
      *type = static_cast<int>(e.gid_type);
      return true;
    }
    return api->query_gid(ctx, static_cast<uint8_t>(cfg.ib_port), index, gid) == 0;
  };
  if (cfg.gid_index >= 0) {
    ibv_gid g{};
    int type = -1;
    if (cfg.gid_index >= port.gid_tbl_len || !entry(cfg.gid_index, &g, &type) || Empty(g)) {
      return fail("GID index " + std::to_string(cfg.gid_index) + " (MC_GID_INDEX) is empty or missing");
    }
    info.gid = g;
    info.gid_index = cfg.gid_index;
    info.gid_type = type;
    return info;
  }
  int best = 0;
  for (int i = 0; i < port.gid_tbl_len && i < 1024; ++i) {
    ibv_gid g{};
    int type = -1;
    if (!entry(i, &g, &type)) continue;
    int score = info.ethernet ? GidScore(g, type) : (Empty(g) ? 0 : 1);
    if (score > best) {
      best = score;
      info.gid = g;
      info.gid_index = i;
      info.gid_type = type;
    }
  }
  if (best == 0) return fail("no usable GID on port " + std::to_string(cfg.ib_port));
  return info;
}

StatusOr<std::shared_ptr<RdmaNic>> RdmaNic::Open(const VerbsApi* api, ibv_device* device, const NicInfo& info,
                                                 const RdmaConfig& cfg) {
  std::shared_ptr<RdmaNic> nic(new RdmaNic(api, info));
  auto fail = [&](const char* what, int err) {
    return Status(ErrorCode::kDeviceNotFound, "HCA " + info.name + ": " + what + ": " + strerror(err));
  };
  nic->ctx_ = api->open_device(device);
  if (!nic->ctx_) return fail("ibv_open_device", errno);
  nic->pd_ = api->alloc_pd(nic->ctx_);
  if (!nic->pd_) return fail("ibv_alloc_pd", errno);
  for (int i = 0; i < cfg.num_cq_per_ctx; ++i) {
    Cq c;
    c.channel = api->create_comp_channel(nic->ctx_);
    if (!c.channel) return fail("ibv_create_comp_channel", errno);
    c.cq = api->create_cq(nic->ctx_, cfg.max_cqe, nullptr, c.channel, 0);
    if (!c.cq) {
      api->destroy_comp_channel(c.channel);
      return fail("ibv_create_cq", errno);
    }
    nic->cqs_.push_back(std::move(c));
  }
  return nic;
}

RdmaNic::~RdmaNic() {
  Stop();
  for (auto& c : cqs_) {
    if (c.cq) api_->destroy_cq(c.cq);
    if (c.channel) api_->destroy_comp_channel(c.channel);
  }
  if (pd_) api_->dealloc_pd(pd_);
  if (ctx_) {
    if (int rc = api_->close_device(ctx_)) MC_LOG(kWarning) << "rdma: closing " << info_.name << ": " << strerror(rc);
  }
}

void RdmaNic::Start(CompletionFn fn) {
  on_wc_ = std::move(fn);
  started_ = true;
  for (size_t i = 0; i < cqs_.size(); ++i) cqs_[i].thread = std::thread([this, i] { Poll(i); });
}

void RdmaNic::Stop() {
  if (stop_.exchange(true)) return;
  for (auto& c : cqs_) {
    if (c.thread.joinable()) c.thread.join();
  }
}

void RdmaNic::Poll(size_t index) {
  Cq& c = cqs_[index];
  ibv_wc wcs[32];
  bool armed = false;
  while (!stop_.load(std::memory_order_acquire)) {
    int n = api_->poll_cq(c.cq, 32, wcs);
    if (n < 0) {
      MC_LOG(kError) << "rdma: ibv_poll_cq on " << info_.name << " failed (" << n << ")";
      n = 0;
    }
    if (n > 0) {
      for (int i = 0; i < n; ++i) on_wc_(wcs[i]);
      continue;
    }
    if (!armed) {
      // Arm, then look once more: a completion that arrived before arming raises no event.
      api_->req_notify_cq(c.cq, 0);
      armed = true;
      continue;
    }
    pollfd p{c.channel->fd, POLLIN, 0};
    int r = poll(&p, 1, 100);
    if (r == 1) {
      ibv_cq* cq = nullptr;
      void* cookie = nullptr;
      if (api_->get_cq_event(c.channel, &cq, &cookie) == 0) api_->ack_cq_events(cq, 1);
      armed = false;
    }
  }
}

}  // namespace mooncake::te::rdma
