#include "transfer_engine/transport/testing/fault_transport.h"

#include "transfer_engine/common/log.h"

namespace mooncake::te::testing {

// ---------------------------------------------------------------------------------------------------------
// FaultController

void FaultController::SetPlan(FaultPlan plan) {
  std::lock_guard lock(mu_);
  plan_ = std::move(plan);
  nth_ = 0;
}

void FaultController::Reset() {
  std::lock_guard lock(mu_);
  plan_ = FaultPlan{};
  nth_ = 0;
  counters_ = FaultCounters{};
}

FaultCounters FaultController::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void FaultController::Count(uint64_t FaultCounters::*field, uint64_t n) {
  std::lock_guard lock(mu_);
  counters_.*field += n;
}

FaultController::Decision FaultController::Decide(size_t slices) {
  std::lock_guard lock(mu_);
  Decision d;
  counters_.posts++;
  counters_.slices += slices;
  auto take = [](int& budget) {
    if (budget == 0) return false;
    if (budget > 0) budget--;
    return true;
  };
  if (take(plan_.vanish_posts)) {
    d.kind = Decision::kVanish;
    d.on_vanish = std::move(plan_.on_vanish);
    plan_.on_vanish = nullptr;
    counters_.vanished_slices += slices;
    return d;
  }
  if (take(plan_.fail_posts)) {
    d.kind = Decision::kFailPost;
    counters_.failed_posts++;
    counters_.failed_post_slices += slices;
    return d;
  }
  d.fail_after.resize(slices, false);
  for (size_t i = 0; i < slices; ++i) {
    ++nth_;
    d.fail_after[i] = plan_.fail_every_nth > 0 && nth_ % plan_.fail_every_nth == 0;
  }
  d.delay = plan_.delay;
  d.time_out = plan_.time_out_after_delay && plan_.delay.count() > 0;
  if (d.delay.count() > 0) counters_.delayed_posts++;
  return d;
}

// ---------------------------------------------------------------------------------------------------------
// FaultTransport

FaultTransport::FaultTransport(std::string name, std::unique_ptr<Transport> inner,
                               std::shared_ptr<FaultController> controller)
    : name_(std::move(name)), inner_(std::move(inner)), controller_(std::move(controller)) {}

FaultTransport::~FaultTransport() { Stop(); }

Status FaultTransport::Start(const TransportContext& ctx) {
  MC_RETURN_IF_ERROR(inner_->Start(ctx));
  timer_ = std::thread([this] { TimerLoop(); });
  return Status::Ok();
}

void FaultTransport::Stop() {
  std::multimap<std::chrono::steady_clock::time_point, Held> held;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    held.swap(held_);
  }
  cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  Status why(ErrorCode::kSocket, "transfer engine is shutting down (fault transport '" + name_ + "')");
  for (auto& [at, h] : held) {
    for (Slice* s : h.slices) s->Complete(why);
  }
  inner_->Stop();
}

void FaultTransport::Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  Post(peer, slices, /*drive=*/false);
}

void FaultTransport::SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  Post(peer, slices, /*drive=*/true);
}

void FaultTransport::Post(const SegmentDescriptor& peer, const std::vector<Slice*>& slices, bool drive) {
  if (slices.empty()) return;
  FaultController::Decision d = controller_->Decide(slices.size());
  switch (d.kind) {
    case FaultController::Decision::kVanish: {
      if (d.on_vanish) d.on_vanish();
      Status st(ErrorCode::kPeerUnreachable,
                "injected by fault transport '" + name_ + "': peer '" + peer.name + "' vanished");
      for (Slice* s : slices) s->Fail(st, SliceRetry::kRefreshPeer);
      return;
    }
    case FaultController::Decision::kFailPost: {
      Status st(ErrorCode::kSocket, "injected by fault transport '" + name_ + "': post to '" + peer.name + "' failed");
      for (Slice* s : slices) s->Fail(st, SliceRetry::kOtherPath);
      return;
    }
    case FaultController::Decision::kForward:
      break;
  }
  if (d.delay.count() <= 0) {
    Forward(peer, slices, d.fail_after, drive);
    return;
  }
  Held h{peer, slices, std::move(d.fail_after), d.time_out};
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      held_.emplace(std::chrono::steady_clock::now() + d.delay, std::move(h));
      cv_.notify_all();
      return;
    }
  }
  for (Slice* s : slices) s->Complete(Status(ErrorCode::kSocket, "transfer engine is shutting down"));
}

void FaultTransport::Release(Held held) {
  if (held.time_out) {
    controller_->Count(&FaultCounters::timed_out_slices, held.slices.size());
    Status st(ErrorCode::kTimeout, "injected by fault transport '" + name_ + "': no completion from '" +
                                       held.peer.name + "' in time");
    for (Slice* s : held.slices) s->Complete(st);
    return;
  }
  Forward(held.peer, held.slices, held.fail_after, /*drive=*/false);
}

