#include "transfer_engine/transport/tcp/tcp_transport.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"
#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te::tcp {

namespace {
// The peer whose Submit is granting staging buffers on this thread: it dispatches once at the end.
thread_local const void* t_submitting_peer = nullptr;
}  // namespace

/// Accepts data connections on the listening socket (registered with loop 0) and hands each to a loop.
class TcpTransport::Acceptor : public EventHandler {
 public:
  Acceptor(TcpTransport* t, int fd) : t_(t), fd_(fd) {}
  void OnEvents(uint32_t) override {
    while (true) {
      int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors (or another failure): the listener stays readable, so it must not be polled
        // again at once (that would spin); the quietest connection makes room for the next peer.
        t_->OnAcceptFailed(errno);
        return;
      }
      t_->OnAccept(fd);
    }
  }

 private:
  TcpTransport* t_;
  int fd_;
};

TcpTransport::TcpTransport() = default;

TcpTransport::~TcpTransport() { Stop(); }

TransportCapabilities TcpTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = true;
  c.same_host = true;
  // Host memory directly; device memory of any kind through pinned staging (declined per region when no usable
  // platform serves its kind).
  const MemoryType kinds[] = {MemoryType::kHost, MemoryType::kCuda, MemoryType::kRocm, MemoryType::kNpu,
                              MemoryType::kMusa};
  for (MemoryType l : kinds) {
    for (MemoryType r : kinds) c.memory.emplace_back(l, r);
  }
  c.priority = 0;
  return c;
}

Status TcpTransport::Configure(const TransportOptions& options) {
  tcp_ = TcpConfig::From(options);
  return Status::Ok();
}

Status TcpTransport::Start(const TransportContext& ctx) {
  ctx_ = ctx;
  config_ = ctx.config;
  stager_ = std::make_unique<DeviceStager>(ctx.platforms ? ctx.platforms : &PlatformRegistry::Get(),
                                           tcp_.staging_pool_bytes, tcp_.slice_size, tcp_.staging_streams);
  // An initiator stages each slice whole in its half of the pool: slices must fit it, or every device slice fails.
  if (const size_t fitting = stager_->SliceFitting(tcp_.slice_size); fitting < tcp_.slice_size) {
    MC_LOG(kWarning) << "tcp transport: MC_TCP_STAGING_POOL_BYTES=" << tcp_.staging_pool_bytes << " stages at most "
                     << stager_->role_bytes() << " bytes per side, less than a slice of MC_TCP_SLICE_SIZE="
                     << tcp_.slice_size << " (up to 1.25x with a merged tail): slices are cut to " << fitting
                     << " bytes (host memory too); a pool of at least " << 2 * (tcp_.slice_size + tcp_.slice_size / 4)
                     << " bytes keeps the configured slice size";
    tcp_.slice_size = fitting;
  }
  tcp_.connect_timeout = config_->handshake_connect_timeout;
  // Which local NICs carry data, and which addresses peers may use to reach us.
  data_ips_ = {ctx.advertised_ip};
  bool loopback = ctx.advertised_ip.rfind("127.", 0) == 0 || ctx.advertised_ip == "::1";
  if (tcp_.bind_address.empty() && !loopback) {
    auto nics = SelectNics(ctx.device_filter, config_->custom_topology_path);
    if (!nics.ok()) return nics.status();
    local_nics_ = std::move(nics.value());
    for (const auto& nic : local_nics_) {
      if (std::find(data_ips_.begin(), data_ips_.end(), nic.ipv4) == data_ips_.end()) data_ips_.push_back(nic.ipv4);
    }
  }
  std::string bind_ip = tcp_.bind_address.empty() ? "0.0.0.0" : tcp_.bind_address;
  auto fd = net::Listen(bind_ip, 0, 1024);
  if (!fd.ok()) return fd.status();
  listen_fd_ = *fd;
  data_port_ = net::LocalPort(listen_fd_);
  MC_RETURN_IF_ERROR(net::SetNonBlocking(listen_fd_, true));
  max_server_conns_ = MaxServerConnections();
  for (int i = 0; i < tcp_.io_threads; ++i) {
    loops_.push_back(std::make_unique<IoLoop>("mc-tcp-io" + std::to_string(i)));
  }
  for (size_t i = 0; i < loops_.size(); ++i) {
    MC_RETURN_IF_ERROR(loops_[i]->Start([this, i] { OnTick(i); }, std::chrono::milliseconds(100)));
  }
  acceptor_ = std::make_unique<Acceptor>(this, listen_fd_);
  MC_RETURN_IF_ERROR(loops_[0]->Add(listen_fd_, EPOLLIN, acceptor_.get()));
  prober_ = std::thread([this] { ProbeLoop(); });
  std::string ips;
  for (const auto& ip : data_ips_) ips += (ips.empty() ? "" : ", ") + ip;
  MC_LOG(kInfo) << "tcp transport: data port " << data_port_ << " on " << ips << " (" << loops_.size()
                << " I/O threads, " << tcp_.lanes_per_peer << " connections per path)";
  return Status::Ok();
}

