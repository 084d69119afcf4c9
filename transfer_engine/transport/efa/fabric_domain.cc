#include "transfer_engine/transport/efa/fabric_domain.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>

#include "transfer_engine/common/log.h"
#include "transfer_engine/common/shm_names.h"

namespace mooncake::te::efa {

namespace {

using Clock = std::chrono::steady_clock;

std::string ToHex(const uint8_t* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[p[i] >> 4]);
    s.push_back(kDigits[p[i] & 15]);
  }
  return s;
}

bool FromHex(const std::string& s, std::vector<uint8_t>* out) {
  if (s.empty() || s.size() % 2 != 0 || s.size() > 1024) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out->clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    int hi = nibble(s[i]), lo = nibble(s[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<uint8_t>(hi << 4 | lo));
  }
  return true;
}

bool InList(const std::string& list, const std::string& name) {
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == name) return true;
  }
  return false;
}

std::string SourceIp(const struct fi_info* info) {
  if (info->src_addr == nullptr || info->addr_format != FI_SOCKADDR_IN ||
      info->src_addrlen < sizeof(struct sockaddr_in)) {
    return "";
  }
  char text[INET_ADDRSTRLEN] = {0};
  const auto* sin = static_cast<const struct sockaddr_in*>(info->src_addr);
  return inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text)) ? text : "";
}

FabricOp* OpOf(void* op_context) { return reinterpret_cast<FabricOp::Slot*>(op_context)->op; }

}  // namespace

Status NotPostedInTime() {
  return Status(ErrorCode::kStaleMetadata, "efa: the epoch lease ended before the operation could be posted");
}

FabricMr::~FabricMr() {
  if (mr_ != nullptr) fi_close(&mr_->fid);
}

void* FabricMr::desc() const { return fi_mr_desc(mr_); }

