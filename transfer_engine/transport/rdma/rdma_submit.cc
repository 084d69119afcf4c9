// The rdma transport's data path: slices cut into work items per NIC pair and chunk, posted, completed,
// retried on another pair (see rdma_transport.h).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/transport/rdma/rdma_internal.h"

namespace mooncake::te::rdma {

namespace {
// How long past its first pause a work request keeps waiting for endpoints that still drain (see Dispatch).
constexpr std::chrono::milliseconds kDrainWait{1000};
}  // namespace

void RdmaTransport::Submit(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  if (slices.empty()) return;
  Status error;
  std::shared_ptr<Peer> peer;
  if (nics_.empty() || stopping_.load()) {
    error = Status(ErrorCode::kContext, "the rdma transport is not running");
  } else {
    peer = PeerFor(desc, &error);
  }
  if (!peer) {
    for (Slice* s : slices) s->Fail(error, SliceRetry::kOtherPath);
    return;
  }
  std::vector<std::unique_ptr<WorkItem>> items;
  for (Slice* s : slices) {
    const BufferDescriptor* buf = desc.FindBuffer(s->remote, s->length);
    if (!buf) {
      s->Complete(Status(ErrorCode::kAddressNotRegistered,
                         "range " + Range(s->remote, s->length) + " is not inside a buffer of '" + desc.name + "'"));
      continue;
    }
    auto job = std::make_shared<SliceJob>();
    job->slice = s;
    job->peer = peer;
    job->remote_base = buf->addr;
    // rkey[] (one per device), or the chunk table of a chunked registration; checked whole before any use.
    const size_t devs = peer->nics.size();
    bool keys_ok = true;
    auto chunk = JsonUint(buf->json, "rdma_chunk_size");
    if (chunk) {
      auto table = buf->json.find("rdma_chunk_rkeys");
      const uint64_t chunks = *chunk ? (buf->length + *chunk - 1) / *chunk : 0;
      keys_ok = *chunk >= 4096 && table != buf->json.end() && table->is_array() && table->size() == devs &&
                chunks > 0 && chunks <= (1u << 20);
      for (size_t j = 0; keys_ok && j < devs; ++j) {
        const auto& row = (*table)[j];
        keys_ok = row.is_array() && row.size() == chunks;
        std::vector<uint32_t> keys;
        for (size_t k = 0; keys_ok && k < chunks; ++k) {
          auto key = Key32(row[k]);
          keys_ok = key.has_value();
          if (key) keys.push_back(*key);
        }
        job->rkeys.push_back(std::move(keys));
      }
      job->remote_chunk = *chunk;
    } else {
      auto rk = buf->json.find("rkey");
      keys_ok = rk != buf->json.end() && rk->is_array() && rk->size() == devs;
      for (size_t j = 0; keys_ok && j < devs; ++j) {
        auto key = Key32((*rk)[j]);
        keys_ok = key.has_value();
        if (key) job->rkeys.push_back({*key});
      }
    }
    if (!keys_ok) {
      s->Fail(Status(ErrorCode::kRemoteRejected, "buffer " + Range(buf->addr, buf->length) + " of '" + desc.name +
                                                     "' has no usable rdma keys"),
              SliceRetry::kOtherPath);
      continue;
    }
    job->pin = ctx_.memory->Find(reinterpret_cast<uint64_t>(s->local), s->length, /*remote=*/false);
    const MemoryRegion::TransportEntry* entry = job->pin ? job->pin->transport("rdma") : nullptr;
    job->local = entry && entry->state ? static_cast<const RdmaRegionState*>(entry->state.get()) : nullptr;
    if (!job->local) {
      s->Fail(Status(ErrorCode::kAddressNotRegistered, "local range " +
                                                           Range(reinterpret_cast<uint64_t>(s->local), s->length) +
                                                           " is not registered with rdma"),
              SliceRetry::kOtherPath);
      continue;
    }
    // Pieces: cut where a local or a remote registration chunk ends.
    std::vector<std::unique_ptr<WorkItem>> pieces;
    uint64_t local = reinterpret_cast<uint64_t>(s->local), remote = s->remote, left = s->length;
    while (left > 0) {
      uint64_t n = std::min<uint64_t>(left, 1ULL << 30);
      if (job->local->chunk()) {
        uint64_t off = (local - job->local->start()) % job->local->chunk();
        n = std::min(n, job->local->chunk() - off);
      }
      if (job->remote_chunk) n = std::min(n, job->remote_chunk - (remote - job->remote_base) % job->remote_chunk);
      auto item = std::make_unique<WorkItem>();
      item->local = local;
      item->remote = remote;
      item->length = static_cast<uint32_t>(n);
      item->read = s->opcode == OpCode::kRead;
      item->job = job;
      pieces.push_back(std::move(item));
      local += n;
      remote += n;
      left -= n;
    }
    job->remaining.store(static_cast<int>(pieces.size()));
    if (pieces.empty()) {
      s->Complete(Status::Ok());
      continue;
    }
    for (auto& p : pieces) items.push_back(std::move(p));
  }
  if (!items.empty()) Dispatch(peer, std::move(items), /*retry=*/false);
}

bool RdmaTransport::SetKeys(const Peer& peer, WorkItem& item, size_t pair) const {
  auto job = std::static_pointer_cast<SliceJob>(item.job);
  const size_t i = pair / peer.nics.size(), j = pair % peer.nics.size();
  auto lkey = job->local->Lkey(i, item.local);
  size_t k = job->remote_chunk ? static_cast<size_t>((item.remote - job->remote_base) / job->remote_chunk) : 0;
  if (!lkey || j >= job->rkeys.size() || k >= job->rkeys[j].size()) return false;
  item.lkey = *lkey;
  item.rkey = job->rkeys[j][k];
  item.pair = pair;
  return true;
}

void RdmaTransport::Dispatch(const std::shared_ptr<Peer>& peer, std::vector<std::unique_ptr<WorkItem>> items,
                             bool retry, bool on_strand) {
  const size_t pairs = peer->pairs();
  const size_t npeer = peer->nics.size();
  std::vector<bool> excluded(pairs, false);
  Status last = Status(ErrorCode::kPeerUnreachable, "no usable NIC pair to '" + peer->segment + "'");
  bool handshake_failed = false;
  while (!items.empty()) {
    if (stopping_.load()) {
      last = Status(ErrorCode::kContext, "the rdma transport stopped");
      break;
    }
    std::map<size_t, std::vector<std::unique_ptr<WorkItem>>> groups;
    std::vector<std::unique_ptr<WorkItem>> unplaced;
    // Striping: each local NIC with its rail (the peer NIC of the same index) while usable; an item goes to the
    // rail that would finish it first: (bytes queued there + its own) / the rail's measured throughput (the
    // mean of the measured ones while a rail has none yet). Ties go round robin.
    std::vector<double> queued(pairs, 0), rate(pairs, 0);
    std::vector<bool> usable(pairs, false);
    double known = 0;
    int measured = 0;
    for (size_t p = 0; p < pairs; ++p) {
      usable[p] = !excluded[p] && peer->ep(p)->Usable();
      if (!usable[p]) continue;
      queued[p] = static_cast<double>(peer->ep(p)->load()) * static_cast<double>(cfg_.slice_size);
      rate[p] = peer->ep(p)->rate();
      if (rate[p] > 0) {
        known += rate[p];
        measured++;
      }
    }
    const double fallback_rate = measured ? known / measured : 1.0;
    for (size_t p = 0; p < pairs; ++p) {
      if (rate[p] <= 0) rate[p] = fallback_rate;
    }
    for (auto& item : items) {
      const size_t start = static_cast<size_t>(peer->next.fetch_add(1) % peer->local_count);
      // The rails of the local NICs nearest the item's memory first (when it has such a preference), then any
      // rail; among them, striping by expected finish time.
      const std::vector<bool>& pref = std::static_pointer_cast<SliceJob>(item->job)->local->preferred;
      std::optional<size_t> chosen;
      double best = 0;
      for (int pass = pref.empty() ? 1 : 0; pass < 2 && !chosen; ++pass) {
        for (size_t step = 0; step < peer->local_count; ++step) {  // rails first
          const size_t local = (start + step) % peer->local_count;
          const size_t p = local * npeer + local % npeer;
          if (!usable[p] || (retry && p == item->pair)) continue;
          if (pass == 0 && (local >= pref.size() || !pref[local])) continue;
          const double finish = (queued[p] + item->length) / rate[p];
          if (!chosen || finish < best) {
            chosen = p;
            best = finish;
          }
        }
      }
      for (size_t step = 0; step < pairs && !chosen; ++step) {  // then any other pair
        const size_t p = (start * npeer + step) % pairs;
        if (usable[p] && !(retry && p == item->pair)) chosen = p;
      }
      if (!chosen && retry && item->pair < pairs && usable[item->pair]) chosen = item->pair;  // the only one left
      if (chosen) queued[*chosen] += item->length;
      if (!chosen || !SetKeys(*peer, *item, *chosen)) {
        unplaced.push_back(std::move(item));
        continue;
      }
      groups[*chosen].push_back(std::move(item));
    }
    items.clear();
    for (auto& [pair, group] : groups) {
      const std::shared_ptr<Endpoint>& ep = peer->ep(pair);
      const size_t i = pair / npeer, j = pair % npeer;
      Status st = ep->EnsureConnected(
          [&](const QpAddress& ours) { return Handshake(*peer, j, ours); },
          [&](uint32_t qpn) {
            Route(i, qpn, ep);
            if (!ctx_.host) return;
            nlohmann::json ready = {{"instance", ctx_.instance},
                                    {"local_nic", nics_[i]->info().name},
                                    {"peer_nic", peer->nics[j].name},
                                    {"qpn", qpn}};
            auto r = ctx_.host->CallPeer(peer->segment, "rdma.ready", ready.dump());
            if (!r.ok()) MC_LOG(kDebug) << "rdma: rdma.ready to '" << peer->segment << "': " << r.status().message();
          });
      std::vector<std::unique_ptr<WorkItem>> flushed;
      uint32_t destroyed = 0;
      const bool taken = st.ok() && ep->Enqueue(group, &flushed, &destroyed);
      QpDestroyed(ep, destroyed);
      if (taken) {
        if (!flushed.empty()) excluded[pair] = true;  // posting failed: the endpoint is down now
        for (auto& f : flushed) items.push_back(std::move(f));
        continue;
      }
      if (!st.ok()) {
        last = st;
        handshake_failed = st.code() != ErrorCode::kEndpoint;
      }
      excluded[pair] = true;
      for (auto& g : group) items.push_back(std::move(g));
    }
    if (!unplaced.empty() && on_strand && !handshake_failed && !stopping_.load()) {
      // No usable pair, but some only paused (a failure's backoff, or draining): rather than failing (the
      // engine would refresh the peer and tear down its healthy rails), these items wait on the peer's strand for
      // the earliest of them, once each. Pairs excluded here (a refused connect, a failed post) do not count.
      std::optional<std::chrono::steady_clock::time_point> until;
      for (size_t p = 0; p < pairs; ++p) {
        if (excluded[p]) continue;
        auto t = peer->ep(p)->PausedUntil();
        if (t && (!until || *t < *until)) until = t;
      }
      // An item waits for the pause it first met, and while endpoints still drain (a failed QP's flushed work
      // comes back only as fast as its CQ is polled, slower on a busy host) for up to kDrainWait more.
      std::vector<std::unique_ptr<WorkItem>> waiting;
      const auto now = std::chrono::steady_clock::now();
      for (auto& u : unplaced) {
        if (!until) break;
        if (u->wait_limit == std::chrono::steady_clock::time_point{}) u->wait_limit = std::max(*until, now + kDrainWait);
        if (now < u->wait_limit) waiting.push_back(std::move(u));
      }
      unplaced.erase(std::remove(unplaced.begin(), unplaced.end(), nullptr), unplaced.end());
      if (!waiting.empty()) {
        auto shared = std::make_shared<std::vector<std::unique_ptr<WorkItem>>>(std::move(waiting));
        auto wake = [this, peer, shared, retry] {
          RunForPeer(peer, [this, peer, shared, retry] {
            auto current = CurrentPeer(peer);
            Dispatch(current ? current : peer, std::move(*shared), retry && current == peer, /*on_strand=*/true);
          });
        };
        MC_LOG(kDebug) << "rdma: " << shared->size() << " work requests to '" << peer->segment
                       << "' wait for a paused NIC pair";
        if (!delayed_ || !delayed_->Post(*until, wake)) wake();  // stopping: Dispatch fails them at once
      }
    }
    if (!unplaced.empty()) {
      for (auto& u : unplaced) {
        auto job = std::static_pointer_cast<SliceJob>(u->job);
        FinishPiece(job, last, handshake_failed ? SliceRetry::kRefreshPeer : PathsExhausted(*job));
      }
    }
  }
  for (auto& item : items) {
    auto job = std::static_pointer_cast<SliceJob>(item->job);
    FinishPiece(job, last, stopping_.load() ? SliceRetry::kOtherPath : PathsExhausted(*job));
  }
}

SliceRetry RdmaTransport::PathsExhausted(const SliceJob& job) const {
  // Every NIC pair failed: the peer may have restarted (new QPs, GIDs or keys behind the same name), so the
  // engine first fetches its descriptor again (once per slice), which rebuilds the endpoints; after that,
  // another transport may try.
  if (stopping_.load() || job.slice->refreshed) return SliceRetry::kOtherPath;
  return SliceRetry::kRefreshPeer;
}

void RdmaTransport::OnCompletion(size_t nic, const ibv_wc& wc) {
  std::shared_ptr<Endpoint> ep;
  {
    std::lock_guard lock(mu_);
    auto it = routes_.find((uint64_t{nic} << 32) | wc.qp_num);
    if (it != routes_.end()) ep = it->second;
  }
  if (!ep) return;  // a QP already closed (Stop claimed its work)
  Endpoint::Completed c = ep->OnCompletion(wc);
  QpDestroyed(ep, c.destroyed_qpn);
  if (c.item) {
    if (wc.status == IBV_WC_SUCCESS) {
      FinishPiece(std::static_pointer_cast<SliceJob>(c.item->job), Status::Ok(), SliceRetry::kFinal);
    } else {
      std::string text = std::string(api_->wc_status_str(wc.status)) + " (" + std::to_string(wc.status) + ")";
      ItemFailed(std::move(c.item), Status(ErrorCode::kEndpoint, ep->label() + ": " + text),
                 wc.status == IBV_WC_REM_ACCESS_ERR);
    }
  }
  Resubmit(std::move(c.resubmit));
  // Room on a CQ that was full: endpoints of every peer sharing this NIC may post what waits.
  bool starved = false;
  for (const auto& b : budgets_[nic]) starved = b->starved.exchange(false) || starved;
  if (!starved) return;
  std::vector<std::shared_ptr<Endpoint>> kick;
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, e] : routes_) {
      if ((key >> 32) == nic) kick.push_back(e);
    }
  }
  for (auto& e : kick) {
    std::vector<std::unique_ptr<WorkItem>> flushed;
    uint32_t destroyed = 0;
    e->Kick(&flushed, &destroyed);
    QpDestroyed(e, destroyed);
    Resubmit(std::move(flushed));  // never posted: not charged
  }
}