void TcpTransport::Stop() {
  if (stopped_.exchange(true)) return;
  { std::lock_guard lock(probe_mu_); }  // the prober is either before its predicate check or waiting
  probe_cv_.notify_all();
  if (prober_.joinable()) prober_.join();
  // Copies still running finish (their continuations may post to the loops, so those still run); staged slices
  // whose copies end now find the transport stopped and complete with an error.
  if (stager_) stager_->Stop();
  for (auto& loop : loops_) loop->Stop();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
  Status why(ErrorCode::kSocket, "transfer engine is shutting down");
  std::vector<Peer*> peers;
  {
    std::lock_guard lock(peers_mu_);
    for (auto& [key, peer] : peers_) peers.push_back(peer.get());
  }
  for (Peer* peer : peers) {
    for (auto& path : peer->paths) {
      for (auto& lane : path->lanes) lane->Abort(why, /*reroute=*/false);
    }
    std::deque<Slice*> queued;
    {
      std::lock_guard lock(peer->mu);
      queued.swap(peer->queue);
    }
    for (Slice* s : queued) Finish(s, why);
  }
  std::lock_guard lock(conns_mu_);
  for (auto& [id, c] : conns_) delete c.conn;
  conns_.clear();
}

size_t TcpTransport::MaxServerConnections() {
  rlimit nofile{};
  size_t by_fds = getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY
                      ? static_cast<size_t>(nofile.rlim_cur) / 2
                      : kMaxServerConnections;
  return std::max<size_t>(16, std::min(kMaxServerConnections, by_fds));
}

bool TcpTransport::EvictQuietestLocked(const std::string& why) {
  uint64_t victim_id = 0;
  ServerConn* victim = nullptr;
  for (auto& [id, c] : conns_) {
    if (c.evicting) continue;
    if (!victim || c.conn->last_progress() < victim->conn->last_progress()) {
      victim = &c;
      victim_id = id;
    }
  }
  if (!victim) return false;
  victim->evicting = true;
  ++pending_evictions_;
  evicted_.fetch_add(1, std::memory_order_relaxed);
  auto now = std::chrono::steady_clock::now();
  std::string reason;  // logged (as the close's reason) at most once a second
  if (now - last_evict_log_ >= std::chrono::seconds(1)) {
    auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - victim->conn->last_progress());
    reason = why + "; it was the quietest (" + std::to_string(quiet.count()) + " ms)" +
             (unlogged_evictions_ ? "; " + std::to_string(unlogged_evictions_) + " more evicted before, not logged"
                                  : "");
    last_evict_log_ = now;
    unlogged_evictions_ = 0;
  } else {
    ++unlogged_evictions_;
  }
  // By id, on the victim's loop: if it closed itself meanwhile its id is gone (its memory may be reused by
  // a newer connection, which the id tells apart). Found, it is open, and only its own loop closes or
  // deletes it, so it stays valid while this task runs.
  victim->conn->loop()->Post([this, victim_id, reason] {
    ServerConnection* c = nullptr;
    {
      std::lock_guard lock(conns_mu_);
      auto it = conns_.find(victim_id);
      if (it == conns_.end()) return;
      c = it->second.conn;
    }
    c->Close(reason);
  });
  return true;
}

