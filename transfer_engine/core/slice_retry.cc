#include "transfer_engine/core/slice_retry.h"

#include <algorithm>
#include <map>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"

namespace mooncake::te {

bool SliceRetrier::OnFailure(Slice* slice, const Status& status, SliceRetry retry) {
  if (retry == SliceRetry::kRefreshPeer && slice->refreshed) return false;
  if (retry == SliceRetry::kOtherPath &&
      (slice->engine_attempts >= static_cast<uint32_t>(std::max(0, s_.retry_count)) || s_.transports->size() < 2)) {
    return false;
  }
  const std::string& segment = slice->task->route.segment;
  bool post;
  {
    std::lock_guard lock(mu_);
    auto& q = pending_[segment];
    post = !q.scheduled;
    q.scheduled = true;
    q.queue.push_back({slice, status, retry});
  }
  if (!post || s_.worker->Post([this, segment] { Drain(segment); })) return true;
  // Shutting down: nothing will move them again.
  for (auto& p : Take(segment, /*finish=*/true)) {
    if (p.slice != slice) p.slice->Complete(p.status);
  }
  return false;
}

std::vector<SliceRetrier::Pending> SliceRetrier::Take(const std::string& segment, bool finish) {
  std::vector<Pending> out;
  std::lock_guard lock(mu_);
  auto it = pending_.find(segment);
  if (it == pending_.end()) return out;
  out.swap(it->second.queue);
  if (finish || out.empty()) pending_.erase(it);
  return out;
}

void SliceRetrier::Drain(const std::string& segment) {
  for (;;) {
    std::vector<Pending> queued = Take(segment, /*finish=*/false);
    if (queued.empty()) return;  // Take ended the segment's turn under the lock: a later failure posts again
    Run(segment, std::move(queued));
  }
}

void SliceRetrier::Run(const std::string& segment, std::vector<Pending> queued) {
  auto cached = s_.descriptor(segment, /*refresh=*/false);
  std::shared_ptr<const SegmentDescriptor> desc = cached.ok() ? *cached : nullptr;
  // A refresh is needed unless every slice asking for one was handed out before the last refresh started
  // (stragglers of the failure that refresh already answered).
  bool refresh = false, reuse = false;
  Status refresh_error;
  {
    std::lock_guard lock(mu_);
    for (auto it = last_refresh_.begin(); it != last_refresh_.end();) {  // bounded: old outcomes answer nothing
      it = std::chrono::steady_clock::now() - it->second.started > kForgetRefresh ? last_refresh_.erase(it)
                                                                                   : std::next(it);
    }
    auto recent = last_refresh_.find(segment);
    for (const auto& p : queued) {
      if (p.retry != SliceRetry::kRefreshPeer) continue;
      if (recent != last_refresh_.end() && p.slice->handed_out < recent->second.started) reuse = true;
      else refresh = true;
    }
    if (!refresh && reuse) refresh_error = recent->second.error;
  }
  if (refresh) {
    auto started = std::chrono::steady_clock::now();
    s_.forget(segment);  // the cached descriptor and the transports' connections and mappings
    auto fresh = s_.descriptor(segment, /*refresh=*/true);
    if (fresh.ok()) desc = *fresh;
    else refresh_error = fresh.status();
    std::lock_guard lock(mu_);
    last_refresh_[segment] = {started, refresh_error};
  }
  std::map<Transport*, std::vector<Slice*>> groups;
  for (auto& p : queued) {
    Slice* slice = p.slice;
    auto fail = [&](const std::string& why, ErrorCode code) {
      slice->Complete(why.empty() ? p.status : Status(code, p.status.message() + "; " + why));
    };
    if (p.retry == SliceRetry::kRefreshPeer) {
      slice->refreshed = true;
      if (!refresh_error.ok()) {
        fail("refreshing the peer's descriptor failed: " + refresh_error.message(), p.status.code());
        continue;
      }
    }
    if (!desc) {
      fail("", p.status.code());
      continue;
    }
    if (!desc->FindBuffer(slice->remote, slice->length)) {
      fail("segment '" + segment + "' no longer registers " + Range(slice->remote, slice->length),
           ErrorCode::kAddressNotRegistered);
      continue;
    }
    const Task::Route& route = slice->task->route;
    RegionPin pin = s_.memory->Find(reinterpret_cast<uint64_t>(slice->local), slice->length, /*remote=*/false);
    MemoryRegion unregistered;  // the task holds its pin, so this is only for a region gone meanwhile
    unregistered.kind = route.local_kind;
    const MemoryRegion& local = pin ? *pin : unregistered;
    Transport* t = s_.transports->Select(*desc, local, route.remote_kind,
                                         p.retry == SliceRetry::kOtherPath ? slice->tried_transports : 0);
    if (!t) {
      fail(p.retry == SliceRetry::kOtherPath ? "no other transport can reach the peer" : "", p.status.code());
      continue;
    }
    slice->engine_attempts++;
    slice->tried_transports |= s_.transports->Bit(t);
    slice->handed_out = std::chrono::steady_clock::now();
    groups[t].push_back(slice);
  }
  for (auto& [t, slices] : groups) {
    MC_LOG(kInfo) << "moving " << slices.size() << " slice(s) to '" << segment << "' again through " << t->name()
                  << " after: " << queued.front().status.message();
    t->Submit(*desc, slices);
  }
}

}  // namespace mooncake::te
