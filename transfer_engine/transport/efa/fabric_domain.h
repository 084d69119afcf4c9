#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_FABRIC_DOMAIN_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_FABRIC_DOMAIN_H_

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/efa/fabric_api.h"

namespace mooncake::te::efa {

/// One RMA operation. The transport fills it; the domain owns it from Post until `done` has run.
struct FabricOp {
  enum class Kind : uint8_t { kWrite, kRead };
  Kind kind = Kind::kWrite;
  void* local = nullptr;
  size_t length = 0;
  void* local_desc = nullptr;  ///< fi_mr_desc of the local registration (needed with FI_MR_LOCAL)
  fi_addr_t dest = FI_ADDR_UNSPEC;
  uint64_t remote_addr = 0;    ///< as the target's mr_mode wants it (virtual address or offset in the MR)
  uint64_t remote_key = 0;
  /// Runs exactly once, on the domain's progress thread (or the thread calling Poll or Stop): Ok, or why it
  /// failed.
  std::function<void(const Status&)> done;
  /// When set, the operation must be with the provider by then (the epoch lease it was checked under ends):
  /// one still queued afterwards is not posted and fails with NotPostedInTime(). Unset: no limit.
  std::chrono::steady_clock::time_point post_by{};

  /// The operation's context as libfabric sees it: its scratch space (FI_CONTEXT / FI_CONTEXT2 mode) first,
  /// so a completion's op_context leads back to the operation.
  struct Slot {
    struct fi_context2 context;
    FabricOp* op;
  } slot{};
  std::chrono::steady_clock::time_point deadline;
  bool late = false;  ///< post_by passed while it was queued (the domain's own mark)
};

/// The status of an operation whose post_by passed before it could be posted: nothing of it was sent. The
/// domain gives no other operation kStaleMetadata.
Status NotPostedInTime();
inline bool IsNotPostedInTime(const Status& st) { return st.code() == ErrorCode::kStaleMetadata; }

class FabricDomain;

/// A registration with the domain. Closed on destruction; keeps its domain open until then.
class FabricMr {
 public:
  FabricMr(std::shared_ptr<FabricDomain> domain, struct fid_mr* mr, uint64_t key)
      : domain_(std::move(domain)), mr_(mr), key_(key) {}
  ~FabricMr();
  FabricMr(const FabricMr&) = delete;
  FabricMr& operator=(const FabricMr&) = delete;
  uint64_t key() const { return key_; }
  void* desc() const;