std::shared_ptr<RdmaTransport::Peer> RdmaTransport::CurrentPeer(const std::shared_ptr<Peer>& old) {
  std::lock_guard lock(mu_);
  if (stopping_.load()) return nullptr;  // Stop emptied peers_ (under mu_): a Peer made now would never close
  auto it = peers_.find(old->key);
  if (it != peers_.end()) return it->second;
  // Forgotten meanwhile (a descriptor refresh): fresh endpoints to the same NICs.
  auto p = MakePeerLocked(old->key, old->segment, old->nics);
  peers_[old->key] = p;
  return p;
}

void RdmaTransport::Resubmit(std::vector<std::unique_ptr<WorkItem>> items) {
  if (items.empty()) return;
  std::map<Peer*, std::pair<std::shared_ptr<Peer>, std::vector<std::unique_ptr<WorkItem>>>> by_peer;
  for (auto& item : items) {
    auto job = std::static_pointer_cast<SliceJob>(item->job);
    auto& slot = by_peer[job->peer.get()];
    slot.first = job->peer;
    slot.second.push_back(std::move(item));
  }
  for (auto& [raw, slot] : by_peer) {
    auto peer = CurrentPeer(slot.first);
    if (!peer) {
      for (auto& item : slot.second) {
        FinishPiece(std::static_pointer_cast<SliceJob>(item->job),
                    Status(ErrorCode::kContext, "the rdma transport stopped"), SliceRetry::kOtherPath);
      }
      continue;
    }
    auto shared = std::make_shared<std::vector<std::unique_ptr<WorkItem>>>(std::move(slot.second));
    RunForPeer(peer, [this, peer, shared] {
      Dispatch(peer, std::move(*shared), /*retry=*/false, /*on_strand=*/true);
    });
  }
}