namespace {

bool IsLoopback(const struct fi_info* i, const std::string& name) {
  if (name == "lo") return true;
  if (i->src_addr == nullptr) return false;
  if (i->addr_format == FI_SOCKADDR_IN && i->src_addrlen >= sizeof(struct sockaddr_in)) {
    const auto* sin = static_cast<const struct sockaddr_in*>(i->src_addr);
    return (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
  }
  if (i->addr_format == FI_SOCKADDR_IN6 && i->src_addrlen >= sizeof(struct sockaddr_in6)) {
    const auto* sin6 = static_cast<const struct sockaddr_in6*>(i->src_addr);
    return IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
  }
  return false;
}

// The provider's entry for `base`'s domain (same name and address format) when asked with `hints` plus
// FI_HMEM (device memory), duplicated; null when it offers no FI_HMEM there. Its attributes may differ from
// the host-only entry (shm: no inject), so it is what the domain is then opened with.
struct fi_info* HmemInfo(const FabricApi* api, uint32_t version, const struct fi_info* hints,
                         const struct fi_info* base) {
  struct fi_info* h = api->dupinfo(hints);
  if (h == nullptr) return nullptr;
  h->caps |= FI_HMEM;
  h->domain_attr->mr_mode |= FI_MR_HMEM;
  const std::string domain = base->domain_attr && base->domain_attr->name ? base->domain_attr->name : "";
  struct fi_info* list = nullptr;
  int rc = api->getinfo(version, nullptr, nullptr, 0, h, &list);
  api->freeinfo(h);
  struct fi_info* found = nullptr;
  for (struct fi_info* i = list; rc == 0 && i != nullptr && found == nullptr; i = i->next) {
    const std::string name = i->domain_attr && i->domain_attr->name ? i->domain_attr->name : "";
    if ((i->caps & FI_HMEM) == 0 || name != domain || i->addr_format != base->addr_format) continue;
    if (SourceIp(i) != SourceIp(base)) continue;
    found = api->dupinfo(i);
  }
  if (list) api->freeinfo(list);
  return found;
}

}  // namespace

StatusOr<std::shared_ptr<FabricDomain>> FabricDomain::Open(const FabricApi* api, const Options& options) {
  Options one = options;
  one.max_domains = 1;
  auto all = OpenAll(api, one);
  if (!all.ok()) return all.status();
  return all->front();
}

StatusOr<std::vector<std::shared_ptr<FabricDomain>>> FabricDomain::OpenAll(const FabricApi* api,
                                                                          const Options& options) {
  struct fi_info* hints = api->dupinfo(nullptr);
  if (hints == nullptr) return Status(ErrorCode::kMemory, "fi_allocinfo failed");
  hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->fabric_attr->prov_name = strdup(options.provider.c_str());  // freed by fi_freeinfo
  const uint32_t version = api->RequestVersion();

  // Writes that complete once the data is at the target, where the provider offers it; else the transport
  // confirms remote visibility itself (see EfaTransport).
  struct fi_info* list = nullptr;
  int rc = -FI_ENODATA;
  if (options.delivery_complete) {
    hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    rc = api->getinfo(version, nullptr, nullptr, 0, hints, &list);
  }
  bool delivery_complete = rc == 0;
  if (rc != 0) {
    hints->tx_attr->op_flags = 0;
    rc = api->getinfo(version, nullptr, nullptr, 0, hints, &list);
  }
  if (rc != 0) {
    api->freeinfo(hints);
    return Status(ErrorCode::kNotImplemented,
                  "libfabric has no RDM endpoint with RMA for provider '" + options.provider + "' (" +
                      api->Error("fi_getinfo", rc) + ")");
  }
  // One entry per domain name, IPv4 preferred (tcp lists an interface once per address family).
  std::vector<std::pair<std::string, struct fi_info*>> domains;
  std::string seen;
  for (struct fi_info* i = list; i != nullptr; i = i->next) {
    std::string name = i->domain_attr && i->domain_attr->name ? i->domain_attr->name : "";
    auto it = std::find_if(domains.begin(), domains.end(), [&](const auto& d) { return d.first == name; });
    if (it == domains.end()) {
      seen += (seen.empty() ? "" : ", ") + name;
      domains.emplace_back(name, i);
    } else if (it->second->addr_format != FI_SOCKADDR_IN && i->addr_format == FI_SOCKADDR_IN) {
      it->second = i;
    }
  }
  std::vector<struct fi_info*> chosen;
  if (!options.domain_filter.empty()) {
    for (const auto& [name, i] : domains) {
      if (InList(options.domain_filter, name)) chosen.push_back(i);
    }
  } else {
    struct fi_info* preferred = nullptr;
    for (const auto& [name, i] : domains) {
      if (!options.prefer_ip.empty() && SourceIp(i) == options.prefer_ip) preferred = i;
    }
    if (preferred) chosen.push_back(preferred);
    const bool loopback_only = preferred && IsLoopback(preferred, preferred->domain_attr->name);
    for (const auto& [name, i] : domains) {
      if (!loopback_only && i != preferred && !IsLoopback(i, name)) chosen.push_back(i);
    }
    if (chosen.empty() && !domains.empty()) chosen.push_back(domains.front().second);
  }
  if (chosen.empty()) {
    api->freeinfo(list);
    api->freeinfo(hints);
    return Status(ErrorCode::kDeviceNotFound, "no libfabric domain of provider '" + options.provider +
                                                  "' matches the device filter '" + options.domain_filter +
                                                  "' (domains: " + seen + ")");
  }
  if (options.max_domains > 0 && chosen.size() > static_cast<size_t>(options.max_domains)) {
    chosen.resize(options.max_domains);
  }
  std::vector<std::shared_ptr<FabricDomain>> out;
  for (struct fi_info* c : chosen) {
    // Opened with FI_HMEM where the provider offers it for this domain, so device memory can be registered.
    struct fi_info* info = options.hmem ? HmemInfo(api, version, hints, c) : nullptr;
    const bool hmem = info != nullptr;
    const bool loopback = IsLoopback(c, c->domain_attr->name ? c->domain_attr->name : "");
    if (info == nullptr) info = api->dupinfo(c);
    if (info == nullptr) {
      api->freeinfo(list);
      api->freeinfo(hints);
      return Status(ErrorCode::kMemory, "fi_dupinfo failed");
    }
    std::shared_ptr<FabricDomain> d(new FabricDomain(api, options));
    d->info_.delivery_complete = delivery_complete;
    d->info_.hmem = hmem;
    d->info_.loopback = loopback;
    d->info_.source_ip = SourceIp(c);
    Status st = d->Init(info);
    if (!st.ok()) {
      api->freeinfo(list);
      api->freeinfo(hints);
      return st;
    }
    out.push_back(std::move(d));
  }
  api->freeinfo(list);
  api->freeinfo(hints);
  return out;
}

Status FabricDomain::Init(struct fi_info* info) {
  fi_ = info;
  info_.provider = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "";
  info_.domain = info->domain_attr->name ? info->domain_attr->name : "";
  info_.mr_mode = info->domain_attr->mr_mode;
  info_.virt_addr = (info_.mr_mode & FI_MR_VIRT_ADDR) != 0;
  info_.prov_key = (info_.mr_mode & FI_MR_PROV_KEY) != 0;
  info_.max_msg_size = info->ep_attr->max_msg_size;
  info_.tx_size = info->tx_attr->size;
  if (info_.tx_size > 0 && static_cast<size_t>(options_.max_outstanding) > info_.tx_size) {
    options_.max_outstanding = static_cast<int>(info_.tx_size);
  }
  auto fail = [&](const char* what, int rc) {
    return Status(ErrorCode::kContext, info_.provider + " " + info_.domain + ": " + api_->Error(what, rc));
  };
  int rc = api_->fabric(info->fabric_attr, &fabric_, nullptr);
  if (rc != 0) return fail("fi_fabric", rc);
  rc = fi_domain(fabric_, info, &domain_, nullptr);
  if (rc != 0) return fail("fi_domain", rc);
  struct fi_av_attr av_attr {};
  av_attr.type = FI_AV_TABLE;
  rc = fi_av_open(domain_, &av_attr, &av_, nullptr);
  if (rc != 0) return fail("fi_av_open", rc);
  struct fi_cq_attr cq_attr {};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  // Sleeping in fi_cq_sread is used only where the wait object also wakes for traffic that needs progress
  // here (tcp's sockets, verbs' completion channel). The shm provider's wait misses a peer's requests (its
  // transfers then stall until something else wakes the thread), so it and providers not verified are polled.
  const bool wait_covers_peers = options_.cq_wait >= 0 ? options_.cq_wait == 1
                                                      : info_.provider.rfind("tcp", 0) == 0 ||
                                                            info_.provider.rfind("verbs", 0) == 0;
  cq_attr.wait_obj = wait_covers_peers ? FI_WAIT_UNSPEC : FI_WAIT_NONE;
  rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
  info_.cq_wait = rc == 0 && wait_covers_peers;
  if (rc != 0) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
    if (rc != 0) return fail("fi_cq_open", rc);
  }
  if (!info_.cq_wait && (info->caps & FI_RMA_EVENT) != 0) {
    // Counts the RMA peers do here, so the polling thread notices a peer at work (see RemoteActivity).
    struct fi_cntr_attr cntr_attr {};
    cntr_attr.events = FI_CNTR_EVENTS_COMP;
    cntr_attr.wait_obj = FI_WAIT_NONE;
    if (fi_cntr_open(domain_, &cntr_attr, &remote_cntr_, nullptr) != 0) remote_cntr_ = nullptr;
  }
  if (info_.provider.rfind("shm", 0) == 0 && info->addr_format == FI_ADDR_STR) {
    // shm names its region in /dev/shm after the process id by default; processes of other PID namespaces
    // (containers, sandboxes) sharing /dev/shm then collide (fi_enable: -FI_EBUSY). A random name does not.
    // The name starts with this process's owner tag, so regions of killed processes are found and removed
    // (once per process, before the first region of its own).
    static const int stale = RemoveStaleShmFiles("mc-");
    if (stale > 0) MC_LOG(kInfo) << "efa: removed " << stale << " shm region file(s) of exited processes from /dev/shm";
    std::random_device rd;
    char name[128];
    snprintf(name, sizeof(name), "fi_shm://mc-%s-%08x%08x", ShmOwnerTag().c_str(), rd(), rd());
    free(info->src_addr);
    info->src_addr = strdup(name);
    info->src_addrlen = strlen(name) + 1;
  }
  rc = fi_endpoint(domain_, info, &ep_, nullptr);
  if (rc != 0) return fail("fi_endpoint", rc);
  rc = fi_ep_bind(ep_, &av_->fid, 0);
  if (rc != 0) return fail("fi_ep_bind(av)", rc);
  rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return fail("fi_ep_bind(cq)", rc);
  if (remote_cntr_ != nullptr && fi_ep_bind(ep_, &remote_cntr_->fid, FI_REMOTE_READ | FI_REMOTE_WRITE) != 0) {
    fi_close(&remote_cntr_->fid);  // polled with idle naps only
    remote_cntr_ = nullptr;
  }
  info_.remote_events = remote_cntr_ != nullptr;
  rc = fi_enable(ep_);
  if (rc != 0) return fail("fi_enable", rc);
  uint8_t name[512];
  size_t len = sizeof(name);
  rc = fi_getname(&ep_->fid, name, &len);
  if (rc != 0) return fail("fi_getname", rc);
  info_.address = ToHex(name, len);
  progress_ = std::thread([this] { Progress(); });
  MC_LOG(kInfo) << "efa: provider " << info_.provider << ", domain " << info_.domain << ", mr_mode 0x" << std::hex
                << info_.mr_mode << std::dec << ", tx depth " << info_.tx_size << ", "
                << (info_.cq_wait ? "sleeping" : "polling") << " completion queue"
                << (info_.remote_events ? " (woken by peers' RMA)" : "")
                << (info_.delivery_complete ? ", delivery-complete writes" : "") << (info_.hmem ? ", FI_HMEM" : "");
  return Status::Ok();
}