 private:
  std::shared_ptr<FabricDomain> domain_;
  struct fid_mr* mr_;
  uint64_t key_;
};

/// What a domain was opened on (for descriptors, logs and stats).
struct DomainInfo {
  std::string provider;  ///< fi_info->fabric_attr->prov_name, e.g. "tcp;ofi_rxm"
  std::string domain;    ///< e.g. "lo", "eth0", "rdmap0s31-rdm"
  std::string address;   ///< fi_getname of the endpoint, hex
  uint64_t mr_mode = 0;
  bool virt_addr = false;  ///< remote addresses are virtual addresses (else offsets into the registration)
  bool prov_key = false;   ///< the provider assigns keys (else a unique key is requested per registration)
  bool delivery_complete = false;  ///< a write completes once the data is at the target
  size_t max_msg_size = 0;
  size_t tx_size = 0;
  std::string source_ip;  ///< the endpoint's IPv4 source address, where the provider's addresses are IPv4
  bool hmem = false;      ///< the provider accepts FI_HMEM (device memory) for this domain
  bool loopback = false;  ///< a loopback interface (reaches this host only)
  bool cq_wait = false;  ///< the progress thread sleeps in fi_cq_sread (else it polls with short naps)
  /// Polling mode: a counter of the RMA peers did on this endpoint (FI_RMA_EVENT) tells the progress thread a
  /// peer is active, so it polls without its idle nap for a while (the shm provider needs the target's progress).
  bool remote_events = false;
};

/// Where device memory lives as libfabric names it (fi_mr_attr.iface and its device field).
struct HmemTarget {
  enum fi_hmem_iface iface = FI_HMEM_SYSTEM;
  uint64_t device = 0;  ///< the CUDA / ROCr / ZE ordinal (ZE: libfabric's fi_hmem_ze_device encoding)
};

/// One libfabric domain: fabric, domain, an FI_EP_RDM endpoint, its address vector (FI_AV_TABLE) and one
/// completion queue, plus the thread that drives progress and reaps completions. Thread-safe: any thread may
/// register memory, insert addresses and post; completions run on the progress thread.
///
/// Bounded outstanding: at most `max_outstanding` operations are with the provider; the rest wait in a queue
/// the progress thread drains as completions come in (also when the provider answers -FI_EAGAIN; queued
/// operations have deadlines too). The progress thread sleeps in fi_cq_sread for at most 100 ms (no core
/// spins while nothing moves, and posting needs no wake-up) where the provider's wait object also wakes for
/// a peer's traffic (tcp, verbs); other providers (shm, efa, ...) are polled with naps that grow from 10 us
/// while busy or while peers do RMA here, and last idle_poll_us while idle (a post ends such a nap). A
/// caller may reap completions itself (BeginDrive, Poll, EndDrive). An operation not completed by its
/// deadline fails and its destination is reported through `on_timeout` (the transport marks that peer down).
class FabricDomain : public std::enable_shared_from_this<FabricDomain> {
 public:
  struct Options {
    std::string provider;       ///< required
    std::string domain_filter;  ///< comma-separated domain names; empty: any
    std::string prefer_ip;      ///< prefer the domain whose source address is this IPv4 address
    int max_outstanding = 256;
    std::chrono::milliseconds op_timeout{10000};
    /// Sleep in fi_cq_sread: 1 yes, 0 no (poll), -1 where the provider's wait is known to cover peers' traffic.
    int cq_wait = -1;
    int idle_poll_us = 1000;  ///< polling: the longest nap while nothing is in flight
    bool hmem = true;         ///< open domains with FI_HMEM where the provider offers it (device memory)
    int max_domains = 0;      ///< OpenAll opens at most this many (0: no limit)
    /// Ask for FI_DELIVERY_COMPLETE writes where the provider offers them (else DomainInfo::delivery_complete
    /// is false and the transport confirms writes itself).
    bool delivery_complete = true;
  };
  /// Opens the first domain of `provider` that OpenAll would open; kNotImplemented with libfabric's answer
  /// when the provider has none, kDeviceNotFound when the filter matches none.
  static StatusOr<std::shared_ptr<FabricDomain>> Open(const FabricApi* api, const Options& options);
  /// Opens every domain (NIC) of `provider` to use, one per domain name (IPv4 where a name has several
  /// entries), in libfabric's order: those `domain_filter` names; without a filter, the one whose source
  /// address is `prefer_ip` first, then every other non-loopback domain (only that one when `prefer_ip` is a
  /// loopback address; the first domain when all are loopback). Errors as Open; a domain that fails to open
  /// fails the call.
  static StatusOr<std::vector<std::shared_ptr<FabricDomain>>> OpenAll(const FabricApi* api, const Options& options);
  ~FabricDomain();

  const DomainInfo& info() const { return info_; }

  /// What peers may do with a registration (local reads and writes are always allowed).
  enum class RemoteAccess : uint8_t { kNone, kRead, kReadWrite };
  /// Registers [addr, addr+len); a unique requested key when the provider does not assign them. Host memory
  /// goes through fi_mr_reg; device memory (`hmem.iface` not FI_HMEM_SYSTEM) through fi_mr_regattr with that
  /// interface, only where the domain was opened with FI_HMEM (info().hmem; else kNotImplemented).
  /// kContext after Stop; kMemory with libfabric's answer when the provider refuses.
  StatusOr<std::unique_ptr<FabricMr>> Register(void* addr, size_t len, RemoteAccess remote,
                                               const HmemTarget& hmem = HmemTarget{});

  /// Inserts a peer's endpoint address (hex of its fi_getname) into the address vector.
  StatusOr<fi_addr_t> Insert(const std::string& hex_address);
  /// Removes it again: queued operations to it fail (their `done` runs on the progress thread, never inside
  /// this call, so callers may hold their own locks), later ones too (until Insert hands the index out again);
  /// posted ones fail or are dropped by the provider. Idempotent.
  void Remove(fi_addr_t addr);

  /// Takes `op` and posts it (now, or once an operation slot frees). After Stop, `done` runs at once with an
  /// error.
  void Post(std::unique_ptr<FabricOp> op);

  /// Reaps completions on the calling thread, running their `done` here (the synchronous path waits with it
  /// instead of for the progress thread); also posts queued operations as slots free. Waits up to `wait_ms`
  /// for one in fi_cq_sread where the domain sleeps that way (info().cq_wait), else returns at once.
  /// Returns how many operations it finished. Any thread; the progress thread may reap concurrently.
  size_t Poll(int wait_ms = 0);
  /// Between BeginDrive and EndDrive a caller reaps this domain's completions itself (Poll): the progress
  /// thread stays out of the completion queue (it would take completions the caller sleeps for, and wake for
  /// each). For kDriveLinger after the last driver left, with nothing outstanding, it keeps out of
  /// fi_cq_sread (so the next synchronous call needs no fi_cq_signal) but still polls the queue every
  /// kLingerPoll, so peers' RMA on this endpoint keeps its progress; an operation posted outside a drive
  /// ends the linger at once. Calls nest and may come from several threads.
  void BeginDrive();
  void EndDrive();
  static constexpr std::chrono::microseconds kDriveLinger{1000};
  static constexpr std::chrono::microseconds kLingerPoll{50};
  /// How often BeginDrive was called (tests: which domains a synchronous call drove).
  uint64_t drives() const { return drives_.load(std::memory_order_relaxed); }

