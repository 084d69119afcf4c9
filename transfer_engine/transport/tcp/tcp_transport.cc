#include "transfer_engine/transport/tcp/tcp_transport.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"

namespace mooncake::te::tcp {

/// Accepts data connections on the listening socket (registered with loop 0) and hands each to a loop.
class TcpTransport::Acceptor : public EventHandler {
 public:
  Acceptor(TcpTransport* t, int fd) : t_(t), fd_(fd) {}
  void OnEvents(uint32_t) override {
    while (true) {
      int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) MC_LOG(kWarning) << "accept: " << strerror(errno);
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
  c.host_memory = true;
  c.priority = 0;
  return c;
}

Status TcpTransport::Start(const TransportContext& ctx) {
  ctx_ = ctx;
  config_ = ctx.config;
  std::string bind_ip = config_->tcp_bind_address.empty() ? "0.0.0.0" : config_->tcp_bind_address;
  auto fd = net::Listen(bind_ip, 0, 1024);
  if (!fd.ok()) return fd.status();
  listen_fd_ = *fd;
  data_port_ = net::LocalPort(listen_fd_);
  MC_RETURN_IF_ERROR(net::SetNonBlocking(listen_fd_, true));
  for (int i = 0; i < config_->tcp_io_threads; ++i) {
    loops_.push_back(std::make_unique<IoLoop>("mc-tcp-io" + std::to_string(i)));
  }
  for (size_t i = 0; i < loops_.size(); ++i) {
    MC_RETURN_IF_ERROR(loops_[i]->Start([this, i] { OnTick(i); }, std::chrono::milliseconds(100)));
  }
  acceptor_ = std::make_unique<Acceptor>(this, listen_fd_);
  MC_RETURN_IF_ERROR(loops_[0]->Add(listen_fd_, EPOLLIN, acceptor_.get()));
  MC_LOG(kDebug) << "tcp transport listening on " << bind_ip << ":" << data_port_ << " with " << loops_.size()
                 << " I/O threads";
  return Status::Ok();
}

void TcpTransport::Stop() {
  if (stopped_.exchange(true)) return;
  for (auto& loop : loops_) loop->Stop();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
  Status why(ErrorCode::kSocket, "transfer engine is shutting down");
  {
    std::lock_guard lock(peers_mu_);
    for (auto& [key, peer] : peers_) {
      for (auto& lane : peer->lanes) lane->Shutdown(why);
    }
  }
  std::lock_guard lock(conns_mu_);
  for (ServerConnection* c : conns_) delete c;
  conns_.clear();
}

void TcpTransport::OnAccept(int fd) {
  net::SetNoDelay(fd);
  IoLoop* loop = loops_[next_loop_.fetch_add(1) % loops_.size()].get();
  auto* conn = new ServerConnection(fd, loop, ctx_.memory, config_->tcp_max_frame, [this, loop](ServerConnection* c) {
    {
      std::lock_guard lock(conns_mu_);
      conns_.erase(c);
    }
    loop->Post([c] { delete c; });  // not from inside its own handler
  });
  {
    std::lock_guard lock(conns_mu_);
    conns_.insert(conn);
  }
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
    for (auto& [key, peer] : peers_) {
      for (size_t i = 0; i < peer->lanes.size(); ++i) {
        if (i % loops_.size() == loop_index) lanes.push_back(peer->lanes[i].get());
      }
    }
  }
  for (ClientLane* lane : lanes) lane->CheckTimeout(now);
}

void TcpTransport::Describe(nlohmann::json& descriptor) const {
  descriptor["tcp_data_port"] = data_port_;
  descriptor["tcp_data_ip"] = ctx_.advertised_ip;
  descriptor["tcp_proto_version"] = 3;  // this project's framing (wire.h); Mooncake's are 1 and 2
}

bool TcpTransport::CanReach(const SegmentDescriptor& peer) const {
  auto port = peer.json.find("tcp_data_port");
  auto ip = peer.json.find("tcp_data_ip");
  auto version = peer.json.find("tcp_proto_version");
  return port != peer.json.end() && port->is_number_unsigned() && ip != peer.json.end() && ip->is_string() &&
         version != peer.json.end() && *version == 3;
}

TcpTransport::Peer* TcpTransport::GetPeer(const SegmentDescriptor& desc, Status* error) {
  std::string ip = desc.json.value("tcp_data_ip", "");
  uint16_t port = desc.json.value("tcp_data_port", 0);
  std::string key = net::HostPort{ip, port}.ToString();
  std::lock_guard lock(peers_mu_);
  if (stopped_) {
    *error = Status(ErrorCode::kSocket, "transfer engine is shutting down");
    return nullptr;
  }
  segment_to_peer_[desc.name] = key;
  auto it = peers_.find(key);
  if (it != peers_.end()) return it->second.get();
  auto peer = std::make_unique<Peer>();
  peer->endpoint.host = ip;
  peer->endpoint.port = port;
  peer->endpoint.label = desc.name + " (" + key + ")";
  size_t first_loop = peers_.size();
  for (int i = 0; i < config_->tcp_lanes_per_peer; ++i) {
    IoLoop* loop = loops_[(first_loop + i) % loops_.size()].get();
    peer->lanes.push_back(std::make_unique<ClientLane>(*config_, loop, &peer->endpoint));
  }
  Peer* raw = peer.get();
  peers_.emplace(key, std::move(peer));
  return raw;
}

void TcpTransport::Submit(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  if (slices.empty()) return;
  Status error;
  Peer* peer = GetPeer(desc, &error);
  if (!peer) {
    for (Slice* s : slices) s->Complete(error);
    return;
  }
  const size_t n_lanes = peer->lanes.size();
  if (slices.size() == 1 || n_lanes == 1) {
    LeastBusyLane(peer)->Enqueue(slices);
    return;
  }
  // Many slices: spread them round-robin over the lanes so they move in parallel.
  std::vector<std::vector<Slice*>> groups(n_lanes);
  size_t start = peer->next_lane.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < slices.size(); ++i) groups[(start + i) % n_lanes].push_back(slices[i]);
  for (size_t i = 0; i < n_lanes; ++i) {
    if (!groups[i].empty()) peer->lanes[i]->Enqueue(groups[i]);
  }
}

