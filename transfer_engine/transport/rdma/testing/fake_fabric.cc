#include "transfer_engine/transport/rdma/testing/fake_internal.h"

namespace mooncake::te::rdma::fake::internal {

// ---------------------------------------------------------------- configuration and shared files

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

Config ReadConfig() {
  Config c;
  const char* state = getenv("MC_RDMA_FAKE_STATE");
  if (state == nullptr || *state == '\0') return c;
  c.state = state;
  if (const char* h = getenv("MC_RDMA_FAKE_HOST"); h && *h) c.host = h;
  if (const char* r = getenv("MC_RDMA_FAKE_RETRY_MS"); r && *r) c.retry = std::chrono::milliseconds(atoll(r));
  const char* devs = getenv("MC_RDMA_FAKE_DEVICES");
  for (const std::string& entry : Split(devs && *devs ? devs : "fake_mlx5_0,fake_mlx5_1", ',')) {
    std::vector<std::string> parts = Split(entry, ':');
    DeviceSpec d;
    d.name = parts[0].substr(0, IBV_SYSFS_NAME_MAX - 1);
    for (size_t i = 1; i < parts.size(); ++i) {
      const std::string& p = parts[i];
      if (p.rfind("netdev=", 0) == 0) d.netdev = p.substr(7);
      else if (p == "ib") d.ib = true;
      else if (p == "down") d.down = true;
      else if (p == "nogid") d.nogid = true;
      else if (p == "switch") d.is_switch = true;
      else if (p.rfind("max_mr=", 0) == 0) d.max_mr = strtoull(p.c_str() + 7, nullptr, 10);
      else if (p.rfind("mbps=", 0) == 0) d.mbps = atof(p.c_str() + 5);
      else if (p.rfind("numa=", 0) == 0) d.numa = atoi(p.c_str() + 5);
      else if (p.rfind("pcie_root=", 0) == 0) d.pcie_root = static_cast<int>(strtol(p.c_str() + 10, nullptr, 16));
    }
    c.devices.push_back(d);
  }
  if (const char* v = getenv("MC_RDMA_FAKE_DMABUF"); v && *v) c.dmabuf = std::string(v) != "0";
  if (const char* v = getenv("MC_RDMA_FAKE_PEERMEM"); v && *v) c.peermem = std::string(v) == "1";
  mkdir(c.state.c_str(), 0777);
  for (const char* sub : {"/qp", "/mr", "/fault", "/port", "/sysfs"}) mkdir((c.state + sub).c_str(), 0777);
  c.valid = true;
  // Each device's sysfs entry, as libibverbs' ibdev_path names one: device/numa_node gives its NUMA node.
  for (size_t i = 0; i < c.devices.size(); ++i) {
    const DeviceSpec& d = c.devices[i];
    std::string dir = c.state + "/sysfs/" + c.host + "." + d.name;
    mkdir(dir.c_str(), 0777);
    if (d.pcie_root >= 0 && d.pcie_root < 0xff) {
      // Under a PCIe root: `device` links to the device's directory below the root, as in sysfs.
      char root[32], function[64];
      snprintf(root, sizeof(root), "pci0000:%02x", d.pcie_root);
      snprintf(function, sizeof(function), "0000:%02x:00.%zu", d.pcie_root + 1, i % 8);
      const std::string devices = c.state + "/sysfs/" + c.host + "/devices";
      const std::string target = devices + "/" + root + "/" + function;
      mkdir((c.state + "/sysfs/" + c.host).c_str(), 0777);
      mkdir(devices.c_str(), 0777);
      mkdir((devices + "/" + root).c_str(), 0777);
      mkdir(target.c_str(), 0777);
      WriteFileAtomic(target + "/numa_node", std::to_string(d.numa) + "\n");
      if (symlink(target.c_str(), (dir + "/device").c_str()) != 0 && errno != EEXIST) continue;
    } else {
      mkdir((dir + "/device").c_str(), 0777);
      WriteFileAtomic(dir + "/device/numa_node", std::to_string(d.numa) + "\n");
    }
  }
  return c;
}

// This process's pid as the /proc mount sees it (the outermost namespace here): other processes of the fabric
// address it with this number, even when it runs in a PID namespace of its own.
pid_t GlobalPid() {
  char buf[64] = {0};
  ssize_t n = readlink("/proc/self", buf, sizeof(buf) - 1);
  if (n > 0) return static_cast<pid_t>(atoi(buf));
  return getpid();
}

bool ReadFile(const std::string& path, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->clear();
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out->append(buf, static_cast<size_t>(n));
  close(fd);
  return n == 0;
}

bool WriteFileAtomic(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> seq{0};
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(seq++);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return false;
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

Faults ReadFaults(const std::string& state, const std::string& host, const std::string& dev) {
  Faults f;
  std::string text;
  if (!ReadFile(state + "/fault/" + host + "." + dev, &text)) return f;
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    if (w == "port_down") f.port_down = true;
    else if (w == "wc_error") f.wc_error = IBV_WC_RETRY_EXC_ERR;
    else if (w.rfind("wc_error=", 0) == 0) f.wc_error = atoi(w.c_str() + 9);
    else if (w.rfind("qp_error=", 0) == 0) f.qp_error = strtoull(w.c_str() + 9, nullptr, 10);
  }
  return f;
}

// Whether `netdev` has carrier in this process's network namespace.
bool NetdevUp(const std::string& netdev) {
  std::string v;
  if (!ReadFile("/sys/class/net/" + netdev + "/carrier", &v)) return false;
  return !v.empty() && v[0] == '1';
}

int NetdevMtu(const std::string& netdev) {
  std::string v;
  if (!ReadFile("/sys/class/net/" + netdev + "/mtu", &v)) return 1500;
  return atoi(v.c_str());
}

std::optional<in_addr> NetdevIpv4(const std::string& netdev) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<in_addr> out;
  for (struct ifaddrs* i = list; i; i = i->ifa_next) {
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && netdev == i->ifa_name) {
      out = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
      break;
    }
  }
  freeifaddrs(list);
  return out;
}