FabricDomain::~FabricDomain() {
  Stop(std::chrono::milliseconds(0));
  if (av_) fi_close(&av_->fid);
  if (remote_cntr_) fi_close(&remote_cntr_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (fi_) api_->freeinfo(fi_);
}

StatusOr<std::unique_ptr<FabricMr>> FabricDomain::Register(void* addr, size_t len, RemoteAccess remote,
                                                           const HmemTarget& hmem) {
  if (ep_ == nullptr) return Status(ErrorCode::kContext, "the efa domain is stopped");
  const bool device = hmem.iface != FI_HMEM_SYSTEM;
  if (device && !info_.hmem) {
    return Status(ErrorCode::kNotImplemented, info_.provider + " " + info_.domain + " was not opened with FI_HMEM");
  }
  uint64_t access = FI_READ | FI_WRITE;
  if (remote != RemoteAccess::kNone) access |= FI_REMOTE_READ;
  if (remote == RemoteAccess::kReadWrite) access |= FI_REMOTE_WRITE;
  // Providers that do not assign keys need one unique per registration (the same key twice is -FI_ENOKEY).
  const uint64_t requested = info_.prov_key ? 0 : next_key_.fetch_add(1);
  struct fid_mr* mr = nullptr;
  int rc;
  if (!device) {
    rc = fi_mr_reg(domain_, addr, len, access, 0, requested, 0, &mr, nullptr);
    if (rc != 0) return Status(ErrorCode::kMemory, api_->Error("fi_mr_reg", rc));
  } else {
    struct iovec iov {addr, len};
    struct fi_mr_attr attr {};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.requested_key = requested;
    attr.iface = hmem.iface;
    attr.device.reserved = hmem.device;
    if (hmem.iface == FI_HMEM_CUDA) attr.device.cuda = static_cast<int>(hmem.device);
    rc = fi_mr_regattr(domain_, &attr, 0, &mr);
    if (rc != 0) return Status(ErrorCode::kMemory, api_->Error("fi_mr_regattr", rc));
  }
  if (info_.mr_mode & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc != 0) {
      fi_close(&mr->fid);
      return Status(ErrorCode::kMemory, api_->Error("fi_mr_bind/enable", rc));
    }
  }
  return std::make_unique<FabricMr>(shared_from_this(), mr, fi_mr_key(mr));
}

