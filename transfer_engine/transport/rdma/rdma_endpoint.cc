#include "transfer_engine/transport/rdma/rdma_endpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "transfer_engine/common/log.h"

namespace mooncake::te::rdma {

namespace {

using Clock = std::chrono::steady_clock;

bool EmptyGid(const ibv_gid& g) {
  for (uint8_t b : g.raw) {
    if (b) return false;
  }
  return true;
}

uint32_t RandomPsn() {
  thread_local std::mt19937 rng(std::random_device{}());
  return rng() & 0xffffff;
}

Status QpError(const char* step, int rc) {
  return Status(ErrorCode::kEndpoint, std::string("ibv_modify_qp(") + step + "): " + strerror(rc));
}

}  // namespace

ibv_qp* CreateQp(RdmaNic& nic, size_t cq, const RdmaConfig& cfg, QpRole role) {
  ibv_qp_init_attr init{};
  init.send_cq = nic.cq(cq);
  init.recv_cq = nic.cq(cq);
  init.qp_type = IBV_QPT_RC;
  int max_wr = cfg.max_wr;
  if (nic.info().max_qp_wr > 0) max_wr = std::min(max_wr, nic.info().max_qp_wr);
  init.cap.max_send_wr = role == QpRole::kResponder ? 1 : static_cast<uint32_t>(max_wr);  // a responder never posts
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.sq_sig_all = 0;
  return nic.api()->create_qp(nic.pd(), &init);
}

int AdvertisedMtu(const NicInfo& nic, const RdmaConfig& cfg) { return std::min(nic.active_mtu, MtuEnum(cfg.mtu)); }

Status ConnectQp(const VerbsApi* api, ibv_qp* qp, const NicInfo& local, const QpAddress& peer, uint32_t local_psn,
                 const RdmaConfig& cfg, QpRole role) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = static_cast<uint16_t>(cfg.pkey_index);
  a.port_num = static_cast<uint8_t>(cfg.ib_port);
  a.qp_access_flags = role == QpRole::kResponder ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE : 0;
  if (int rc = api->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return QpError("INIT", rc);
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  int mtu = std::min(AdvertisedMtu(local, cfg), peer.mtu);
  a.path_mtu = static_cast<ibv_mtu>(std::max(mtu, static_cast<int>(IBV_MTU_256)));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = static_cast<uint8_t>(local.max_rd_atom);
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = peer.lid;
  a.ah_attr.sl = static_cast<uint8_t>(cfg.service_level >= 0 ? cfg.service_level : 0);
  a.ah_attr.port_num = static_cast<uint8_t>(cfg.ib_port);
  if (local.ethernet || !EmptyGid(peer.gid)) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(local.gid_index);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = static_cast<uint8_t>(cfg.traffic_class >= 0 ? cfg.traffic_class : 0);
  }
  if (int rc = api->modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return QpError("RTR", rc);
  }
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = static_cast<uint8_t>(cfg.qp_timeout);
  a.retry_cnt = static_cast<uint8_t>(cfg.qp_retry_cnt);
  a.rnr_retry = 7;
  a.sq_psn = local_psn;
  // READs in flight as a requester: never more than the peer serves as a responder.
  a.max_rd_atomic = static_cast<uint8_t>(peer.rd_atom > 0 ? std::min(local.max_init_rd_atom, peer.rd_atom)
                                                          : local.max_init_rd_atom);
  if (int rc = api->modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC)) {
    return QpError("RTS", rc);
  }
  return Status::Ok();
}

Endpoint::Endpoint(std::shared_ptr<RdmaNic> nic, size_t nic_index, std::shared_ptr<CqBudget> budget, size_t cq,
                   const RdmaConfig& cfg, std::string label, std::string peer_segment, std::string peer_nic)
    : nic_(std::move(nic)),
      nic_index_(nic_index),
      budget_(std::move(budget)),
      cq_(cq),
      cfg_(cfg),
      label_(std::move(label)),
      peer_segment_(std::move(peer_segment)),
      peer_nic_(std::move(peer_nic)) {}