uint64_t Hash(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::string GidHex(const ibv_gid& g) {
  char buf[33];
  for (int i = 0; i < 16; ++i) snprintf(buf + 2 * i, 3, "%02x", g.raw[i]);
  return std::string(buf, 32);
}

// ---------------------------------------------------------------- ports and GIDs

bool PortActive(const FakeDevice* d, const std::string& host) {
  const Provider& p = Provider::Get();
  if (d->spec.down) return false;
  if (ReadFaults(p.cfg().state, host, d->spec.name).port_down) return false;
  if (!d->spec.netdev.empty() && !NetdevUp(d->spec.netdev)) return false;
  return true;
}

ibv_mtu MtuFor(int bytes) {
  if (bytes >= 4096 + 200) return IBV_MTU_4096;
  if (bytes >= 2048 + 200) return IBV_MTU_2048;
  if (bytes >= 1024 + 100) return IBV_MTU_1024;
  if (bytes >= 512 + 100) return IBV_MTU_512;
  return IBV_MTU_256;
}

// GID table: 0 link-local (RoCE v1, or the IB GID), 1 the same as RoCE v2, 2 IPv4-mapped RoCE v2 (the netdev's
// address; a made-up 10.x address when no netdev is bound), 3 empty.
bool GidEntry(const FakeDevice* d, uint32_t index, ibv_gid* gid, ibv_gid_type* type) {
  memset(gid, 0, sizeof(*gid));
  *type = IBV_GID_TYPE_ROCE_V1;
  if (d->spec.nogid || index >= kGidTableLen) return index < kGidTableLen;
  const std::string& host = Provider::Get().cfg().host;
  uint64_t h = Hash(host + "/" + d->spec.name);
  if (d->spec.ib) {
    *type = IBV_GID_TYPE_IB;
    if (index != 0) return true;
  }
  if (index == 0 || index == 1) {
    gid->raw[0] = 0xfe;
    gid->raw[1] = 0x80;
    for (int i = 0; i < 8; ++i) gid->raw[8 + i] = static_cast<uint8_t>(h >> (8 * i));
    if (index == 1) *type = IBV_GID_TYPE_ROCE_V2;
    return true;
  }
  if (index == 2) {
    *type = IBV_GID_TYPE_ROCE_V2;
    std::optional<in_addr> ip;
    if (!d->spec.netdev.empty()) {
      ip = NetdevIpv4(d->spec.netdev);
    } else {
      in_addr a;
      a.s_addr = htonl(0x0a000000u | static_cast<uint32_t>(h & 0xffffff));
      ip = a;
    }
    if (!ip) return true;
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    memcpy(&gid->raw[12], &ip->s_addr, 4);
  }
  return true;
}

std::string GidList(const FakeDevice* d) {
  std::string out;
  for (uint32_t i = 0; i < kGidTableLen; ++i) {
    ibv_gid g;
    ibv_gid_type t;
    GidEntry(d, i, &g, &t);
    out += (i ? "," : "") + GidHex(g);
  }
  return out;
}

// ---------------------------------------------------------------- QP records

std::string QpPath(uint32_t qpn) { return Provider::Get().Path("qp/" + std::to_string(qpn)); }

// Called with the QP's context mu held (or before the QP is shared).
void WriteQpRecord(const FakeQp* q) {
  Provider& p = Provider::Get();
  std::ostringstream out;
  out << p.pid() << ' ' << static_cast<int>(q->state) << ' ' << q->dest_qpn << ' ' << q->pd->id << ' ' << q->rq_psn
      << ' ' << q->sq_psn << ' ' << static_cast<int>(q->mtu) << ' ' << p.cfg().host << ' ' << q->fctx->dev->spec.name << ' ' << GidList(q->fctx->dev) << '\n';
  WriteFileAtomic(QpPath(q->qp.qp_num), out.str());
}

std::optional<QpRecord> ReadQpRecord(uint32_t qpn) {
  std::string text;
  if (!ReadFile(QpPath(qpn), &text)) return std::nullopt;
  std::istringstream in(text);
  QpRecord r;
  if (!(in >> r.pid >> r.state >> r.dest_qpn >> r.pd >> r.rq_psn >> r.sq_psn >> r.mtu >> r.host >> r.dev >> r.gids)) {
    return std::nullopt;
  }
  return r;
}

bool FindRemoteMr(pid_t pid, uint32_t rkey, RemoteMr* out) {
  std::string text;
  if (!ReadFile(Provider::Get().Path("mr/" + std::to_string(pid)), &text)) return false;
  std::istringstream in(text);
  RemoteMr m;
  while (in >> m.key >> m.pd >> m.addr >> m.len >> m.access) {
    if (m.key == rkey) {
      *out = m;
      return true;
    }
  }
  return false;
}

bool Alive(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// ---------------------------------------------------------------- completions

void Notify(FakeChannel* ch, FakeCq* cq) {
  {
    std::lock_guard lock(ch->mu);
    ch->events.push_back(cq);
  }
  char c = 1;
  while (write(ch->write_fd, &c, 1) < 0 && errno == EINTR) {
  }
}

// Called by the worker without its context's mu. A completion finding the CQ full overruns it (it is lost, the
// CQ is in error from then on, and the worker moves the CQ's QPs to ERR): returns false.
bool PushWc(FakeCq* cq, const ibv_wc& wc) {
  FakeChannel* notify = nullptr;
  {
    std::lock_guard lock(cq->mu);
    if (cq->overrun) return false;
    if (cq->wcs.size() >= cq->capacity) {
      cq->overrun = true;
      return false;
    }
    cq->wcs.push_back(wc);
    if (cq->armed && cq->channel) {
      cq->armed = false;
      notify = cq->channel;
    }
  }
  if (notify) Notify(notify, cq);
  return true;
}

ibv_wc MakeWc(const Work& w, ibv_wc_status status, uint32_t bytes) {
  ibv_wc wc;
  memset(&wc, 0, sizeof(wc));
  wc.wr_id = w.wr_id;
  wc.status = status;
  wc.opcode = w.opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
  wc.byte_len = bytes;
  wc.qp_num = w.qp->qp.qp_num;
  wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0xfa;
  return wc;
}

// ---------------------------------------------------------------- execution of one WR (the context's worker)

// Moves a QP to ERR (with its context's mu held).
void ToErrorLocked(FakeQp* q) {
  if (q->state == IBV_QPS_ERR) return;
  q->state = IBV_QPS_ERR;
  q->qp.state = IBV_QPS_ERR;
  WriteQpRecord(q);
}

bool GidInList(const ibv_gid& g, const std::string& list) {
  std::string hex = GidHex(g);
  for (const auto& s : Split(list, ',')) {
    if (s == hex && hex != std::string(32, '0')) return true;
  }
  return false;
}

// The responder's port as its own process last saw it (its link state lives in its network namespace).
bool RemotePortUp(const std::string& host, const std::string& dev) {
  std::string v;
  if (!ReadFile(Provider::Get().Path("port/" + host + "." + dev), &v)) return true;  // never published
  return v.empty() || v[0] != '0';
}

// Publishes this process's view of its device's port (every process that opened the device writes the same).
void PublishPort(FakeContext* c, int* last) {
  const Provider& p = Provider::Get();
  int up = PortActive(c->dev, p.cfg().host) ? 1 : 0;
  if (up == *last) return;
  *last = up;
  WriteFileAtomic(Provider::Get().Path("port/" + p.cfg().host + "." + c->dev->spec.name), up ? "1\n" : "0\n");
}

// Runs one WR of an RTS QP; returns its completion status.
ibv_wc_status Execute(FakeContext* c, const Work& w, const Connection& conn, uint32_t* bytes) {
  const uint32_t qpn = conn.qpn, dest_qpn = conn.dest_qpn, pd_id = conn.pd;
  const ibv_gid& dgid = conn.dgid;
  Provider& p = Provider::Get();
  const std::string& state = p.cfg().state;
  const std::string& host = p.cfg().host;
  const Faults faults = ReadFaults(state, host, c->dev->spec.name);
  if (faults.wc_error >= 0) return static_cast<ibv_wc_status>(faults.wc_error);

  uint64_t total = 0;
  const bool is_read = w.opcode == IBV_WR_RDMA_READ;
  for (const ibv_sge& s : w.sges) {
    if (!p.CheckLocal(s.lkey, pd_id, s.addr, s.length, is_read ? IBV_ACCESS_LOCAL_WRITE : 0)) {
      return IBV_WC_LOC_PROT_ERR;
    }
    total += s.length;
  }
  if (total > (1ULL << 31)) return IBV_WC_LOC_LEN_ERR;
  *bytes = static_cast<uint32_t>(total);

  // The responder must be reachable; until the retry time is over, keep trying.
  const auto deadline = Clock::now() + p.cfg().retry;
  std::optional<QpRecord> remote;
  for (;;) {
    bool reachable = PortActive(c->dev, host);
    if (reachable) {
      remote = ReadQpRecord(dest_qpn);
      reachable = remote && (remote->state == IBV_QPS_RTR || remote->state == IBV_QPS_RTS) &&
                  remote->dest_qpn == qpn && GidInList(dgid, remote->gids) && Alive(remote->pid) &&
                  !ReadFaults(state, remote->host, remote->dev).port_down && RemotePortUp(remote->host, remote->dev);
    }
    if (reachable) break;
    if (Clock::now() >= deadline) return IBV_WC_RETRY_EXC_ERR;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    {
      std::lock_guard lock(c->mu);
      if (c->stop || w.qp->state != IBV_QPS_RTS) return IBV_WC_WR_FLUSH_ERR;
    }
  }

  // The two QPs of a connection must agree: each one's send PSN is the other's expected receive PSN, and both use
  // one path MTU. A PSN mismatch is NAKed as out of sequence until the retries run out; a packet longer than
  // the responder's MTU (or a short middle packet) is an invalid request.
  if (remote->rq_psn != conn.sq_psn || remote->sq_psn != conn.rq_psn) return IBV_WC_RETRY_EXC_ERR;
  if (remote->mtu != conn.mtu) {
    const uint64_t smaller = 256ULL << (std::min(remote->mtu, conn.mtu) - 1);
    if (total > smaller) return IBV_WC_REM_INV_REQ_ERR;
  }
  RemoteMr mr;
  const int need = is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
  if (!FindRemoteMr(remote->pid, w.rkey, &mr) || mr.pd != remote->pd || (mr.access & need) != need ||
      w.remote_addr < mr.addr || total > mr.len || w.remote_addr - mr.addr > mr.len - total) {
    return IBV_WC_REM_ACCESS_ERR;
  }
  std::vector<iovec> local;
  for (const ibv_sge& s : w.sges) local.push_back({reinterpret_cast<void*>(s.addr), s.length});
  iovec remote_iov{reinterpret_cast<void*>(w.remote_addr), static_cast<size_t>(total)};
  if (total == 0) return IBV_WC_SUCCESS;
  ssize_t n = is_read ? process_vm_readv(remote->pid, local.data(), local.size(), &remote_iov, 1, 0)
                      : process_vm_writev(remote->pid, local.data(), local.size(), &remote_iov, 1, 0);
  if (n == static_cast<ssize_t>(total)) {
    if (c->dev->spec.mbps > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(total / c->dev->spec.mbps)));
    }
    return IBV_WC_SUCCESS;
  }
  if (n < 0 && errno == ESRCH) return IBV_WC_RETRY_EXC_ERR;
  return IBV_WC_REM_ACCESS_ERR;  // the responder's memory is not mapped as registered
}