void TcpTransport::OnAcceptFailed(int err) {
  auto now = std::chrono::steady_clock::now();
  if (now - last_accept_log_ >= std::chrono::seconds(1)) {
    last_accept_log_ = now;
    MC_LOG(kWarning) << "tcp transport: accept failed: " << strerror(err) << "; pausing the data listener for "
                     << kAcceptBackoff.count() << " ms";
  }
  if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
    std::lock_guard lock(conns_mu_);
    EvictQuietestLocked("out of file descriptors for a new data connection");
  }
  loops_[0]->Remove(listen_fd_);
  accept_paused_until_ = now + kAcceptBackoff;
}

void TcpTransport::OnAccept(int fd) {
  IoLoop* loop = loops_[next_loop_.fetch_add(1) % loops_.size()].get();
  uint64_t id = 0;
  ServerConnection* conn = nullptr;
  {
    std::lock_guard lock(conns_mu_);
    // Connections being evicted still count until their loops close them; a burst beyond the limit marks
    // one further victim per new connection, up to a bound on pending evictions.
    size_t live = conns_.size() - pending_evictions_;
    if (live >= max_server_conns_) {
      bool room = pending_evictions_ < max_server_conns_ / 8 + 1 &&
                  EvictQuietestLocked("the data port has " + std::to_string(conns_.size()) +
                                      " connections (its limit is " + std::to_string(max_server_conns_) + ")");
      if (!room) {
        refused_.fetch_add(1, std::memory_order_relaxed);
        close(fd);
        return;
      }
    }
    id = next_conn_id_++;
    conn = new ServerConnection(fd, loop, ctx_.memory, tcp_.max_frame, stager_.get(), [this, loop, id](ServerConnection* c) {
      {
        std::lock_guard lock(conns_mu_);
        auto it = conns_.find(id);
        if (it != conns_.end()) {
          if (it->second.evicting) --pending_evictions_;
          conns_.erase(it);
        }
      }
      loop->Post([c] { delete c; });  // not from inside its own handler
    });
    conns_.emplace(id, ServerConn{conn});
    peak_conns_ = std::max(peak_conns_, conns_.size());
  }
  net::SetNoDelay(fd);
  Status st = conn->Register();
  if (!st.ok()) {
    MC_LOG(kWarning) << "cannot register data connection: " << st.ToString();
    conn->Close("");
  }
}

void TcpTransport::OnTick(size_t loop_index) {
  auto now = std::chrono::steady_clock::now();
  std::vector<ClientLane*> lanes;
  {
    std::lock_guard lock(peers_mu_);
    size_t i = 0;
    for (auto& [key, peer] : peers_) {
      for (auto& path : peer->paths) {
        for (auto& lane : path->lanes) {
          if (i++ % loops_.size() == loop_index) lanes.push_back(lane.get());
        }
      }
    }
  }
  for (ClientLane* lane : lanes) lane->CheckTimeout(now);
  CloseStalledConnections(loops_[loop_index].get(), now);
  if (loop_index != 0) return;
  if (accept_paused_until_ != std::chrono::steady_clock::time_point{} && now >= accept_paused_until_) {
    Status st = loops_[0]->Add(listen_fd_, EPOLLIN, acceptor_.get());
    if (st.ok()) {
      accept_paused_until_ = {};
    } else {  // keep trying: a listener left out of the loop would never accept again
      accept_paused_until_ = now + kAcceptBackoff;
      if (now - last_accept_log_ >= std::chrono::seconds(1)) {
        last_accept_log_ = now;
        MC_LOG(kWarning) << "tcp transport: cannot resume the data listener: " << st.message() << "; retrying";
      }
    }
  }
  SampleRates(now);
  if (MC_LOG_ENABLED(kDebug) && now - last_stats_log_ >= std::chrono::seconds(5)) {
    last_stats_log_ = now;
    MC_LOG(kDebug) << "tcp path counters: " << Stats().dump();
  }
}