ClientLane* TcpTransport::LeastBusyLane(Peer* peer) {
  // Rotate the starting point so idle lanes share the work; prefer the one with the least in flight.
  const size_t n = peer->lanes.size();
  size_t best = peer->next_lane.fetch_add(1, std::memory_order_relaxed) % n;
  for (size_t i = 1; i < n && peer->lanes[best]->outstanding_bytes() > 0; ++i) {
    size_t cand = (best + i) % n;
    if (peer->lanes[cand]->outstanding_bytes() < peer->lanes[best]->outstanding_bytes()) best = cand;
  }
  return peer->lanes[best].get();
}

void TcpTransport::SubmitAndDrive(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  if (slices.size() != 1) {
    Submit(desc, slices);  // spread over the lanes; the I/O threads move them in parallel
    return;
  }
  Status error;
  Peer* peer = GetPeer(desc, &error);
  if (!peer) {
    slices[0]->Complete(error);
    return;
  }
  ClientLane* lane = LeastBusyLane(peer);
  if (!lane->TryDrive(slices)) lane->Enqueue(slices);
}

void TcpTransport::ForgetPeer(const std::string& segment_name) {
  std::lock_guard lock(peers_mu_);
  auto it = segment_to_peer_.find(segment_name);
  if (it == segment_to_peer_.end()) return;
  auto peer = peers_.find(it->second);
  if (peer != peers_.end()) {
    std::lock_guard plock(peer->second->endpoint.mu);
    peer->second->endpoint.down_until = {};  // let the next transfer try again at once
  }
}

size_t TcpTransport::slice_size() const { return config_ ? config_->tcp_slice_size : (1 << 20); }

nlohmann::json TcpTransport::Stats() const {
  nlohmann::json out = nlohmann::json::object();
  std::lock_guard lock(peers_mu_);
  for (const auto& [key, peer] : peers_) {
    size_t connected = 0;
    for (const auto& lane : peer->lanes) connected += lane->connected();
    bool down;
    {
      std::lock_guard plock(peer->endpoint.mu);
      down = std::chrono::steady_clock::now() < peer->endpoint.down_until;
    }
    out[key] = {{"peer", peer->endpoint.label},
                {"bytes", peer->endpoint.bytes.load()},
                {"slices", peer->endpoint.slices.load()},
                {"errors", peer->endpoint.errors.load()},
                {"lanes", peer->lanes.size()},
                {"connected_lanes", connected},
                {"state", down ? "down" : "up"}};
  }
  return out;
}

MC_REGISTER_TRANSPORT("tcp", TcpTransport);

}  // namespace mooncake::te::tcp
