#include "transfer_engine/transport/rdma/rdma_responder.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "transfer_engine/common/log.h"
#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/transport/rdma/rdma_endpoint.h"

namespace mooncake::te::rdma {

namespace {

std::optional<uint64_t> BoundedUint(const nlohmann::json& j, const char* key, uint64_t max) {
  auto v = JsonUint(j, key);
  if (!v || *v > max) return std::nullopt;
  return v;
}

}  // namespace

struct Responder::Entry {
  std::string instance, segment;
  std::shared_ptr<RdmaNic> nic;
  ibv_qp* qp = nullptr;
  uint32_t peer_qpn = 0;
  uint32_t peer_psn = 0;  // with the QPN: a reconnect whose HCA reused the QPN comes with a fresh PSN
  uint64_t seq = 0;  // creation order
  std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now();
  bool ready = false;  // the requester confirmed ("rdma.ready"): evicted only as a last resort
  uint64_t confirmed_seq = 0;  // order of the last confirmation (least recently confirmed goes first)
  std::string reply;
  ~Entry() {
    if (qp) nic->api()->destroy_qp(qp);
  }
};

Responder::Responder(std::vector<std::shared_ptr<RdmaNic>> nics, const RdmaConfig& cfg, std::string instance,
                     size_t capacity, std::chrono::milliseconds ready_window)
    : nics_(std::move(nics)),
      cfg_(cfg),
      instance_(std::move(instance)),
      capacity_(capacity),
      ready_window_(ready_window) {}

Responder::~Responder() { Clear(); }

void Responder::Clear() {
  std::lock_guard lock(mu_);
  entries_.clear();
}

size_t Responder::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

StatusOr<std::string> Responder::Connect(const std::string& payload) {
  nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  auto instance = JsonString(j, "instance");
  auto segment = JsonString(j, "segment");  // absent from older peers
  auto local_nic = JsonString(j, "local_nic");
  auto peer_nic = JsonString(j, "peer_nic");
  auto qpn = BoundedUint(j, "qpn", 0xffffff);
  auto psn = BoundedUint(j, "psn", 0xffffff);
  auto lid = BoundedUint(j, "lid", 0xffff);
  auto mtu = BoundedUint(j, "mtu", IBV_MTU_4096);
  auto gid = JsonString(j, "gid");
  std::optional<ibv_gid> g = gid ? ParseGid(*gid) : std::nullopt;
  if (!j.is_object() || !instance || instance->size() > 256 || !local_nic || local_nic->size() > 64 || !peer_nic ||
      !qpn || *qpn == 0 || !psn || !lid || !mtu || *mtu < IBV_MTU_256 || !g) {
    return Status(ErrorCode::kInvalidArgument, "malformed rdma.connect request");
  }
  std::shared_ptr<RdmaNic> nic;
  for (const auto& n : nics_) {
    if (n->info().name == *peer_nic) nic = n;
  }
  if (!nic) return Status(ErrorCode::kDeviceNotFound, "no HCA named '" + *peer_nic + "' here");
  const Key key{*instance, *local_nic, *peer_nic};
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second->peer_qpn == *qpn && it->second->peer_psn == *psn) {
    return it->second->reply;  // a repeated request (same QP, same PSN)
  }
  if (segment && segment->size() <= 512 && !segment->empty()) {
    // A new instance under a known segment name: that peer restarted, and its old instance's QPs are dead.
    for (auto i = entries_.begin(); i != entries_.end();) {
      if (i->second->segment == *segment && i->second->instance != *instance) {
        MC_LOG(kInfo) << "rdma: '" << *segment << "' restarted: dropping responder QP of " << i->second->instance;
        i = entries_.erase(i);
      } else {
        ++i;
      }
    }
    it = entries_.find(key);  // the loop may have erased it
  }
  if (it == entries_.end()) {
    Status room = MakeRoomLocked(*instance);
    if (!room.ok()) return room;
  }
  auto e = std::make_unique<Entry>();
  e->instance = *instance;
  e->segment = segment ? segment->substr(0, 512) : "";
  e->nic = nic;
  e->qp = CreateQp(*nic, nic->NextCq(), cfg_, QpRole::kResponder);
  if (!e->qp) return Status(ErrorCode::kEndpoint, std::string("ibv_create_qp: ") + strerror(errno));
  e->peer_qpn = static_cast<uint32_t>(*qpn);
  e->peer_psn = static_cast<uint32_t>(*psn);
  e->seq = ++seq_;
  QpAddress peer;
  peer.nic = *local_nic;
  peer.qpn = e->peer_qpn;
  peer.psn = static_cast<uint32_t>(*psn);
  peer.gid = *g;
  peer.lid = static_cast<uint16_t>(*lid);
  peer.mtu = static_cast<int>(*mtu);
  auto rd_atom = BoundedUint(j, "rd_atom", 255);  // absent from older peers
  peer.rd_atom = rd_atom ? static_cast<int>(*rd_atom) : 0;
  thread_local std::mt19937 rng(std::random_device{}());
  const uint32_t our_psn = rng() & 0xffffff;
  MC_RETURN_IF_ERROR(ConnectQp(nic->api(), e->qp, nic->info(), peer, our_psn, cfg_, QpRole::kResponder));
  e->reply = nlohmann::json{{"nic", nic->info().name},
                            {"qpn", e->qp->qp_num},
                            {"psn", our_psn},
                            {"gid", GidText(nic->info().gid)},
                            {"lid", nic->info().lid},
                            {"mtu", AdvertisedMtu(nic->info(), cfg_)},
                            {"rd_atom", nic->info().max_rd_atom},
                            {"instance", instance_}}
                 .dump();
  std::string reply = e->reply;
  entries_[key] = std::move(e);  // replaces (destroys) an older QP of the same key: the peer reconnected
  return reply;
}