void TcpTransport::CloseStalledConnections(IoLoop* loop, std::chrono::steady_clock::time_point now) {
  std::vector<ServerConnection*> stalled;
  {
    std::lock_guard lock(conns_mu_);
    for (auto& [id, c] : conns_) {
      if (c.conn->loop() == loop && c.conn->Stalled(now, StallLimit())) stalled.push_back(c.conn);
    }
  }
  for (ServerConnection* c : stalled) {  // on c's loop thread: deleted only later, by a posted task
    stalled_.fetch_add(1, std::memory_order_relaxed);
    c->Close("stuck in the middle of a frame (no byte moved, or one frame unfinished, for " +
             std::to_string(StallLimit().count()) + " s: twice MC_TRANSFER_TIMEOUT)");
  }
}

void TcpTransport::SampleRates(std::chrono::steady_clock::time_point now) {
  double dt = std::chrono::duration<double>(now - last_sample_).count();
  last_sample_ = now;
  if (dt <= 0 || dt > 1.0) dt = 0;  // first tick, or a stalled loop: no sample
  std::lock_guard lock(peers_mu_);
  for (auto& [key, peer] : peers_) {
    for (auto& path : peer->paths) {
      uint64_t bytes = path->bytes.load(std::memory_order_relaxed);
      uint64_t delta = bytes - path->sampled_bytes;
      path->sampled_bytes = bytes;
      bool busy = false;
      for (auto& lane : path->lanes) busy = busy || lane->outstanding_bytes() > 0;
      if (!busy || dt == 0 || delta == 0) continue;
      double sample = static_cast<double>(delta) / dt;
      double old = path->rate.load(std::memory_order_relaxed);
      path->rate.store(old == 0 ? sample : 0.7 * old + 0.3 * sample, std::memory_order_relaxed);
    }
  }
}

size_t TcpTransport::LaneWindow(const PeerPath& path) const {
  // About 25 ms of the path's measured rate, split over its lanes; between one slice and MC_TCP_LANE_WINDOW.
  double rate = path.rate.load(std::memory_order_relaxed);
  if (rate <= 0) return tcp_.lane_window;
  size_t w = static_cast<size_t>(rate * 0.025 / std::max<size_t>(1, path.lanes.size()));
  return std::clamp(w, tcp_.slice_size, std::max(tcp_.slice_size, tcp_.lane_window));
}

void TcpTransport::ProbeLoop() {
  auto next_probe = std::chrono::steady_clock::now() + tcp_.probe_interval;
  std::unique_lock lock(probe_mu_);
  while (!stopped_.load()) {
    probe_cv_.wait_until(lock, next_probe, [&] { return stopped_.load() || dispatch_pending_; });
    if (stopped_.load()) break;
    bool dispatch = dispatch_pending_;
    dispatch_pending_ = false;
    lock.unlock();
    if (dispatch) {  // connections an epoll thread needed but must not make itself
      std::vector<Peer*> peers;
      {
        std::lock_guard plock(peers_mu_);
        for (auto& [key, peer] : peers_) {
          if (peer->dispatch_requested.exchange(false)) peers.push_back(peer.get());
        }
      }
      for (Peer* peer : peers) Dispatch(peer);
    }
    if (std::chrono::steady_clock::now() >= next_probe) {
      next_probe = std::chrono::steady_clock::now() + tcp_.probe_interval;
      std::vector<PeerPath*> down;
      {
        std::lock_guard plock(peers_mu_);
        for (auto& [key, peer] : peers_) {
          for (auto& path : peer->paths) {
            if (path->down.load()) down.push_back(path.get());
          }
        }
      }
      for (PeerPath* path : down) {
        if (stopped_.load()) break;
        auto timeout = std::min(config_->handshake_connect_timeout, std::chrono::milliseconds(1000));
        auto fd = net::Connect(path->remote_ip, path->port, timeout, path->local_ip);
        if (!fd.ok()) continue;
        close(*fd);
        path->down.store(false);
        MC_LOG(kInfo) << "path " << path->label << " is reachable again; back in service";
        Dispatch(path->peer);
      }
    }
    lock.lock();
  }
}