Endpoint::~Endpoint() {
  uint32_t qpn = 0;
  Close(&qpn);
}

bool Endpoint::Usable() const {
  std::lock_guard lock(mu_);
  if (closed_ || state_ == State::kFailed) return false;
  return state_ == State::kConnected || Clock::now() >= retry_after_;
}

std::optional<Clock::time_point> Endpoint::PausedUntil() const {
  std::lock_guard lock(mu_);
  const auto now = Clock::now();
  if (closed_ || state_ == State::kConnected) return std::nullopt;
  if (state_ == State::kIdle) {
    if (now >= retry_after_) return std::nullopt;
    return retry_after_;
  }
  // Failed: its WRs come back flushed within moments, then it is idle until retry_after_.
  return std::max(retry_after_, now + std::chrono::milliseconds(20));
}

Status Endpoint::EnsureConnected(const Handshake& handshake, const std::function<void(uint32_t)>& on_qp) {
  std::lock_guard connect(connect_mu_);
  auto backoff = [&](const Status& st) {
    std::lock_guard lock(mu_);
    consecutive_failures_++;
    total_failures_++;
    why_ = st.message();
    auto delay = cfg_.backoff * (1LL << std::min(consecutive_failures_ - 1, 20));
    retry_after_ = Clock::now() + std::min<std::chrono::milliseconds>(
                                      std::chrono::duration_cast<std::chrono::milliseconds>(delay), cfg_.rail_pause);
    return st;
  };
  {
    std::lock_guard lock(mu_);
    if (closed_) return Status(ErrorCode::kContext, label_ + ": closed");
    if (state_ == State::kConnected) return Status::Ok();
    if (state_ == State::kFailed) return Status(ErrorCode::kEndpoint, label_ + " is draining after: " + why_);
    if (Clock::now() < retry_after_) return Status(ErrorCode::kEndpoint, label_ + " is paused after: " + why_);
  }
  const VerbsApi* api = nic_->api();
  ibv_qp* qp = CreateQp(*nic_, cq_, cfg_, QpRole::kRequester);
  if (!qp) return backoff(Status(ErrorCode::kEndpoint, label_ + ": ibv_create_qp: " + strerror(errno)));
  QpAddress ours;
  ours.nic = nic_->info().name;
  ours.qpn = qp->qp_num;
  ours.psn = RandomPsn();
  ours.gid = nic_->info().gid;
  ours.lid = nic_->info().lid;
  ours.mtu = AdvertisedMtu(nic_->info(), cfg_);
  ours.rd_atom = nic_->info().max_rd_atom;
  auto peer = handshake(ours);
  Status st = peer.ok() ? ConnectQp(api, qp, nic_->info(), *peer, ours.psn, cfg_, QpRole::kRequester) : peer.status();
  if (!st.ok()) {
    api->destroy_qp(qp);
    return backoff(Status(st.code(), label_ + ": " + st.message()));
  }
  on_qp(qp->qp_num);
  std::lock_guard lock(mu_);
  if (closed_) {
    api->destroy_qp(qp);
    return Status(ErrorCode::kContext, label_ + ": closed");
  }
  qp_ = qp;
  psn_ = ours.psn;
  state_ = State::kConnected;
  MC_LOG(kDebug) << "rdma: " << label_ << " connected (qpn " << ours.qpn << " -> " << peer->qpn << ")";
  return Status::Ok();
}

bool Endpoint::Enqueue(std::vector<std::unique_ptr<WorkItem>>& items,
                       std::vector<std::unique_ptr<WorkItem>>* flushed, uint32_t* destroyed_qpn) {
  *destroyed_qpn = 0;
  std::lock_guard lock(mu_);
  if (closed_ || state_ != State::kConnected) return false;
  for (auto& i : items) waiting_.push_back(std::move(i));
  items.clear();
  *destroyed_qpn = PostLocked(flushed);
  return true;
}

