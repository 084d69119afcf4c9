#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_INTERNAL_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_INTERNAL_H_

// The FAKE verbs provider's internals (fake_verbs.h describes the provider), shared by fake_fabric.cc (the
// shared state directory, ports, GIDs and the worker that executes work requests) and fake_verbs.cc (the verbs
// entry points). Not for use outside this folder.

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "transfer_engine/transport/rdma/verbs_api.h"

namespace mooncake::te::rdma::fake::internal {

using Clock = std::chrono::steady_clock;

constexpr int kGidTableLen = 4;

// ---------------------------------------------------------------- configuration

struct DeviceSpec {
  std::string name;
  std::string netdev;
  bool ib = false;
  bool down = false;
  bool nogid = false;
  bool is_switch = false;
  uint64_t max_mr = 1ULL << 40;
  double mbps = 0;  // emulated link rate in MB/s (0: as fast as memory)
  int numa = -1;    // the NUMA node its sysfs entry reports (-1: none, as for a virtual device)
  int pcie_root = -1;  // the bus number of the PCIe root it is under (-1: its sysfs entry names none)
};

struct Config {
  bool valid = false;
  std::string state;
  std::string host = "host0";
  std::vector<DeviceSpec> devices;
  std::chrono::milliseconds retry{500};
  bool dmabuf = true;    // MC_RDMA_FAKE_DMABUF (default 1): reg_dmabuf_mr works; 0: EOPNOTSUPP
  bool peermem = false;  // MC_RDMA_FAKE_PEERMEM=1: a peer-memory client is "loaded" (peer_memory() says 1)
};

struct Faults {
  bool port_down = false;
  int wc_error = -1;
  uint64_t qp_error = 0;
};

// Files, configuration, netdevs (fake_fabric.cc).
std::vector<std::string> Split(const std::string& s, char sep);
Config ReadConfig();
pid_t GlobalPid();
bool ReadFile(const std::string& path, std::string* out);
bool WriteFileAtomic(const std::string& path, const std::string& text);
Faults ReadFaults(const std::string& state, const std::string& host, const std::string& dev);
bool NetdevUp(const std::string& netdev);
int NetdevMtu(const std::string& netdev);
std::optional<in_addr> NetdevIpv4(const std::string& netdev);
uint64_t Hash(const std::string& s);
std::string GidHex(const ibv_gid& g);

// ---------------------------------------------------------------- objects

struct FakeDevice {
  ibv_device dev;  // first: the ibv_device* handed out points here
  DeviceSpec spec;
};

struct FakeChannel;

struct FakeCq {
  ibv_cq cq;
  std::mutex mu;
  std::deque<ibv_wc> wcs;
  size_t capacity = 0;   // cqe: a completion arriving while this many wait overruns the CQ
  bool overrun = false;  // then every poll fails (as a CQ in error does) and its QPs move to ERR
  bool armed = false;
  FakeChannel* channel = nullptr;
};

struct FakeChannel {
  ibv_comp_channel ch;
  int write_fd = -1;
  std::mutex mu;
  std::deque<FakeCq*> events;
};

struct FakePd {
  ibv_pd pd;
  uint32_t id = 0;
};

struct FakeMr {
  ibv_mr mr;  // mr.lkey == mr.rkey (as on mlx5): one key; remote use is checked against `access`
  int access = 0;
  uint32_t pd_id = 0;
};

struct FakeContext;

struct FakeQp {
  ibv_qp qp;
  FakeContext* fctx = nullptr;
  FakePd* pd = nullptr;
  FakeCq* send_cq = nullptr;
  uint32_t max_send_wr = 0;
  uint32_t max_sge = 0;
  bool sq_sig_all = false;
  // Guarded by the context's mu:
  ibv_qp_state state = IBV_QPS_RESET;
  uint8_t port = 0;
  int access = 0;
  uint32_t dest_qpn = 0;
  ibv_gid dgid{};
  ibv_mtu mtu = IBV_MTU_1024;
  uint32_t rq_psn = 0;  // set at RTR: the PSN the peer's first packet must carry
  uint32_t sq_psn = 0;  // set at RTS: the PSN of our first packet
  uint32_t outstanding = 0;
};

struct Work {
  FakeQp* qp;
  uint64_t wr_id;
  ibv_wr_opcode opcode;
  bool signaled;
  uint64_t remote_addr;
  uint32_t rkey;
  std::vector<ibv_sge> sges;
};

struct FakeContext {
  ibv_context ctx;  // first
  FakeDevice* dev = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Work> queue;
  std::set<FakeQp*> qps;
  FakeQp* current = nullptr;  // the QP whose WR the worker is executing
  uint64_t qp_error_applied = 0;
  bool stop = false;
  std::thread worker;
};

// ---------------------------------------------------------------- the process-wide provider

class Provider {
 public:
  static Provider& Get() {
    static Provider* p = new Provider();  // never destroyed: contexts' threads may outlive static destruction
    return *p;
  }