void TcpTransport::RequestDispatch(Peer* peer) {
  peer->dispatch_requested.store(true);
  {
    std::lock_guard lock(probe_mu_);
    dispatch_pending_ = true;
  }
  probe_cv_.notify_all();
}

void TcpTransport::Describe(nlohmann::json& descriptor) const {
  descriptor["tcp_data_port"] = data_port_;
  descriptor["tcp_data_ip"] = data_ips_.front();
  descriptor["tcp_data_ips"] = data_ips_;
  descriptor["tcp_proto_version"] = 3;  // this project's framing (wire.h); Mooncake's are 1 and 2
}

bool TcpTransport::CanReach(const SegmentDescriptor& peer) const {
  auto port = peer.json.find("tcp_data_port");
  auto ip = peer.json.find("tcp_data_ip");
  auto version = peer.json.find("tcp_proto_version");
  return port != peer.json.end() && port->is_number_unsigned() && port->get<uint64_t>() > 0 &&
         port->get<uint64_t>() <= 65535 && ip != peer.json.end() && ip->is_string() &&
         version != peer.json.end() && *version == 3;
}

TcpTransport::Peer* TcpTransport::GetPeer(const SegmentDescriptor& desc, Status* error) {
  std::string key = desc.name + "/" + desc.json.value("instance", "");
  std::lock_guard lock(peers_mu_);
  if (stopped_) {
    *error = Status(ErrorCode::kSocket, "transfer engine is shutting down");
    return nullptr;
  }
  auto it = peers_.find(key);
  if (it != peers_.end()) return it->second.get();

  std::vector<std::string> remote_ips;
  if (auto ips = desc.json.find("tcp_data_ips"); ips != desc.json.end() && ips->is_array()) {
    for (const auto& ip : *ips) {
      if (ip.is_string()) remote_ips.push_back(ip.get<std::string>());
    }
  }
  if (remote_ips.empty()) remote_ips.push_back(desc.json.value("tcp_data_ip", ""));
  // Pair each remote address with the local NIC on its subnet. When some pair up, use only those (so the
  // allow-list holds); when none do (routed networks, loopback), let the kernel route to every address.
  std::vector<std::pair<const NicInfo*, std::string>> pairs;
  for (const auto& ip : remote_ips) {
    for (const auto& nic : local_nics_) {
      if (InSubnet(nic, ip)) {
        pairs.emplace_back(&nic, ip);
        break;
      }
    }
  }
  if (pairs.empty()) {
    for (const auto& ip : remote_ips) pairs.emplace_back(nullptr, ip);
  }
  auto peer = std::make_unique<Peer>();
  peer->name = desc.name;
  uint16_t port = desc.json.value("tcp_data_port", 0);
  size_t loop = peers_.size();
  for (const auto& [nic, ip] : pairs) {
    auto path = std::make_unique<PeerPath>();
    path->peer = peer.get();
    path->local_ip = nic ? nic->ipv4 : "";
    path->nic = nic ? nic->name : "";
    path->remote_ip = ip;
    path->port = port;
    path->label = desc.name + " via " + (nic ? nic->name + " " + nic->ipv4 : std::string("default route")) + " -> " +
                  net::HostPort{ip, port}.ToString();
    for (int i = 0; i < tcp_.lanes_per_peer; ++i) {
      IoLoop* l = loops_[loop++ % loops_.size()].get();
      path->lanes.push_back(std::make_unique<ClientLane>(tcp_, l, path.get(), static_cast<LaneOwner*>(this)));
    }
    peer->paths.push_back(std::move(path));
  }
  Peer* raw = peer.get();
  peers_.emplace(key, std::move(peer));
  return raw;
}