StatusOr<fi_addr_t> FabricDomain::Insert(const std::string& hex_address) {
  std::vector<uint8_t> bytes;
  if (!FromHex(hex_address, &bytes)) {
    return Status(ErrorCode::kMalformedJson, "malformed fabric address '" + hex_address.substr(0, 64) + "'");
  }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  std::lock_guard lock(post_mu_);  // nothing is posted to an index while it changes hands
  int rc = fi_av_insert(av_, bytes.data(), 1, &addr, 0, nullptr);
  if (rc != 1 || addr == FI_ADDR_NOTAVAIL) {
    return Status(ErrorCode::kEndpoint, api_->Error("fi_av_insert", rc < 0 ? rc : -FI_EINVAL));
  }
  removed_.erase(addr);
  return addr;
}

void FabricDomain::Remove(fi_addr_t addr) {
  std::lock_guard lock(post_mu_);
  if (!removed_.insert(addr).second) return;
  fi_av_remove(av_, &addr, 1, 0);
  // Queued operations to it fail on the progress thread (the caller may hold its own locks).
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->dest == addr) {
      dropped_.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  if (!dropped_.empty()) Wake();
}

void FabricDomain::Wake() {
  if (cq_ && info_.cq_wait) fi_cq_signal(cq_);
}

void FabricDomain::Finish(std::unique_ptr<FabricOp> op, const Status& st) {
  auto done = std::move(op->done);
  const bool late = op->late;
  op.reset();
  if (done) done(late ? NotPostedInTime() : st);
}