void Endpoint::Kick(std::vector<std::unique_ptr<WorkItem>>* flushed, uint32_t* destroyed_qpn) {
  *destroyed_qpn = 0;
  std::lock_guard lock(mu_);
  if (!closed_ && state_ == State::kConnected) *destroyed_qpn = PostLocked(flushed);
}

uint32_t Endpoint::PostLocked(std::vector<std::unique_ptr<WorkItem>>* flushed) {
  const VerbsApi* api = nic_->api();
  const size_t max_wr = static_cast<size_t>(std::max(1, cfg_.max_wr));
  while (!waiting_.empty() && inflight_.size() < max_wr) {
    if (budget_->inflight.fetch_add(1) >= budget_->capacity) {
      budget_->inflight.fetch_sub(1);
      budget_->starved.store(true);
      // The CQ is full: a completion on it kicks this endpoint again. If the CQ drained between the
      // fetch_add and the store, no completion is left to see the flag: look again (seq_cst on both sides, so
      // either this sees the room or the poller, whose decrement comes before its exchange, sees the flag).
      if (budget_->inflight.load() < budget_->capacity) continue;
      return 0;
    }
    std::unique_ptr<WorkItem>& item = waiting_.front();
    ibv_sge sge{item->local, item->length, item->lkey};
    ibv_send_wr wr{};
    wr.wr_id = next_id_++;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = item->read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = item->remote;
    wr.wr.rdma.rkey = item->rkey;
    ibv_send_wr* bad = nullptr;
    int rc = api->post_send(qp_, &wr, &bad);
    if (rc != 0) {
      budget_->inflight.fetch_sub(1);
      if (rc == ENOMEM && !inflight_.empty()) return 0;  // the send queue is full: completions make room
      return FailLocked(std::string("ibv_post_send: ") + strerror(rc), flushed);
    }
    if (inflight_.empty()) {
      busy_since_ = Clock::now();
      busy_bytes_ = 0;
    }
    inflight_[wr.wr_id] = std::move(item);
    waiting_.pop_front();
  }
  return 0;
}

uint32_t Endpoint::FailLocked(const std::string& why, std::vector<std::unique_ptr<WorkItem>>* out,
                              bool path_fault) {
  if (state_ != State::kConnected) return 0;
  state_ = State::kFailed;
  why_ = why;
  total_failures_++;
  if (path_fault) consecutive_failures_++;
  auto delay = path_fault ? std::chrono::duration_cast<std::chrono::milliseconds>(
                                cfg_.backoff * (1LL << std::min(consecutive_failures_ - 1, 20)))
                          : std::chrono::milliseconds(0);
  retry_after_ = Clock::now() + std::min(delay, std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.rail_pause));
  for (auto& w : waiting_) out->push_back(std::move(w));
  waiting_.clear();
  uint32_t destroyed = 0;
  if (inflight_.empty()) {
    destroyed = DestroyQpLocked();  // nothing to drain
    state_ = State::kIdle;
  } else if (qp_) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;  // WRs still in flight come back flushed
    nic_->api()->modify_qp(qp_, &a, IBV_QP_STATE);
  }
  MC_LOG(kWarning) << "rdma: " << label_ << " failed (" << why << "); not used for " << delay.count() << " ms";
  return destroyed;
}

uint32_t Endpoint::DestroyQpLocked() {
  if (!qp_) return 0;
  uint32_t qpn = qp_->qp_num;
  nic_->api()->destroy_qp(qp_);
  qp_ = nullptr;
  if (!closed_qps_.empty() && closed_qps_.size() >= 64) closed_qps_.erase(closed_qps_.begin());  // nobody took them
  closed_qps_.push_back({qpn, psn_});
  return qpn;
}