Status Responder::MakeRoomLocked(const std::string& instance) {
  // One instance holds at most (its NICs, at most 64) x (ours) connections: a peer making more is refused
  // before it can crowd out the others.
  const size_t per_instance = 64 * nics_.size();
  size_t mine = 0;
  for (const auto& [key, e] : entries_) mine += e->instance == instance;
  if (mine >= per_instance) {
    return Status(ErrorCode::kTooManyRequests, "rdma: instance '" + instance + "' already holds " +
                                                   std::to_string(mine) + " responder QPs");
  }
  if (entries_.size() < capacity_) return Status::Ok();
  // Full: drop the oldest connection whose requester never confirmed it ("rdma.ready") within the handshake
  // window; else the least recently confirmed one. Nothing tells us that a requester died, so a full table of
  // confirmed entries is mostly dead peers'; a live requester of the victim gets an error completion and
  // reconnects. Handshakes still within their window are never dropped.
  const auto now = std::chrono::steady_clock::now();
  auto unconfirmed = entries_.end(), confirmed = entries_.end();
  for (auto i = entries_.begin(); i != entries_.end(); ++i) {
    const Entry& e = *i->second;
    if (e.ready) {
      if (confirmed == entries_.end() || e.confirmed_seq < confirmed->second->confirmed_seq) confirmed = i;
    } else if (now - e.created >= ready_window_) {
      if (unconfirmed == entries_.end() || e.seq < unconfirmed->second->seq) unconfirmed = i;
    }
  }
  auto victim = unconfirmed != entries_.end() ? unconfirmed : confirmed;
  if (victim == entries_.end()) {
    return Status(ErrorCode::kTooManyRequests, "rdma: all " + std::to_string(capacity_) +
                                                   " responder QPs are handshakes in progress; try again later");
  }
  MC_LOG(kWarning) << "rdma: " << capacity_ << " responder QPs: dropping the "
                   << (victim == unconfirmed ? "unconfirmed" : "least recently confirmed") << " QP of instance '"
                   << victim->second->instance << "'";
  entries_.erase(victim);
  return Status::Ok();
}

StatusOr<std::string> Responder::Ready(const std::string& payload) {
  nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  auto instance = JsonString(j, "instance");
  auto local_nic = JsonString(j, "local_nic");
  auto peer_nic = JsonString(j, "peer_nic");
  auto qpn = BoundedUint(j, "qpn", 0xffffff);
  if (!instance || !local_nic || !peer_nic || !qpn) return Status(ErrorCode::kInvalidArgument, "malformed rdma.ready");
  std::lock_guard lock(mu_);
  auto it = entries_.find(Key{*instance, *local_nic, *peer_nic});
  if (it == entries_.end() || it->second->peer_qpn != *qpn) {
    return Status(ErrorCode::kNotFound, "no rdma connection for that ready");
  }
  it->second->ready = true;
  it->second->confirmed_seq = ++seq_;
  return std::string("{}");
}

StatusOr<std::string> Responder::Close(const std::string& payload) {
  nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  auto instance = JsonString(j, "instance");
  auto local_nic = JsonString(j, "local_nic");
  auto peer_nic = JsonString(j, "peer_nic");
  auto qpn = BoundedUint(j, "qpn", 0xffffff);
  auto psn = BoundedUint(j, "psn", 0xffffff);
  if (!instance || !local_nic || !peer_nic || !qpn || !psn) {
    return Status(ErrorCode::kInvalidArgument, "malformed rdma.close");
  }
  std::lock_guard lock(mu_);
  auto it = entries_.find(Key{*instance, *local_nic, *peer_nic});
  if (it != entries_.end() && it->second->peer_qpn == *qpn && it->second->peer_psn == *psn) entries_.erase(it);
  return std::string("{}");
}

}  // namespace mooncake::te::rdma