void FabricDomain::FinishAll(std::vector<std::unique_ptr<FabricOp>> ops, const Status& st) {
  for (auto& op : ops) Finish(std::move(op), st);
}

void FabricDomain::Post(std::unique_ptr<FabricOp> op) {
  op->slot.op = op.get();
  op->deadline = Clock::now() + options_.op_timeout;
  std::vector<std::unique_ptr<FabricOp>> failed;
  bool stopping = false;
  {
    std::lock_guard lock(post_mu_);
    stopping = stopping_;
    if (stopping_) {
      failed.push_back(std::move(op));
    } else {
      queue_.push_back(std::move(op));
      failed = PostQueuedLocked();
      const bool driven = drivers_.load() > 0;
      if (!info_.cq_wait || !driven) {
        std::lock_guard nap(park_mu_);
        if (!driven) {
          // Posted outside a drive: nobody else reaps its completion, so a linger after a drive ends now.
          drive_ended_ = {};
          park_cv_.notify_one();
        }
        if (!info_.cq_wait) {
          // Polling: an idle nap lasts efa.idle_poll_us; the new operation needs progress now (and a nap
          // about to begin is skipped).
          kick_ = true;
          if (idle_nap_) park_cv_.notify_one();
        }
      }
      // The progress thread wakes at least every 100 ms for deadlines, and for completions and peers' traffic
      // by itself; only a full provider needs it now (it retries after reaping).
      if (!queue_.empty()) Wake();
    }
  }
  FinishAll(std::move(failed), stopping ? Status(ErrorCode::kSocket, "the efa transport is shutting down")
                                        : Status(ErrorCode::kSocket, "efa: posting failed (the peer's address was "
                                                                     "removed, or see the log)"));
}