void FaultTransport::Forward(const SegmentDescriptor& peer, const std::vector<Slice*>& slices,
                             const std::vector<bool>& fail_after, bool drive) {
  controller_->Count(&FaultCounters::forwarded_slices, slices.size());
  std::vector<std::shared_ptr<Batch>> shadows;
  std::vector<Slice*> copies;
  shadows.reserve(slices.size());
  copies.reserve(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    Slice* real = slices[i];
    bool fail = i < fail_after.size() && fail_after[i];
    // The wrapped transport's retry advice for the copy; the hook declines, so the copy completes with its error.
    auto advice = std::make_shared<std::atomic<SliceRetry>>(SliceRetry::kFinal);
    auto shadow = std::make_shared<Batch>(1);
    shadow->SetRetryHook([advice](Slice*, const Status&, SliceRetry retry) {
      advice->store(retry);
      return false;
    });
    auto task = shadow->AddTask();
    Slice copy;
    copy.opcode = real->opcode;
    copy.local = real->local;
    copy.remote = real->remote;
    copy.length = real->length;
    shadow->StartTask(*task, {copy}, RegionPin{});
    std::string name = name_;
    std::shared_ptr<FaultController> controller = controller_;
    shadow->OnFinished([real, advice, fail, name, controller](const Batch& done) {
      Status st = done.task(0).error();
      if (st.ok() && !fail) return real->Complete(st);
      if (st.ok()) {
        controller->Count(&FaultCounters::failed_completions);
        return real->Fail(Status(ErrorCode::kSocket, "injected by fault transport '" + name +
                                                         "': error completion after the data moved"),
                          SliceRetry::kOtherPath);
      }
      SliceRetry retry = advice->load();
      if (retry == SliceRetry::kFinal) return real->Complete(st);
      real->Fail(st, retry);
    });
    copies.push_back(&(*task)->slices()[0]);
    shadows.push_back(std::move(shadow));
  }
  if (drive) {
    inner_->SubmitAndDrive(peer, copies);
  } else {
    inner_->Submit(peer, copies);
  }
  // Each in-flight copy's task keeps its batch alive until it completes.
}

void FaultTransport::TimerLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (held_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto due = held_.begin()->first;
    if (std::chrono::steady_clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;
    }
    Held h = std::move(held_.begin()->second);
    held_.erase(held_.begin());
    lock.unlock();
    Release(std::move(h));
    lock.lock();
  }
}

nlohmann::json FaultTransport::Stats() const {
  nlohmann::json out = inner_->Stats();
  if (!out.is_object()) out = nlohmann::json::object();
  FaultCounters c = controller_->counters();
  out["fault_injection"] = {{"posts", c.posts},
                            {"slices", c.slices},
                            {"failed_posts", c.failed_posts},
                            {"failed_post_slices", c.failed_post_slices},
                            {"failed_completions", c.failed_completions},
                            {"vanished_slices", c.vanished_slices},
                            {"delayed_posts", c.delayed_posts},
                            {"timed_out_slices", c.timed_out_slices},
                            {"forwarded_slices", c.forwarded_slices}};
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Registration

namespace {

struct Registered {
  std::string name, inner;
  std::shared_ptr<FaultController> controller;
};

std::mutex& RegisteredMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

std::vector<Registered>& RegisteredList() {
  static auto* list = new std::vector<Registered>;
  return *list;
}

}  // namespace

StatusOr<std::shared_ptr<FaultController>> RegisterFaultTransport(const std::string& name, const std::string& inner) {
  if (name.empty() || inner.empty() || name == inner) {
    return InvalidArgument("a fault transport needs its own non-empty name and the name of the transport it wraps");
  }
  std::lock_guard lock(RegisteredMutex());
  for (const auto& r : RegisteredList()) {
    if (r.name != name) continue;
    if (r.inner == inner) return r.controller;
    return Status(ErrorCode::kAddressOverlapped,
                  "fault transport '" + name + "' already wraps '" + r.inner + "', not '" + inner + "'");
  }
  const TransportPlugin* wrapped = TransportRegistry::Get().FindByProtocol(inner);
  if (!wrapped || wrapped->name != inner) {
    return NotFound("no transport named '" + inner + "' is registered to wrap (transports: " + [] {
      std::string all;
      for (const auto& n : TransportRegistry::Get().Names()) all += (all.empty() ? "" : ", ") + n;
      return all;
    }() + ")");
  }
  auto controller = std::make_shared<FaultController>();
  TransportPlugin plugin;
  plugin.name = name;
  plugin.protocols = {name};
  plugin.probe = wrapped->probe;
  plugin.origin = "fault injection around '" + inner + "' (" + wrapped->origin + ")";
  auto create_inner = wrapped->create;
  plugin.create = [name, create_inner, controller]() -> std::unique_ptr<Transport> {
    std::unique_ptr<Transport> t = create_inner ? create_inner() : nullptr;
    if (!t) return nullptr;
    return std::make_unique<FaultTransport>(name, std::move(t), controller);
  };
  MC_RETURN_IF_ERROR(TransportRegistry::Get().Register(std::move(plugin)));
  RegisteredList().push_back({name, inner, controller});
  return controller;
}

std::vector<std::pair<std::string, std::string>> RegisteredFaultTransports() {
  std::lock_guard lock(RegisteredMutex());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& r : RegisteredList()) out.emplace_back(r.name, r.inner);
  return out;
}

}  // namespace mooncake::te::testing