std::string TcpTransport::NoPathError(const Peer& peer) {
  std::string msg = "no path left to '" + peer.name + "'; tried:";
  for (const auto& path : peer.paths) {
    std::lock_guard lock(path->mu);
    msg += " [" + path->label + ": " + (path->last_error.empty() ? "down" : path->last_error) + "]";
  }
  return msg;
}

void TcpTransport::Refill(ClientLane* lane) {
  auto* path = static_cast<PeerPath*>(lane->path());
  if (path->down.load() || stopped_.load()) return;
  Peer* peer = path->peer;
  if (!lane->connected() && (IoLoop::OnAnyLoopThread() || DeviceStager::OnStagerThread())) {
    // Connecting may block for the connect timeout: never on an epoll thread, nor on the stager's (every copy
    // completion in the process waits behind it). The prober thread does it.
    RequestDispatch(peer);
    return;
  }
  std::vector<Slice*> take;
  {
    std::lock_guard lock(peer->mu);
    size_t window = LaneWindow(*path);
    size_t room = window > lane->outstanding_bytes() ? window - lane->outstanding_bytes() : 0;
    size_t taken = 0;
    while (!peer->queue.empty() && (taken < room || (take.empty() && lane->outstanding_bytes() == 0))) {
      taken += peer->queue.front()->length;
      take.push_back(peer->queue.front());
      peer->queue.pop_front();
    }
  }
  if (!take.empty()) lane->Enqueue(take);
}

void TcpTransport::Dispatch(Peer* peer) {
  if (stopped_.load()) {  // Stop() may have drained the queue before these slices were added
    std::deque<Slice*> queued;
    {
      std::lock_guard lock(peer->mu);
      queued.swap(peer->queue);
    }
    for (Slice* s : queued) Finish(s, Status(ErrorCode::kSocket, "transfer engine is shutting down"));
    return;
  }
  bool any_up = false;
  for (auto& path : peer->paths) {
    if (path->down.load()) continue;
    any_up = true;
    size_t n = path->lanes.size();
    size_t start = peer->next.fetch_add(1, std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i) Refill(path->lanes[(start + i) % n].get());
  }
  if (any_up) return;
  std::deque<Slice*> queued;
  {
    std::lock_guard lock(peer->mu);
    queued.swap(peer->queue);
  }
  if (queued.empty()) return;
  // Every path is down: the peer may have restarted elsewhere (a fresh descriptor then differs).
  Status st(ErrorCode::kPeerUnreachable, NoPathError(*peer));
  for (Slice* s : queued) FailSlice(s, st, SliceRetry::kRefreshPeer);
}

void TcpTransport::OnLaneRoom(ClientLane* lane) { Refill(lane); }

void TcpTransport::MarkDown(PeerPath* path, const Status& why) {
  {
    std::lock_guard lock(path->mu);
    path->last_error = why.message();
  }
  if (path->down.exchange(true)) return;
  MC_LOG(kWarning) << "path " << path->label << " is down (" << why.message()
                   << "); its transfers move to the other paths, and it is probed every "
                   << tcp_.probe_interval.count() << " ms";
  for (auto& lane : path->lanes) lane->Abort(why, /*reroute=*/true);  // siblings share the broken link
}

void TcpTransport::OnLaneFailed(ClientLane* lane, std::vector<Slice*> slices, const Status& why) {
  auto* path = static_cast<PeerPath*>(lane->path());
  Peer* peer = path->peer;
  if (stopped_.load()) {
    for (Slice* s : slices) Finish(s, why);
    return;
  }
  MarkDown(path, why);
  std::vector<Slice*> retry;
  for (Slice* s : slices) {
    if (++s->attempts > static_cast<uint32_t>(config_->retry_count)) {
      FailSlice(s, Status(why.code(), why.message() + " (gave up after " + std::to_string(s->attempts) +
                                          " attempts, MC_RETRY_CNT)"),
                SliceRetry::kOtherPath);
    } else {
      retry.push_back(s);
    }
  }
  path->failovers.fetch_add(retry.size(), std::memory_order_relaxed);
  {
    std::lock_guard lock(peer->mu);
    peer->queue.insert(peer->queue.begin(), retry.begin(), retry.end());
  }
  Dispatch(peer);
}

