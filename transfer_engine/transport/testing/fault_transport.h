#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TESTING_FAULT_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TESTING_FAULT_TRANSPORT_H_

// A fault injector for tests: a Transport that wraps a real one and, per a plan the test sets, fails posts, fails
// completions on its path, makes the peer look gone, or completes late, so the engine's retry and failover rules
// (core/engine.cc RetrySlice / RunRetries) can be checked against real transports.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "transfer_engine/transport/transport.h"

namespace mooncake::te::testing {

/// What the fault transports of one name do with the slices handed to them. Each Submit / SubmitAndDrive call
/// (a "post") is judged once, in this order: peer vanished, failed post, then forwarded (with error completions
/// and delay). Plain value type.
struct FaultPlan {
  /// Peer vanishes: the next `vanish_posts` posts (-1: every one) fail all their slices at once, not moved, with
  /// kPeerUnreachable and SliceRetry::kRefreshPeer. `on_vanish` runs once, on the posting thread, before the first
  /// of them: that is where a test makes the peer really go away (destroys its engine, kills its process).
  int vanish_posts = 0;
  std::function<void()> on_vanish;
  /// Failed post: the next `fail_posts` posts (-1: every one) fail all their slices at once, not moved, with
  /// kSocket and SliceRetry::kOtherPath.
  int fail_posts = 0;
  /// Error completion on this path: every Nth slice forwarded (counted over all posts since SetPlan; 0: none) is
  /// moved by the wrapped transport, then reported failed with kSocket and SliceRetry::kOtherPath.
  uint32_t fail_every_nth = 0;
  /// Slow completion: a forwarded post waits this long (on the fault transport's timer thread) before the
  /// wrapped transport sees it.
  std::chrono::milliseconds delay{0};
  /// With a delay: instead of forwarding, complete the slices (not moved) with kTimeout, as a transport whose
  /// own transfer timeout ran out reports them.
  bool time_out_after_delay = false;
};

/// What the fault transports of one name did (counted over all their instances since the last reset).
struct FaultCounters {
  uint64_t posts = 0;               ///< Submit / SubmitAndDrive calls
  uint64_t slices = 0;              ///< slices handed in (a slice moved again counts again)
  uint64_t failed_posts = 0;        ///< posts failed at once (their slices are in `failed_post_slices`)
  uint64_t failed_post_slices = 0;
  uint64_t failed_completions = 0;  ///< slices moved, then reported failed
  uint64_t vanished_slices = 0;     ///< slices failed with kRefreshPeer
  uint64_t delayed_posts = 0;       ///< posts held back by `delay`
  uint64_t timed_out_slices = 0;    ///< slices completed with kTimeout after the delay
  uint64_t forwarded_slices = 0;    ///< slices handed to the wrapped transport
};

/// The plan and counters shared by every FaultTransport registered under one name (each engine of the process
/// that installs that name gets its own instance). Thread-safe.
class FaultController {
 public:
  /// Replaces the plan (and restarts the every-Nth count); later posts obey it.
  void SetPlan(FaultPlan plan);
  /// Back to forwarding everything unchanged, counters zeroed.
  void Reset();
  FaultCounters counters() const;

  /// How one post is treated (FaultTransport's use).
  struct Decision {
    enum Kind { kForward, kFailPost, kVanish } kind = kForward;
    std::function<void()> on_vanish;  ///< set once, for the first vanished post
    std::vector<bool> fail_after;     ///< per slice, when forwarded: report an error completion
    std::chrono::milliseconds delay{0};
    bool time_out = false;
  };
  Decision Decide(size_t slices);
  void Count(uint64_t FaultCounters::*field, uint64_t n = 1);

 private:
  mutable std::mutex mu_;
  FaultPlan plan_;
  uint64_t nth_ = 0;  // slices forwarded since SetPlan
  FaultCounters counters_;
};

/// The decorator: behaves as `inner` (capabilities, descriptor fields, registrations, reachability, slice size,
/// counters) under its own name, except for the faults its controller's plan injects into Submit. Slices it
/// forwards reach the wrapped transport as copies (each in a one-slice batch of its own), so it sees their
/// completions and reports them, possibly changed, on the original slices, with the wrapped transport's retry
/// advice. Options reach the wrapped transport under the decorator's name ("<name>.<key>"); a wrapped transport
/// that registers handshake methods cannot be installed next to an undecorated instance of itself.
///
/// Threading: as any Transport. Completions come from the wrapped transport's threads, the posting thread (failed
/// posts), or the timer thread (delays). Stop fails the posts still held back (kSocket), then stops the wrapped one.
class FaultTransport : public Transport {
 public:
  FaultTransport(std::string name, std::unique_ptr<Transport> inner, std::shared_ptr<FaultController> controller);
  ~FaultTransport() override;

  std::string name() const override { return name_; }
  TransportCapabilities capabilities() const override { return inner_->capabilities(); }
  Status Configure(const TransportOptions& options) override { return inner_->Configure(options); }
  std::string advertised_address() const override { return inner_->advertised_address(); }
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override {
    return inner_->RegisterRegion(region);
  }
  void WithdrawRegion(const MemoryRegion& region) override { inner_->WithdrawRegion(region); }
  void UnregisterRegion(const MemoryRegion& region) override { inner_->UnregisterRegion(region); }
  void Describe(nlohmann::json& descriptor) const override { inner_->Describe(descriptor); }
  bool CanReach(const SegmentDescriptor& peer) const override { return inner_->CanReach(peer); }
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override { inner_->ForgetPeer(segment_name); }
  size_t slice_size() const override { return inner_->slice_size(); }
  /// The wrapped transport's per-path counters plus "fault_injection": the controller's counters.
  nlohmann::json Stats() const override;
  nlohmann::json ListenerStats() const override { return inner_->ListenerStats(); }

 private:
  struct Held {
    SegmentDescriptor peer;  // a copy: the engine's may be gone when the delay ends
    std::vector<Slice*> slices;
    std::vector<bool> fail_after;
    bool time_out = false;
  };
  void Post(const SegmentDescriptor& peer, const std::vector<Slice*>& slices, bool drive);
  void Forward(const SegmentDescriptor& peer, const std::vector<Slice*>& slices, const std::vector<bool>& fail_after,
               bool drive);
  void Release(Held held);
  void TimerLoop();

  const std::string name_;
  const std::unique_ptr<Transport> inner_;
  const std::shared_ptr<FaultController> controller_;

  std::mutex mu_;  // guards held_, stopping_
  std::condition_variable cv_;
  std::multimap<std::chrono::steady_clock::time_point, Held> held_;
  bool stopping_ = false;
  std::thread timer_;
};

/// Registers the plugin `name` with TransportRegistry::Get(): a FaultTransport around a fresh instance of the
/// registered transport `inner` (its probe decides usability), serving protocol `name`. Returns the controller
/// all its instances obey; registering the same (name, inner) again returns the same controller. kNotFound when
/// `inner` is not registered, kAddressOverlapped when `name` is taken otherwise. Thread-safe.
///
/// The registry cannot forget a plugin, so the name stays installable for the process's life: an engine created
/// with an empty EngineOptions::transports installs it too (tests name their transports explicitly).
StatusOr<std::shared_ptr<FaultController>> RegisterFaultTransport(const std::string& name, const std::string& inner);

/// (name, inner) of every fault transport this process registered, in registration order.
std::vector<std::pair<std::string, std::string>> RegisteredFaultTransports();

}  // namespace mooncake::te::testing

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TESTING_FAULT_TRANSPORT_H_