void ApplyQpErrorFault(FakeContext* c) {
  Provider& p = Provider::Get();
  uint64_t gen = ReadFaults(p.cfg().state, p.cfg().host, c->dev->spec.name).qp_error;
  std::lock_guard lock(c->mu);
  if (gen <= c->qp_error_applied) return;
  c->qp_error_applied = gen;
  for (FakeQp* q : c->qps) ToErrorLocked(q);
}

void WorkerLoop(FakeContext* c) {
  auto last_fault_check = Clock::now() - std::chrono::seconds(1);
  int port_published = -1;
  std::unique_lock lock(c->mu);
  for (;;) {
    c->cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return c->stop || !c->queue.empty(); });
    if (c->stop) return;
    if (Clock::now() - last_fault_check > std::chrono::milliseconds(20)) {
      lock.unlock();
      ApplyQpErrorFault(c);
      PublishPort(c, &port_published);
      lock.lock();
      last_fault_check = Clock::now();
    }
    if (c->queue.empty()) continue;
    Work w = std::move(c->queue.front());
    c->queue.pop_front();
    FakeQp* q = w.qp;
    c->current = q;  // destroy_qp waits until the worker is done with q (and its CQ)
    ibv_wc_status status = IBV_WC_WR_FLUSH_ERR;
    uint32_t bytes = 0;
    if (q->state == IBV_QPS_RTS) {
      Connection conn;
      conn.qpn = q->qp.qp_num;
      conn.dest_qpn = q->dest_qpn;
      conn.pd = q->pd->id;
      conn.sq_psn = q->sq_psn;
      conn.rq_psn = q->rq_psn;
      conn.mtu = static_cast<int>(q->mtu);
      conn.dgid = q->dgid;
      lock.unlock();
      status = Execute(c, w, conn, &bytes);
      Provider::Get().executed++;
      lock.lock();
      if (status != IBV_WC_SUCCESS) ToErrorLocked(q);  // an error (or a stop mid-retry) ends the connection
    }
    if (q->outstanding > 0) q->outstanding--;
    // Errors always complete; successes only when signaled.
    if (status != IBV_WC_SUCCESS || w.signaled) {
      ibv_wc wc = MakeWc(w, status, status == IBV_WC_SUCCESS ? bytes : 0);
      FakeCq* cq = q->send_cq;
      lock.unlock();
      const bool pushed = PushWc(cq, wc);
      lock.lock();
      if (!pushed) {  // an overrun CQ: every QP completing into it is in error (IBV_EVENT_CQ_ERR on hardware)
        for (FakeQp* other : c->qps) {
          if (other->send_cq == cq) ToErrorLocked(other);
        }
      }
    }
    c->current = nullptr;
    c->cv.notify_all();
  }
}

}  // namespace mooncake::te::rdma::fake::internal

namespace mooncake::te::rdma::fake::internal {

std::string SysfsPath(const DeviceSpec& d) {
  const Provider& p = Provider::Get();
  return p.cfg().state + "/sysfs/" + p.cfg().host + "." + d.name;
}

}  // namespace mooncake::te::rdma::fake::internal