Endpoint::Completed Endpoint::OnCompletion(const ibv_wc& wc) {
  Completed out;
  std::lock_guard lock(mu_);
  auto it = inflight_.find(wc.wr_id);
  if (it != inflight_.end()) {
    out.item = std::move(it->second);
    inflight_.erase(it);
    budget_->inflight.fetch_sub(1);
  }
  if (wc.status == IBV_WC_SUCCESS) {
    if (out.item) {
      bytes_ += out.item->length;
      busy_bytes_ += out.item->length;
    }
    if (state_ == State::kConnected) consecutive_failures_ = 0;
  } else if (state_ == State::kConnected) {
    // This WR failed the endpoint: it alone is charged; what waits is held until the reset. When it was the
    // last in flight, the QP is destroyed here and now.
    out.destroyed_qpn =
        FailLocked(std::string(nic_->api()->wc_status_str(wc.status)) + " (" + std::to_string(wc.status) + ")",
                   &held_, /*path_fault=*/wc.status != IBV_WC_REM_ACCESS_ERR);
    out.failed_now = true;
  } else if (out.item) {
    held_.push_back(std::move(out.item));  // flushed behind the WR that failed the endpoint
  }
  if (state_ == State::kConnected) {
    if (uint32_t q = PostLocked(&held_)) out.destroyed_qpn = q;
  }
  if (inflight_.empty() && busy_bytes_ > 0) {  // a busy period ended: fold its throughput into the average
    double seconds = std::chrono::duration<double>(Clock::now() - busy_since_).count();
    if (seconds > 0) {
      double sample = static_cast<double>(busy_bytes_) / seconds;
      rate_ = rate_ > 0 ? 0.5 * rate_ + 0.5 * sample : sample;
    }
    busy_bytes_ = 0;
  }
  if (state_ == State::kFailed && inflight_.empty()) {
    if (uint32_t q = DestroyQpLocked()) out.destroyed_qpn = q;
    state_ = State::kIdle;  // reconnects once the backoff passed
  }
  if (retired_ && !closed_ && inflight_.empty() && waiting_.empty()) {
    closed_ = true;
    if (uint32_t q = DestroyQpLocked()) out.destroyed_qpn = q;
  }
  if (state_ != State::kFailed && !held_.empty()) {  // reset (or never failed: a post error with nothing in flight)
    out.resubmit = std::move(held_);
    held_.clear();
  }
  return out;
}

uint32_t Endpoint::Retire() {
  std::lock_guard lock(mu_);
  retired_ = true;
  if (closed_ || !inflight_.empty() || !waiting_.empty()) return 0;
  closed_ = true;
  return DestroyQpLocked();
}

std::vector<std::unique_ptr<WorkItem>> Endpoint::Fail(const std::string& why, uint32_t* destroyed_qpn) {
  std::vector<std::unique_ptr<WorkItem>> out;
  std::lock_guard lock(mu_);
  *destroyed_qpn = FailLocked(why, &out);
  return out;
}

std::vector<std::unique_ptr<WorkItem>> Endpoint::Close(uint32_t* qpn) {
  std::vector<std::unique_ptr<WorkItem>> out;
  std::lock_guard lock(mu_);
  closed_ = true;
  *qpn = DestroyQpLocked();
  for (auto& [id, item] : inflight_) {
    budget_->inflight.fetch_sub(1);
    out.push_back(std::move(item));
  }
  inflight_.clear();
  for (auto& w : waiting_) out.push_back(std::move(w));
  waiting_.clear();
  for (auto& h : held_) out.push_back(std::move(h));
  held_.clear();
  return out;
}

std::vector<Endpoint::ClosedQp> Endpoint::TakeClosedQps() {
  std::lock_guard lock(mu_);
  std::vector<ClosedQp> out;
  out.swap(closed_qps_);
  return out;
}

std::string Endpoint::StateText() const {
  std::lock_guard lock(mu_);
  if (closed_) return "closed";
  switch (state_) {
    case State::kConnected: return "connected";
    case State::kFailed: return "failed: " + why_;
    case State::kIdle: {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(retry_after_ - Clock::now()).count();
      if (left > 0) return "paused " + std::to_string(left) + " ms: " + why_;
      return "idle";
    }
  }
  return "?";
}

}  // namespace mooncake::te::rdma