void RdmaTransport::RunForPeer(const std::shared_ptr<Peer>& peer, std::function<void()> fn) {
  {
    std::lock_guard lock(peer->retry_mu);
    peer->retry_jobs.push_back(std::move(fn));
    if (peer->retry_running) return;  // the strand's runner takes it
    peer->retry_running = true;
  }
  auto drain = [peer] {
    for (;;) {
      std::function<void()> job;
      {
        std::lock_guard lock(peer->retry_mu);
        if (peer->retry_jobs.empty()) {
          peer->retry_running = false;
          return;
        }
        job = std::move(peer->retry_jobs.front());
        peer->retry_jobs.pop_front();
      }
      job();
    }
  };
  // Stopped: run here (Dispatch then fails the items at once, without a handshake).
  if (!worker_ || !worker_->Post(drain)) drain();
}

void RdmaTransport::ItemFailed(std::unique_ptr<WorkItem> item, const Status& status, bool remote_access) {
  auto job = std::static_pointer_cast<SliceJob>(item->job);
  if (remote_access) {
    // The peer's HCA refused the key or range: it withdrew the memory since its descriptor was fetched.
    FinishPiece(job, Status(ErrorCode::kRemoteRejected, status.message() + " (the peer refused the range)"),
                SliceRetry::kRefreshPeer);
    return;
  }
  bool again;
  {
    std::lock_guard lock(job->mu);
    again = static_cast<int>(job->slice->attempts) < cfg_.retry_count && !stopping_.load();
    if (again) job->slice->attempts++;
  }
  if (!again) {
    FinishPiece(job, status, PathsExhausted(*job));
    return;
  }
  job->peer->counters->retries++;
  std::shared_ptr<Peer> peer = CurrentPeer(job->peer);
  if (!peer) {
    FinishPiece(job, Status(ErrorCode::kContext, "the rdma transport stopped"), SliceRetry::kOtherPath);
    return;
  }
  // On the peer's strand of the worker pool: a retry may need a handshake, which must not run on a polling
  // thread, and a slow peer's handshakes hold up only its own retries.
  auto shared = std::make_shared<std::unique_ptr<WorkItem>>(std::move(item));
  RunForPeer(peer, [this, peer, shared] {
    std::vector<std::unique_ptr<WorkItem>> one;
    one.push_back(std::move(*shared));
    Dispatch(peer, std::move(one), /*retry=*/true, /*on_strand=*/true);
  });
}

void RdmaTransport::FinishPiece(const std::shared_ptr<SliceJob>& job, const Status& status, SliceRetry retry) {
  if (!status.ok()) {
    std::lock_guard lock(job->mu);
    if (job->error.ok()) {
      job->error = status;
      job->retry = retry;
    }
  }
  if (job->remaining.fetch_sub(1) != 1) return;
  Slice* s = job->slice;
  Status error;
  SliceRetry how;
  {
    std::lock_guard lock(job->mu);
    error = job->error;
    how = job->retry;
  }
  if (error.ok()) {
    job->peer->counters->bytes += s->length;
    job->peer->counters->slices++;
    s->Complete(Status::Ok());
  } else {
    job->peer->counters->errors++;
    if (how == SliceRetry::kFinal) {
      s->Complete(error);
    } else {
      s->Fail(error, how);
    }
  }
}

}  // namespace mooncake::te::rdma