std::vector<std::unique_ptr<FabricOp>> FabricDomain::PostQueuedLocked() {
  std::vector<std::unique_ptr<FabricOp>> failed;
  while (!queue_.empty() && posted_.load(std::memory_order_relaxed) < static_cast<size_t>(options_.max_outstanding)) {
    FabricOp* op = queue_.front().get();
    if (op->post_by != Clock::time_point{} && Clock::now() > op->post_by) {
      // The lease it was checked under ended while it waited: the transport checks the epoch again.
      op->late = true;
      failed.push_back(std::move(queue_.front()));
      queue_.pop_front();
      continue;
    }
    if (removed_.count(op->dest) != 0) {
      // Posting to a removed address is undefined in providers (tcp;ofi_rxm crashed): the op fails instead.
      failed.push_back(std::move(queue_.front()));
      queue_.pop_front();
      continue;
    }
    ssize_t rc = op->kind == FabricOp::Kind::kWrite
                     ? fi_write(ep_, op->local, op->length, op->local_desc, op->dest, op->remote_addr,
                                op->remote_key, &op->slot.context)
                     : fi_read(ep_, op->local, op->length, op->local_desc, op->dest, op->remote_addr,
                               op->remote_key, &op->slot.context);
    if (rc == -FI_EAGAIN) break;
    std::unique_ptr<FabricOp> owned = std::move(queue_.front());
    queue_.pop_front();
    if (rc != 0) {
      MC_LOG(kWarning) << "efa: " << api_->Error(op->kind == FabricOp::Kind::kWrite ? "fi_write" : "fi_read",
                                                  static_cast<int>(rc));
      failed.push_back(std::move(owned));
      continue;
    }
    op->deadline = Clock::now() + options_.op_timeout;
    live_.emplace(op, std::move(owned));
    posted_.fetch_add(1, std::memory_order_relaxed);
  }
  return failed;
}

void FabricDomain::CheckDeadlines() {
  auto now = Clock::now();
  if (now < next_deadline_check_) return;
  next_deadline_check_ = now + std::chrono::milliseconds(100);
  std::vector<std::unique_ptr<FabricOp>> expired;
  std::vector<fi_addr_t> dests;
  {
    std::lock_guard lock(post_mu_);
    // Queued ones (the provider kept answering -FI_EAGAIN, e.g. while it reconnects to a dead peer) are ours.
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->deadline > now) {
        ++it;
        continue;
      }
      dests.push_back((*it)->dest);
      expired.push_back(std::move(*it));
      it = queue_.erase(it);
    }
    for (auto it = live_.begin(); it != live_.end();) {
      if (it->second->deadline > now) {
        ++it;
        continue;
      }
      // Still the provider's: its memory stays allocated until the provider reports it (or the endpoint
      // closes); only its slice is failed now.
      FabricOp* op = it->first;
      auto copy = std::make_unique<FabricOp>();
      copy->done = std::move(op->done);
      dests.push_back(op->dest);
      expired.push_back(std::move(copy));
      abandoned_.emplace(op, std::move(it->second));
      it = live_.erase(it);
      posted_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (expired.empty()) return;
  for (fi_addr_t d : dests) {
    if (on_timeout_) on_timeout_(d);
  }
  FinishAll(std::move(expired),
            Status(ErrorCode::kTimeout, "efa operation not completed in " +
                                            std::to_string(options_.op_timeout.count()) + " ms"));
}

size_t FabricDomain::Poll(int wait_ms) {
  struct fi_cq_entry entries[32];
  const ssize_t n = wait_ms > 0 && info_.cq_wait ? fi_cq_sread(cq_, entries, 32, nullptr, wait_ms)
                                                 : fi_cq_read(cq_, entries, 32);
  size_t finished = Reap(n, entries);
  // Another driver may sleep in the queue for a completion this call took (its done ran here).
  if (finished > 0 && drivers_.load() > 1) Wake();
  if (n <= 0) {
    std::vector<std::unique_ptr<FabricOp>> failed;
    {
      std::lock_guard lock(post_mu_);
      failed = PostQueuedLocked();
    }
    finished += failed.size();
    FinishAll(std::move(failed), Status(ErrorCode::kSocket, "efa: posting failed"));
  }
  return finished;
}

void FabricDomain::BeginDrive() {
  drives_.fetch_add(1, std::memory_order_relaxed);
  drivers_.fetch_add(1);
  // Pairs with the progress thread's in_wait_ store then drivers_ load: one of the two sees the other.
  if (in_wait_.load()) Wake();
}

void FabricDomain::EndDrive() {
  const bool last = drivers_.fetch_sub(1) == 1;
  bool outstanding;
  {
    std::lock_guard lock(post_mu_);
    outstanding = !live_.empty() || !queue_.empty();
  }
  std::lock_guard lock(park_mu_);
  if (last) drive_ended_ = Clock::now();
  if (outstanding) {
    unpark_ = true;  // their completions and deadlines are the progress thread's now
    park_cv_.notify_one();
  }
}

