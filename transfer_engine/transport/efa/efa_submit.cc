// EfaTransport's data path: a submission's epoch check, striping over the paths, posting (one operation
// per chunk piece), completions, the write fence and moving failed slices to another path.

#include "transfer_engine/transport/efa/efa_transport.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/transport/efa/efa_internal.h"

namespace mooncake::te::efa {

void EfaTransport::Finish(Peer& peer, Slice* s, const Status& st) {
  {
    std::lock_guard lock(peer.mu);
    if (st.ok()) {
      peer.bytes += s->length;
      peer.slices++;
    } else {
      peer.errors++;
    }
  }
  if (st.ok()) {
    s->Complete(st);
  } else if (st.code() == ErrorCode::kStaleMetadata) {
    s->Fail(st, SliceRetry::kRefreshPeer);
  } else {
    s->Fail(st, SliceRetry::kOtherPath);
  }
}

void EfaTransport::Finish(Peer& peer, const Item& item, const Status& st) {
  std::shared_ptr<DriveCount> drive = item.drive;  // the item may go with its slice
  Finish(peer, item.slice, st);
  if (drive) drive->left.fetch_sub(1, std::memory_order_acq_rel);
}

void EfaTransport::Submit(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  SubmitItems(desc, slices, nullptr);
}

void EfaTransport::SubmitAndDrive(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  uint64_t bytes = 0;
  for (const Slice* s : slices) bytes += s->length;
  if (cfg_.drive_us <= 0 || bytes > cfg_.drive_max_bytes || rails_.empty() || stopping_.load()) {
    Submit(desc, slices);
    return;
  }
  auto drive = std::make_shared<DriveCount>();
  SubmitItems(desc, slices, drive);
  // Reap on this thread: the completions of this submission's operations (and whatever else completes on
  // these domains meanwhile) run here, not on the progress threads, which saves handing each completion from
  // one thread to the next. Only the rails this submission posted to are driven (DriveRail, as it posts);
  // the others' progress threads carry on. One rail: sleep in its completion queue where it has a wait
  // object; several, or polling providers: poll them in turn. Past the budget, the progress threads finish
  // the rest.
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(cfg_.drive_us);
  std::vector<int> driven;
  for (uint32_t spins = 0; drive->left.load(std::memory_order_acquire) != 0; ++spins) {
    {
      std::lock_guard lock(drive->mu);
      driven = drive->rails;
    }
    if (driven.empty()) break;  // posted by nobody on this thread (e.g. behind another caller's epoch read)
    const int wait_ms = driven.size() == 1 ? 1 : 0;
    size_t reaped = 0;
    for (int r : driven) reaped += rails_[r]->domain->Poll(wait_ms);
    if (reaped == 0 && (wait_ms > 0 || (spins & 63) == 63) && std::chrono::steady_clock::now() >= until) break;
  }
  {
    std::lock_guard lock(drive->mu);
    drive->closed = true;
    driven = drive->rails;
  }
  for (int r : driven) rails_[r]->domain->EndDrive();
}

void EfaTransport::DriveRail(const std::shared_ptr<DriveCount>& drive, int rail) {
  if (!drive) return;
  std::lock_guard lock(drive->mu);
  if (drive->closed || std::find(drive->rails.begin(), drive->rails.end(), rail) != drive->rails.end()) return;
  drive->rails.push_back(rail);
  rails_[rail]->domain->BeginDrive();
}

void EfaTransport::SubmitItems(const SegmentDescriptor& desc, const std::vector<Slice*>& slices,
                               const std::shared_ptr<DriveCount>& drive) {
  if (slices.empty()) return;
  Status error;
  std::shared_ptr<Peer> peer = rails_.empty() ? nullptr : PeerFor(desc, &error);
  if (rails_.empty()) error = Status(ErrorCode::kContext, "the efa transport is not started");
  if (!peer) {
    for (Slice* s : slices) s->Fail(error, SliceRetry::kOtherPath);
    return;
  }
  auto items = std::make_shared<std::vector<Item>>();
  std::map<const BufferDescriptor*, std::shared_ptr<const RemoteKeys>> keys_of;
  for (Slice* s : slices) {
    const BufferDescriptor* buf = desc.FindBuffer(s->remote, s->length);
    if (!buf) {
      Finish(*peer, s, Status(ErrorCode::kAddressNotRegistered,
                              "range " + Range(s->remote, s->length) + " is not inside a buffer of '" + desc.name + "'"));
      continue;
    }
    auto& keys = keys_of[buf];
    if (!keys) {
      auto k = ReadBufferKeys(*buf, peer->fabric);
      if (k) keys = std::make_shared<const RemoteKeys>(std::move(*k));
    }
    if (!keys) {
      Finish(*peer, s, Status(ErrorCode::kRemoteRejected, "buffer " + Range(buf->addr, buf->length) + " of '" +
                                                              desc.name + "' is not registered with efa"));
      continue;
    }
    RegionPin pin = ctx_.memory->Find(reinterpret_cast<uint64_t>(s->local), s->length, /*remote=*/false);
    const MemoryRegion::TransportEntry* entry = pin ? pin->transport("efa") : nullptr;
    auto* state = entry && entry->state ? static_cast<const EfaRegionState*>(entry->state.get()) : nullptr;
    if (!state || state->mrs.size() != rails_.size()) {
      Finish(*peer, s, Status(ErrorCode::kAddressNotRegistered,
                              "local range " + Range(reinterpret_cast<uint64_t>(s->local), s->length) +
                                  " is not registered with efa"));
      continue;
    }
    Item item;
    item.slice = s;
    item.local = state;
    item.local_offset = reinterpret_cast<uint64_t>(s->local) - pin->start;
    item.pin = std::move(pin);
    item.keys = keys;
    item.remote_offset = s->remote - buf->addr;
    item.drive = drive;
    items->push_back(std::move(item));
  }
  if (items->empty()) return;
  if (drive) drive->left.store(items->size(), std::memory_order_release);
  const uint64_t epoch = peer->fabric.has_epoch ? JsonUint(desc.json, "efa_epoch").value_or(0) : 0;
  for (auto& item : *items) item.epoch = epoch;
  Start(peer, std::move(items), epoch, /*revive=*/true);
}

void EfaTransport::Start(const std::shared_ptr<Peer>& peer, std::shared_ptr<std::vector<Item>> items,
                         uint64_t expected, bool revive) {
  if (!peer->fabric.has_epoch) {
    Distribute(peer, std::move(*items), revive);
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  {
    // Epoch lease (the peer publishes efa_epoch_lease_us = L): a value read back equal to `expected` vouches
    // for the descriptor until L/2 after that read was posted. Why no write lands once the peer's
    // UnregisterMemory has returned (as with a read before every submission): the peer served the read after
    // it was posted, so the lease ends less than L/2 after the peer's clock saw the old value; a
    // WithdrawRegion that moved the epoch on after that waits L before it returns, and the engine drains and
    // unregisters the region only then. So whatever this engine posts under a lease is posted at least L/2
    // before that Withdraw returns, and a submission starting more than L/2 after the Withdraw began reads
    // the epoch again and fails with kStaleMetadata. The margin covers the post itself and clock rate
    // differences (steady clocks: microseconds per second at worst). What the lease adds: for up to L/2
    // after a withdrawal began, writes of a lease holder may still land in the region while the peer's
    // UnregisterMemory waits (the region is still registered; its owner does not have it back). What neither
    // covers: an operation posted before a withdrawal and delivered after it.
    // Operations queued in a domain behind others may reach the provider long after the check: each carries
    // the lease's end (post_by), and one still queued then is not posted but comes back here (RunDone).
    std::unique_lock lock(peer->mu);
    if (peer->leased && peer->leased_epoch == expected && now < peer->lease_until) {
      peer->lease_hits++;
      const auto until = peer->lease_until;
      lock.unlock();
      for (auto& item : *items) item.post_by = until;
      Distribute(peer, std::move(*items), revive);
      return;
    }
    // A read of the same value in flight: its answer vouches for these items too, as a lease does (it may
    // have been served before they came; they are posted by its lease's end). Without a lease (L = 0) each
    // submission reads for itself: a read served before it began would not see a withdrawal since.
    if (auto it = peer->reading.find(expected); it != peer->reading.end() && peer->fabric.epoch_lease_us / 2 > 0) {
      for (auto& item : *items) it->second->push_back(std::move(item));
      return;
    }
  }
  const auto lease = std::chrono::microseconds(peer->fabric.epoch_lease_us / 2);
  const int path = ChoosePath(*peer, revive);
  if (path < 0) {
    Status down(ErrorCode::kPeerUnreachable, "every efa path to '" + peer->name + "' is down");
    for (auto& item : *items) Finish(*peer, item, down);
    return;
  }
  std::shared_ptr<DriveCount> drive = items->empty() ? nullptr : items->front().drive;
  const bool shared = lease.count() > 0;
  {
    std::lock_guard lock(peer->mu);
    if (auto it = peer->reading.find(expected); shared && it != peer->reading.end()) {
      for (auto& item : *items) it->second->push_back(std::move(item));
      return;
    }
    if (shared) peer->reading[expected] = items;  // later Start calls for `expected` add theirs (under mu)
    peer->epoch_reads++;
  }
  // Nothing is posted until the peer's epoch says its descriptor is current.
  ReadEpoch(peer, path, drive, [this, peer, items, shared, expected, path, lease, now](const Status& st,
                                                                                       uint64_t value) {
    std::shared_ptr<std::vector<Item>> all = items;
    if (shared) {
      std::lock_guard lock(peer->mu);
      auto it = peer->reading.find(expected);
      all = it->second;
      peer->reading.erase(it);
    }
    if (!st.ok()) {
      PathFailed(*peer, path, st);
      Start(peer, all, expected, /*revive=*/false);  // another path that is up, until none is left
      return;
    }
    if (value != expected) {
      Status stale(ErrorCode::kStaleMetadata, "'" + peer->name +
                                                  "' withdrew memory since its descriptor was fetched (epoch " +
                                                  std::to_string(value) + ", descriptor " +
                                                  std::to_string(expected) + ")");
      {
        std::lock_guard lock(peer->mu);
        peer->stale++;
        peer->leased = false;
      }
      for (auto& item : *all) Finish(*peer, item, stale);
      return;
    }
    std::chrono::steady_clock::time_point until{};
    if (lease.count() > 0) {
      // `now` is when this read was about to be posted; reads of the same value may complete out of order.
      std::lock_guard lock(peer->mu);
      const bool extend = peer->leased && peer->leased_epoch == value;
      peer->lease_until = extend ? std::max(peer->lease_until, now + lease) : now + lease;
      peer->leased = true;
      peer->leased_epoch = value;
      until = peer->lease_until;
    }
    for (auto& item : *all) item.post_by = until;
    Distribute(peer, std::move(*all), /*revive=*/false);
  });
}

void EfaTransport::Distribute(const std::shared_ptr<Peer>& peer, std::vector<Item> items, bool revive) {
  std::map<int, std::shared_ptr<Group>> groups;
  std::vector<Item> unplaced;
  for (auto& item : items) {
    const int path = ChoosePath(*peer, revive);
    if (path < 0) {
      unplaced.push_back(std::move(item));
      continue;
    }
    {
      std::lock_guard lock(peer->mu);
      peer->paths[path].in_flight += item.slice->length;
    }
    auto& g = groups[path];
    if (!g) {
      g = std::make_shared<Group>();
      g->peer = peer;
      g->path = path;
      g->fence_writes = peer->fabric.has_epoch && !rails_[peer->paths[path].rail]->domain->info().delivery_complete;
    }
    g->items.push_back(std::move(item));
  }
  Status down(ErrorCode::kPeerUnreachable, "every efa path to '" + peer->name + "' is down");
  for (auto& item : unplaced) Finish(*peer, item, down);
  for (auto& [path, g] : groups) PostGroup(g);
}

void EfaTransport::PostGroup(const std::shared_ptr<Group>& g) {
  Peer& peer = *g->peer;
  int rail_index;
  size_t device;
  fi_addr_t dest;
  {
    std::lock_guard lock(peer.mu);
    const Path& p = peer.paths[g->path];
    rail_index = p.rail;
    device = p.device;
    dest = p.addr;
  }
  Rail& rail = *rails_[rail_index];
  const bool virt = peer.fabric.virt_addr;
  g->remaining.store(g->items.size());
  std::vector<std::unique_ptr<FabricOp>> ops;
  for (auto& item : g->items) {
    auto run = std::make_shared<Run>();
    run->item = std::move(item);
    Slice* s = run->item.slice;
    const EfaRegionState& local = *run->item.local;
    // One operation per (local chunk, remote chunk) piece of the slice.
    std::vector<std::unique_ptr<FabricOp>> mine;
    Status bad;
    for (uint64_t pos = 0; pos < s->length;) {
      const uint64_t loff = run->item.local_offset + pos;
      const uint64_t roff = run->item.remote_offset + pos;
      uint64_t n = s->length - pos;
      n = std::min<uint64_t>(n, local.chunk - loff % local.chunk);
      if (run->item.keys->chunk != 0) n = std::min<uint64_t>(n, run->item.keys->chunk - roff % run->item.keys->chunk);
      uint64_t key = 0, chunk_offset = 0;
      const size_t lchunk = static_cast<size_t>(loff / local.chunk);
      if (!run->item.keys->Lookup(device, roff, &key, &chunk_offset) || lchunk >= local.mrs[rail_index].size()) {
        bad = Status(ErrorCode::kRemoteRejected, "no efa key of '" + peer.name + "' for " + Range(s->remote + pos, n));
        break;
      }
      auto op = std::make_unique<FabricOp>();
      op->kind = s->opcode == OpCode::kWrite ? FabricOp::Kind::kWrite : FabricOp::Kind::kRead;
      op->local = s->local + pos;
      op->length = n;
      op->local_desc = local.mrs[rail_index][lchunk]->desc();
      op->dest = dest;
      op->remote_addr = virt ? s->remote + pos : chunk_offset;
      op->remote_key = key;
      op->post_by = run->item.post_by;
      mine.push_back(std::move(op));
      pos += n;
    }
    if (!bad.ok()) {
      {
        std::lock_guard lock(peer.mu);
        peer.paths[g->path].in_flight -= s->length;
      }
      Finish(peer, run->item, bad);
      GroupItemDone(g);
      continue;
    }
    DriveRail(run->item.drive, rail_index);
    run->left.store(static_cast<int>(mine.size()));
    for (auto& op : mine) {
      op->done = [this, g, run](const Status& st) {
        if (IsNotPostedInTime(st)) {
          std::lock_guard lock(run->mu);
          run->late = true;
        } else if (!st.ok()) {
          std::lock_guard lock(run->mu);
          if (run->error.ok()) run->error = st;
        }
        if (run->left.fetch_sub(1) == 1) RunDone(g, run);
      };
      ops.push_back(std::move(op));
    }
  }
  g->items.clear();
  for (auto& op : ops) rail.domain->Post(std::move(op));
}

void EfaTransport::RunDone(const std::shared_ptr<Group>& g, const std::shared_ptr<Run>& run) {
  Peer& peer = *g->peer;
  Slice* s = run->item.slice;
  Status st;
  bool late;
  {
    std::lock_guard lock(run->mu);
    st = run->error;
    late = run->late;
  }
  {
    std::lock_guard lock(peer.mu);
    Path& p = peer.paths[g->path];
    p.in_flight -= s->length;
    if (st.ok() && !late) {
      p.bytes += s->length;
      p.slices++;
    }
  }
  if (!st.ok()) {
    PathFailed(peer, g->path, st);
    Retry(g->peer, std::move(run->item), st);
  } else if (late) {
    // Its lease ended before all of it was posted (the path is fine): the epoch is checked again and the
    // whole slice posted once more.
    Retry(g->peer, std::move(run->item), NotPostedInTime(), /*count=*/false);
  } else if (g->fence_writes && s->opcode == OpCode::kWrite) {
    std::lock_guard lock(g->mu);
    g->held.push_back(run);
  } else {
    Finish(peer, run->item, st);
  }
  GroupItemDone(g);
}

void EfaTransport::GroupItemDone(const std::shared_ptr<Group>& g) {
  if (g->remaining.fetch_sub(1) != 1) return;
  std::vector<std::shared_ptr<Run>> held;
  {
    std::lock_guard lock(g->mu);
    held.swap(g->held);
  }
  if (held.empty()) return;
  // A read on the same connection is answered after the writes before it were applied.
  // Its value is checked too: the peer withdrew memory while the writes were in flight when it moved on, so
  // they may have landed in a withdrawn region and are not reported as done.
  ReadEpoch(g->peer, g->path, nullptr, [this, g, held = std::move(held)](const Status& fence, uint64_t value) {
    if (!fence.ok()) PathFailed(*g->peer, g->path, fence);
    bool stale = false;
    for (const auto& run : held) {
      if (!fence.ok()) {
        Retry(g->peer, std::move(run->item), Status(fence.code(), "efa write not confirmed: " + fence.message()));
      } else if (value != run->item.epoch) {
        stale = true;
        Finish(*g->peer, run->item,
               Status(ErrorCode::kStaleMetadata, "'" + g->peer->name + "' withdrew memory while efa writes to it "
                                                 "were in flight (epoch " + std::to_string(value) +
                                                 ", descriptor " + std::to_string(run->item.epoch) + ")"));
      } else {
        Finish(*g->peer, run->item, Status::Ok());
      }
    }
    if (stale) {
      std::lock_guard lock(g->peer->mu);
      g->peer->stale++;
      g->peer->leased = false;
    }
  });
}

void EfaTransport::Retry(const std::shared_ptr<Peer>& peer, Item item, const Status& why, bool count) {
  Slice* s = item.slice;
  if (stopping_.load()) {
    // Not kStaleMetadata (a missed lease): that would make the engine refresh a peer that did nothing.
    Finish(*peer, item, IsNotPostedInTime(why) ? Status(ErrorCode::kSocket, "the efa transport is shutting down")
                                               : why);
    return;
  }
  if (count && ++s->attempts > static_cast<uint32_t>(std::max(0, retry_count_))) {
    Finish(*peer, item, Status(why.code(), why.message() + " (gave up after " + std::to_string(s->attempts) +
                                            " attempts, MC_RETRY_CNT)"));
    return;
  }
  const uint64_t epoch = item.epoch;
  item.post_by = {};
  auto one = std::make_shared<std::vector<Item>>();
  one->push_back(std::move(item));
  // Through the epoch check again: the lease the first posting relied on may be over. Fails it at once when
  // no path is up.
  Start(peer, std::move(one), epoch, /*revive=*/false);
}

void EfaTransport::ReadEpoch(const std::shared_ptr<Peer>& peer, int path, const std::shared_ptr<DriveCount>& drive,
                             std::function<void(const Status&, uint64_t)> then) {
  int rail_index;
  size_t device;
  fi_addr_t dest;
  {
    std::lock_guard lock(peer->mu);
    const Path& p = peer->paths[path];
    rail_index = p.rail;
    device = p.device;
    dest = p.addr;
  }
  Rail& rail = *rails_[rail_index];
  auto slot = rail.slots->Take();
  if (!slot.ok()) {
    then(slot.status(), 0);
    return;
  }
  auto op = std::make_unique<FabricOp>();
  op->kind = FabricOp::Kind::kRead;
  op->local = slot->ptr;
  op->length = sizeof(uint64_t);
  op->local_desc = slot->desc;
  op->dest = dest;
  op->remote_addr = peer->fabric.virt_addr ? peer->fabric.epoch_addr : 0;
  op->remote_key = peer->fabric.epoch_rkeys[device];
  DriveRail(drive, rail_index);
  EpochSlots* slots = rail.slots.get();
  EpochSlots::Slot ref = *slot;
  op->done = [slots, ref, then = std::move(then)](const Status& st) {
    uint64_t value = *reinterpret_cast<volatile uint64_t*>(ref.ptr);
    slots->Give(ref);
    then(st, value);
  };
  rail.domain->Post(std::move(op));
}

}  // namespace mooncake::te::efa