  bool Init() {
    std::lock_guard lock(mu_);
    if (!initialized_ || !cfg_.valid) {  // without a state directory, look again next time
      cfg_ = ReadConfig();
      if (!cfg_.valid) return false;
      for (const auto& spec : cfg_.devices) {
        auto* d = new FakeDevice();
        memset(&d->dev, 0, sizeof(d->dev));
        d->spec = spec;
        d->dev.node_type = spec.is_switch ? IBV_NODE_SWITCH : IBV_NODE_CA;
        d->dev.transport_type = IBV_TRANSPORT_IB;
        snprintf(d->dev.name, sizeof(d->dev.name), "%s", spec.name.c_str());
        snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "fake_uverbs%zu", devices_.size());
        snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "%s/sysfs/%s.%s", cfg_.state.c_str(),
                 cfg_.host.c_str(), spec.name.c_str());
        devices_.push_back(d);
      }
      initialized_ = true;
      uint64_t seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ (uint64_t(getpid()) << 32);
      rng_.seed(seed);
    }
    return cfg_.valid;
  }

  const Config& cfg() const { return cfg_; }
  // Recomputed after a fork (the child is another process of the fabric).
  pid_t pid() {
    pid_t local = getpid();
    if (local != local_pid_.load()) {
      pid_.store(GlobalPid());
      local_pid_.store(local);
    }
    return pid_.load();
  }
  std::vector<FakeDevice*> devices() {
    std::lock_guard lock(mu_);
    return devices_;
  }

  uint32_t Random32() {
    std::lock_guard lock(mu_);
    return static_cast<uint32_t>(rng_());
  }

  std::string Path(const std::string& sub) const { return cfg_.state + "/" + sub; }

  // --- local MRs (guarded by mu_) and this process's MR table file (every MR with its access flags: a peer's
  // use of a key is checked against them, so a local-only MR's key is refused remotely)
  /// Gives `mr` one key, unique among this process's MRs, as both lkey and rkey (mlx5 does the same: code that
  /// publishes a local-only MR's lkey hands peers a key that names real memory).
  void AddMr(FakeMr* mr) {
    std::lock_guard lock(mu_);
    uint32_t key;
    do {
      key = static_cast<uint32_t>(rng_()) | 1u;
    } while (mrs_.count(key));
    mr->mr.lkey = mr->mr.rkey = key;
    mrs_[key] = mr;
    WriteMrTableLocked();
  }
  void RemoveMr(const FakeMr* mr) {
    std::lock_guard lock(mu_);
    mrs_.erase(mr->mr.lkey);
    WriteMrTableLocked();
  }
  // Whether [addr, addr+len) lies in a local MR with lkey `key` of PD `pd` granting `access`.
  bool CheckLocal(uint32_t key, uint32_t pd, uint64_t addr, uint64_t len, int access) {
    std::lock_guard lock(mu_);
    auto it = mrs_.find(key);
    if (it == mrs_.end()) return false;
    const FakeMr* m = it->second;
    uint64_t start = reinterpret_cast<uint64_t>(m->mr.addr);
    return m->pd_id == pd && (m->access & access) == access && addr >= start && len <= m->mr.length &&
           addr - start <= m->mr.length - len;
  }

  uint32_t NextPdId() {
    std::lock_guard lock(mu_);
    return ++pd_ids_;
  }

  std::atomic<unsigned long long> executed{0};

 private:
  void WriteMrTableLocked() {
    std::ostringstream out;
    for (const auto& [key, m] : mrs_) {
      out << key << ' ' << m->pd_id << ' ' << reinterpret_cast<uint64_t>(m->mr.addr) << ' ' << m->mr.length << ' '
          << m->access << '\n';
    }
    WriteFileAtomic(Path("mr/" + std::to_string(pid())), out.str());
  }

  std::mutex mu_;
  bool initialized_ = false;
  Config cfg_;
  std::atomic<pid_t> pid_{0};
  std::atomic<pid_t> local_pid_{0};
  std::vector<FakeDevice*> devices_;
  std::map<uint32_t, FakeMr*> mrs_;  // by key (lkey == rkey)
  uint32_t pd_ids_ = 0;
  std::mt19937_64 rng_;
};