ClientLane* TcpTransport::IdlestLane(Peer* peer) {
  ClientLane* best = nullptr;
  size_t start = peer->next.fetch_add(1, std::memory_order_relaxed);
  for (size_t p = 0; p < peer->paths.size(); ++p) {
    auto& path = peer->paths[(start + p) % peer->paths.size()];
    if (path->down.load()) continue;
    for (auto& lane : path->lanes) {
      if (!best || lane->outstanding_bytes() < best->outstanding_bytes()) best = lane.get();
      if (best->outstanding_bytes() == 0) return best;
    }
  }
  return best;
}

void TcpTransport::Submit(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  if (slices.empty()) return;
  Status error;
  Peer* peer = GetPeer(desc, &error);
  if (!peer) {
    for (Slice* s : slices) s->Complete(error);
    return;
  }
  bool any_staged = false;
  for (Slice* s : slices) any_staged = any_staged || Staged(s);
  if (!any_staged) {
    {
      std::lock_guard lock(peer->mu);
      peer->queue.insert(peer->queue.end(), slices.begin(), slices.end());
    }
    Dispatch(peer);
    return;
  }
  t_submitting_peer = peer;  // staged slices granted at once join the queue; one Dispatch below moves them
  for (Slice* s : slices) {
    if (Staged(s)) {
      Stage(peer, s);
    } else {
      std::lock_guard lock(peer->mu);
      peer->queue.push_back(s);
    }
  }
  t_submitting_peer = nullptr;
  Dispatch(peer);
}

StatusOr<RegionRegistration> TcpTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  if (region.kind.type == MemoryType::kHost) return r;
  if (!region.kind.is_device()) {
    r.declined = true;
    r.why_declined = "tcp moves host and device memory only (not " + region.kind.ToString() + ")";
  } else if (!stager_ || !stager_->CanStage(region.kind)) {
    r.declined = true;
    r.why_declined = "no usable platform for " + region.kind.ToString() + " memory to stage it through";
  } else if (Status pool = stager_->Prepare(region.kind); !pool.ok()) {  // the pinned pool, on this thread
    r.declined = true;
    r.why_declined = pool.message();
  }
  return r;
}

void TcpTransport::UnregisterRegion(const MemoryRegion& region) {
  // Only regions RegisterRegion did not decline get here, i.e. the device regions whose Prepare succeeded.
  if (stager_ && region.kind.is_device()) stager_->Unprepare(region.kind);
}

void TcpTransport::Stage(Peer* peer, Slice* s) {
  const MemoryKind kind = s->task->route.local_kind;
  // From the initiator's half of the pool: at once when there is room, else in turn once earlier slices are done
  // (on a stager thread), so a transfer far larger than the pool flows through it in slice-sized pieces.
  stager_->Acquire(kind, StagingRole::kInitiator, s->length, [this, peer, s, kind](StatusOr<StagingRef> got) {
    if (!got.ok()) {
      s->Complete(got.status());
      return;
    }
    StagingRef buf = std::move(got.value());
    {
      std::lock_guard lock(staged_mu_);
      staged_[s] = buf;
    }
    if (s->opcode == OpCode::kRead) {
      Queue(peer, s);
      return;
    }
    // The source is copied into staging first; the slice joins the peer's queue when the copy is done, so the
    // copies of later slices overlap the sending of earlier ones.
    stager_->Copy(kind, buf->data, s->local, s->length, [this, peer, s, buf](const Status& st) {
      if (!st.ok()) {
        Finish(s, st);
        return;
      }
      Queue(peer, s);
    });
  });
}

void TcpTransport::Queue(Peer* peer, Slice* s) {
  {
    std::lock_guard lock(peer->mu);
    peer->queue.push_back(s);
  }
  if (t_submitting_peer != peer) Dispatch(peer);
}