FabricDomain::Park FabricDomain::Parked() {
  std::unique_lock lock(park_mu_);
  if (stop_thread_.load() || unpark_) {
    unpark_ = false;
    return Park::kOut;
  }
  if (drivers_.load() > 0) {
    park_cv_.wait_for(lock, kDriveLinger);  // the caller loops: the next call looks again
    return Park::kDriven;
  }
  const auto since = Clock::now() - drive_ended_;
  if (since >= kDriveLinger) return Park::kOut;
  park_cv_.wait_for(lock, std::min<Clock::duration>(kLingerPoll, kDriveLinger - since));
  return Park::kLinger;
}

bool FabricDomain::RemoteActivity() {
  if (remote_cntr_ == nullptr) return false;
  const uint64_t now = fi_cntr_read(remote_cntr_);
  const bool moved = now != remote_seen_;
  remote_seen_ = now;
  return moved;
}

size_t FabricDomain::Reap(ssize_t n, struct fi_cq_entry* entries) {
  if (n > 0) {
    std::vector<std::unique_ptr<FabricOp>> done, failed;
    {
      std::lock_guard lock(post_mu_);
      for (ssize_t i = 0; i < n; ++i) {
        FabricOp* op = OpOf(entries[i].op_context);
        if (auto it = live_.find(op); it != live_.end()) {
          done.push_back(std::move(it->second));
          live_.erase(it);
          posted_.fetch_sub(1, std::memory_order_relaxed);
        } else {
          abandoned_.erase(op);
        }
      }
      failed = PostQueuedLocked();
    }
    const size_t count = done.size() + failed.size();
    FinishAll(std::move(done), Status::Ok());
    FinishAll(std::move(failed), Status(ErrorCode::kSocket, "efa: posting failed"));
    return count;
  }
  if (n != -FI_EAVAIL) return 0;
  struct fi_cq_err_entry err {};
  if (fi_cq_readerr(cq_, &err, 0) <= 0) return 0;
  char text[256] = {0};
  const char* prov = fi_cq_strerror(cq_, err.prov_errno, err.err_data, text, sizeof(text));
  Status st(ErrorCode::kSocket, std::string("efa completion error: ") + api_->strerror(err.err) +
                                    (prov && *prov ? std::string(" (") + prov + ")" : ""));
  std::unique_ptr<FabricOp> op;
  {
    std::lock_guard lock(post_mu_);
    FabricOp* raw = err.op_context ? OpOf(err.op_context) : nullptr;
    if (auto it = live_.find(raw); it != live_.end()) {
      op = std::move(it->second);
      live_.erase(it);
      posted_.fetch_sub(1, std::memory_order_relaxed);
    } else if (raw) {
      abandoned_.erase(raw);
    }
  }
  if (!op) return 0;
  {
    // One line a second at most: a dead peer fails every operation in flight at once.
    std::lock_guard lock(log_mu_);
    auto now = Clock::now();
    if (now - last_error_log_ >= std::chrono::seconds(1)) {
      MC_LOG(kWarning) << st.message()
                       << (suppressed_errors_ ? " (and " + std::to_string(suppressed_errors_) +
                                                    " more completion errors)"
                                              : std::string());
      last_error_log_ = now;
      suppressed_errors_ = 0;
    } else {
      ++suppressed_errors_;
    }
  }
  Finish(std::move(op), st);
  return 1;
}

void FabricDomain::Nap(std::chrono::microseconds how_long, bool idle) {
  std::unique_lock lock(park_mu_);
  idle_nap_ = idle;
  park_cv_.wait_for(lock, how_long, [&] { return kick_ || stop_thread_.load(); });
  idle_nap_ = false;
  kick_ = false;
}