  /// Called on the progress thread with the destination of an operation that timed out. Set before the
  /// first Post.
  void set_on_timeout(std::function<void(fi_addr_t)> fn) { on_timeout_ = std::move(fn); }

  /// Fails queued operations, waits up to `drain` for posted ones, then closes the endpoint and fails the rest.
  /// Idempotent.
  void Stop(std::chrono::milliseconds drain = std::chrono::milliseconds(2000));

  size_t in_flight() const { return posted_.load(std::memory_order_relaxed); }

 private:
  FabricDomain(const FabricApi* api, const Options& options) : api_(api), options_(options) {}
  Status Init(struct fi_info* info);
  void Progress();
  /// Progress thread: whether to stay out of the completion queue now, waiting a while if so: kDriven (a
  /// driver reaps), kLinger (just after a drive: the caller then polls without sleeping in the queue).
  enum class Park : uint8_t { kOut, kDriven, kLinger };
  Park Parked();
  /// Polling: sleeps `how_long`, or less when an operation is posted during an `idle` nap.
  void Nap(std::chrono::microseconds how_long, bool idle);
  /// Handles what fi_cq_read returned (`n` entries, or an error such as -FI_EAVAIL); the count finished.
  size_t Reap(ssize_t n, struct fi_cq_entry* entries);
  /// Polling mode: whether peers did RMA on this endpoint since the last call (the remote-event counter).
  bool RemoteActivity();
  /// Posts queued operations while slots are free; post_mu_ held.
  std::vector<std::unique_ptr<FabricOp>> PostQueuedLocked();
  void FinishAll(std::vector<std::unique_ptr<FabricOp>> ops, const Status& st);
  void Finish(std::unique_ptr<FabricOp> op, const Status& st);
  void CheckDeadlines();
  void Wake();

  const FabricApi* api_;
  Options options_;
  DomainInfo info_;
  struct fi_info* fi_ = nullptr;
  struct fid_fabric* fabric_ = nullptr;
  struct fid_domain* domain_ = nullptr;
  struct fid_av* av_ = nullptr;
  struct fid_cq* cq_ = nullptr;
  struct fid_ep* ep_ = nullptr;
  struct fid_cntr* remote_cntr_ = nullptr;  // RMA done by peers here (polling mode, FI_RMA_EVENT), or null
  uint64_t remote_seen_ = 0;                // progress thread only
  std::atomic<uint64_t> next_key_{1};
  std::atomic<int> drivers_{0};         // callers between BeginDrive and EndDrive
  std::atomic<uint64_t> drives_{0};     // BeginDrive calls
  std::atomic<bool> in_wait_{false};    // the progress thread is (about to be) in fi_cq_sread
  std::mutex park_mu_;                  // guards the four below
  std::condition_variable park_cv_;     // the parked progress thread waits here
  std::chrono::steady_clock::time_point drive_ended_{};  // when the last driver left
  bool unpark_ = false;                 // a driver left operations outstanding: resume at once
  bool kick_ = false;                   // polling: an operation was posted since the last nap
  bool idle_nap_ = false;               // polling: the progress thread naps with nothing in flight

  std::mutex post_mu_;  // guards queue_, live_, removed_, stopping_; held while posting and changing the AV
  std::deque<std::unique_ptr<FabricOp>> queue_;
  std::unordered_map<FabricOp*, std::unique_ptr<FabricOp>> live_;  // with the provider
  std::unordered_set<fi_addr_t> removed_;  // addresses removed and not handed out again
  std::vector<std::unique_ptr<FabricOp>> dropped_;  // queued to a removed address: failed by the progress thread
  // Timed out (their `done` has run) but still with the provider: freed when it reports them, or at Stop.
  std::unordered_map<FabricOp*, std::unique_ptr<FabricOp>> abandoned_;
  std::chrono::steady_clock::time_point next_deadline_check_{};
  std::mutex log_mu_;                                       // guards the two below
  std::chrono::steady_clock::time_point last_error_log_{};
  uint64_t suppressed_errors_ = 0;
  bool stopping_ = false;
  std::atomic<size_t> posted_{0};
  std::atomic<bool> stop_thread_{false};
  std::thread progress_;
  std::function<void(fi_addr_t)> on_timeout_;
};

}  // namespace mooncake::te::efa

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_FABRIC_DOMAIN_H_