// ---------------------------------------------------------------- helpers (fake_fabric.cc)

struct QpRecord {
  pid_t pid = 0;
  int state = 0;
  uint32_t dest_qpn = 0;
  uint32_t pd = 0;
  uint32_t rq_psn = 0, sq_psn = 0;
  int mtu = 0;
  std::string host, dev, gids;
};

struct RemoteMr {
  uint32_t key, pd;
  uint64_t addr, len;
  int access;
};

std::string QpPath(uint32_t qpn);
bool Alive(pid_t pid);
bool PortActive(const FakeDevice* d, const std::string& host);
ibv_mtu MtuFor(int bytes);
bool GidEntry(const FakeDevice* d, uint32_t index, ibv_gid* gid, ibv_gid_type* type);
std::string GidList(const FakeDevice* d);
void WriteQpRecord(const FakeQp* q);
std::optional<QpRecord> ReadQpRecord(uint32_t qpn);
bool FindRemoteMr(pid_t pid, uint32_t rkey, RemoteMr* out);
void Notify(FakeChannel* ch, FakeCq* cq);
bool PushWc(FakeCq* cq, const ibv_wc& wc);
ibv_wc MakeWc(const Work& w, ibv_wc_status status, uint32_t bytes);
void ToErrorLocked(FakeQp* q);
bool GidInList(const ibv_gid& g, const std::string& list);
bool RemotePortUp(const std::string& host, const std::string& dev);
void PublishPort(FakeContext* c, int* last);
/// What the requester's QP says about its connection when one of its WRs runs (copied under the context's mu).
struct Connection {
  uint32_t qpn = 0, dest_qpn = 0, pd = 0;
  uint32_t sq_psn = 0, rq_psn = 0;
  int mtu = 0;
  ibv_gid dgid{};
};
ibv_wc_status Execute(FakeContext* c, const Work& w, const Connection& conn, uint32_t* bytes);
void ApplyQpErrorFault(FakeContext* c);
void WorkerLoop(FakeContext* c);
/// The fake sysfs directory of a device (its ibdev_path): <state>/sysfs/<host>.<device>, with device/numa_node.
/// With a PCIe root R, `device` is a link to <state>/sysfs/<host>/devices/pci0000:R/0000:(R+1):00.<n> (as
/// sysfs links a device under its root), and <state>/sysfs/<host>/devices lists the roots of the host's devices.
std::string SysfsPath(const DeviceSpec& d);

}  // namespace mooncake::te::rdma::fake::internal

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_INTERNAL_H_