void FabricDomain::Progress() {
  // Polling: naps of tens of microseconds, not the default 50 us timer slack on top of each.
  if (!info_.cq_wait) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  struct fi_cq_entry entries[32];
  int nap_us = 0;
  bool warm = false;  // polling: a peer did RMA here lately, so naps grow from 10 us again
  while (!stop_thread_.load(std::memory_order_acquire)) {
    bool busy;
    std::vector<std::unique_ptr<FabricOp>> dropped;
    {
      std::lock_guard lock(post_mu_);
      dropped.swap(dropped_);
      busy = !live_.empty() || !queue_.empty() || !abandoned_.empty();
    }
    FinishAll(std::move(dropped), Status(ErrorCode::kPeerUnreachable, "efa: the peer's address was removed"));
    const Park park = Parked();
    if (park == Park::kDriven) {
      CheckDeadlines();
      continue;
    }
    if (park == Park::kLinger) {
      // Just after a drive with nothing outstanding: no sleep in the queue, but its progress goes on (a
      // peer's RMA on this endpoint needs it, tcp and shm alike).
      const ssize_t n = fi_cq_read(cq_, entries, 32);
      if (n > 0 || n == -FI_EAVAIL) Reap(n, entries);
      CheckDeadlines();
      continue;
    }
    ssize_t n;
    if (info_.cq_wait) {
      in_wait_.store(true);
      if (drivers_.load() > 0) {  // a driver came: keep out of its way
        in_wait_.store(false);
        continue;
      }
      // Sleep until a completion or a signal, at most 100 ms (deadlines). Posting never wakes it, so a
      // small transfer costs no thread hand-off besides its completion.
      n = fi_cq_sread(cq_, entries, 32, nullptr, 100);
      in_wait_.store(false);
    } else {
      n = fi_cq_read(cq_, entries, 32);
    }
    if (n > 0 || n == -FI_EAVAIL) {
      nap_us = 0;
      Reap(n, entries);
    } else {
      // Nothing completed (timeout, signal, or a provider without a wait object).
      if (!info_.cq_wait) {
        if (RemoteActivity()) {
          warm = true;
          nap_us = 0;
        }
        if (busy || warm) {
          // Growing from 10 us after each completion or peer's request, up to the idle nap.
          nap_us = std::min(nap_us + 10, std::max(options_.idle_poll_us, 10));
          warm = warm && nap_us < options_.idle_poll_us;
          Nap(std::chrono::microseconds(nap_us), /*idle=*/false);
        } else {
          nap_us = 0;  // the next operation starts with short naps again
          Nap(std::chrono::microseconds(options_.idle_poll_us), /*idle=*/true);
        }
      }
      std::vector<std::unique_ptr<FabricOp>> failed;
      {
        std::lock_guard lock(post_mu_);
        failed = PostQueuedLocked();
      }
      FinishAll(std::move(failed), Status(ErrorCode::kSocket, "efa: posting failed"));
    }
    CheckDeadlines();
  }
}

void FabricDomain::Stop(std::chrono::milliseconds drain) {
  std::vector<std::unique_ptr<FabricOp>> queued;
  {
    std::lock_guard lock(post_mu_);
    if (stopping_ && !progress_.joinable()) return;
    stopping_ = true;
    for (auto& op : queue_) queued.push_back(std::move(op));
    queue_.clear();
    for (auto& op : dropped_) queued.push_back(std::move(op));
    dropped_.clear();
  }
  FinishAll(std::move(queued), Status(ErrorCode::kSocket, "the efa transport is shutting down"));
  auto until = Clock::now() + drain;
  while (posted_.load() > 0 && Clock::now() < until && progress_.joinable()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop_thread_.store(true, std::memory_order_release);
  {
    std::lock_guard lock(park_mu_);
    park_cv_.notify_all();
  }
  Wake();
  if (progress_.joinable()) progress_.join();
  if (ep_) {
    fi_close(&ep_->fid);  // the provider forgets every operation still posted
    ep_ = nullptr;
  }
  std::vector<std::unique_ptr<FabricOp>> live;
  {
    std::lock_guard lock(post_mu_);
    for (auto& [raw, op] : live_) live.push_back(std::move(op));
    live_.clear();
    abandoned_.clear();
    posted_.store(0);
  }
  FinishAll(std::move(live), Status(ErrorCode::kSocket, "the efa transport stopped before the operation completed"));
}

}  // namespace mooncake::te::efa