StagingRef TcpTransport::Unstage(Slice* s) {
  if (!Staged(s)) return nullptr;
  std::lock_guard lock(staged_mu_);
  auto it = staged_.find(s);
  if (it == staged_.end()) return nullptr;
  StagingRef buf = std::move(it->second);
  staged_.erase(it);
  return buf;
}

char* TcpTransport::PayloadBuffer(Slice* s) {
  if (!Staged(s)) return s->local;
  std::lock_guard lock(staged_mu_);
  auto it = staged_.find(s);
  return it != staged_.end() ? it->second->data : s->local;
}

void TcpTransport::OnSliceDone(Slice* s, const Status& status) {
  StagingRef buf = Unstage(s);
  if (!buf || !status.ok() || s->opcode == OpCode::kWrite) {
    s->Complete(status);
    return;
  }
  // A READ into device memory: its payload is in staging; the slice is done once it is on the device.
  stager_->Copy(s->task->route.local_kind, s->local, buf->data, s->length,
                [s, buf](const Status& st) { s->Complete(st); });
}

void TcpTransport::Finish(Slice* s, const Status& st) {
  Unstage(s);
  s->Complete(st);
}

void TcpTransport::FailSlice(Slice* s, const Status& st, SliceRetry retry) {
  Unstage(s);
  s->Fail(st, retry);
}

void TcpTransport::SubmitAndDrive(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  if (slices.size() != 1 || Staged(slices[0])) {  // staged: its copies are waited for off this thread
    Submit(desc, slices);  // spread over the paths; the I/O threads move them in parallel
    return;
  }
  Status error;
  Peer* peer = GetPeer(desc, &error);
  if (!peer) {
    slices[0]->Complete(error);
    return;
  }
  ClientLane* lane = IdlestLane(peer);
  if (lane && lane->outstanding_bytes() == 0 && lane->TryDrive(slices)) return;
  Submit(desc, slices);
}

void TcpTransport::ForgetPeer(const std::string& segment_name) {
  std::lock_guard lock(peers_mu_);
  for (auto& [key, peer] : peers_) {
    if (peer->name != segment_name) continue;
    for (auto& path : peer->paths) path->down.store(false);  // let the next transfer try every path at once
  }
}

size_t TcpTransport::slice_size() const { return tcp_.slice_size; }

nlohmann::json TcpTransport::ListenerStats() const {
  // "staging": the device-memory staging of both sides (copies between device and pinned host memory).
  nlohmann::json staging = stager_ ? stager_->Stats() : nlohmann::json::object();
  std::lock_guard lock(conns_mu_);
  return {{"port", data_port_},         {"open", conns_.size()},      {"peak", peak_conns_},
          {"limit", max_server_conns_}, {"evicted", evicted_.load()}, {"stalled", stalled_.load()},
          {"refused", refused_.load()}, {"staging", staging}};
}

nlohmann::json TcpTransport::Stats() const {
  nlohmann::json out = nlohmann::json::object();
  std::lock_guard lock(peers_mu_);
  for (const auto& [key, peer] : peers_) {
    for (const auto& path : peer->paths) {
      size_t connected = 0;
      for (const auto& lane : path->lanes) connected += lane->connected();
      std::string last_error;
      {
        std::lock_guard plock(path->mu);
        last_error = path->last_error;
      }
      out[path->label] = {{"peer", peer->name},
                          {"local_nic", path->nic},
                          {"local_ip", path->local_ip},
                          {"remote", net::HostPort{path->remote_ip, path->port}.ToString()},
                          {"bytes", path->bytes.load()},
                          {"slices", path->slices.load()},
                          {"errors", path->errors.load()},
                          {"failovers", path->failovers.load()},
                          {"lanes", path->lanes.size()},
                          {"connected_lanes", connected},
                          {"state", path->down.load() ? "down" : "up"},
                          {"last_error", last_error}};
    }
  }
  return out;
}

MC_TRANSPORT_PLUGIN("tcp", TcpTransport, {"tcp"}, "MC_FORCE_TCP", nullptr);

}  // namespace mooncake::te::tcp
