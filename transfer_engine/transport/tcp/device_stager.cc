#include "transfer_engine/transport/tcp/device_stager.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>

#include "transfer_engine/common/log.h"
#include "transfer_engine/platform/stream_pool.h"

namespace mooncake::te::tcp {
namespace {

constexpr size_t kMinChunk = 4096;
thread_local bool t_on_stager_thread = false;

Status ShuttingDown() { return Status(ErrorCode::kSocket, "tcp staging: the transport is shutting down"); }

}  // namespace

struct DeviceStager::State : std::enable_shared_from_this<State> {
  // One platform's pinned memory: one allocation per role, cut into chunks; and its copy streams.
  struct Pool {
    std::shared_ptr<Platform> platform;
    std::shared_ptr<StreamPool> streams;
    std::array<char*, 2> base{};
    std::array<std::vector<bool>, 2> used;
    size_t used_chunks = 0;   // both roles
    size_t copies = 0;        // started on its streams and not yet waited for
    int holders = 0;          // Prepares not yet matched by an Unprepare
    struct Waiter {
      size_t chunks;
      std::function<void(StatusOr<StagingRef>)> granted;
    };
    std::array<std::deque<Waiter>, 2> waiters;
    std::array<std::vector<std::function<void()>>, 2> wakes;
  };
  struct Job {
    std::unique_ptr<CopyCompletion> completion;  // null: a grant, a wake-up or a pool to free, run at once
    size_t length = 0;
    std::function<void(const Status&)> done;
    std::shared_ptr<Pool> pool;  // a copy on this pool's streams (counted in its `copies`)
  };

  State(size_t chunk_bytes, size_t per_role) : chunk(chunk_bytes), chunks_per_role(per_role) {}
  ~State() {
    for (auto& pool : pools) {
      if (pool) FreePool(*pool);
    }
  }

  void FreePool(Pool& pool) {
    for (char*& base : pool.base) {
      if (base == nullptr) continue;
      Status st = pool.platform->Free(base, chunk * chunks_per_role, AllocationKind::kPinnedHost);
      if (!st.ok()) MC_LOG(kWarning) << "tcp staging: freeing the pinned pool failed: " << st.message();
      base = nullptr;
    }
    pool.streams.reset();  // its streams go once the last copy's completion is gone
  }

  // Lets the pool of `type` go when nobody holds it and nothing of it is in use: it leaves `pools` at once (a
  // later Prepare allocates anew) and is freed by a stager thread (never on the caller's, which may be an I/O
  // thread). While stopping it stays for the destructor. mu held.
  void MaybeRetireLocked(size_t type) {
    std::shared_ptr<Pool>& slot = pools[type];
    if (!slot || slot->holders > 0 || slot->used_chunks > 0 || slot->copies > 0 || stopping) return;
    for (int r = 0; r < 2; ++r) {
      if (!slot->waiters[r].empty() || !slot->wakes[r].empty()) return;
    }
    std::shared_ptr<Pool> gone = std::move(slot);
    jobs.push_back(Job{nullptr, 0, [self = this, gone](const Status&) {
                         self->FreePool(*gone);
                         std::lock_guard lock(self->mu);
                         self->pinned -= 2 * self->chunk * self->chunks_per_role;
                         ++self->pools_freed;
                       }});
  }

  size_t TypeOf(const Pool* pool) const {
    for (size_t t = 0; t < pools.size(); ++t) {
      if (pools[t].get() == pool) return t;
    }
    return pools.size();
  }

  // First fit of `count` adjacent free chunks; marks them used. mu held.
  bool TakeRunLocked(Pool& pool, int role, size_t count, size_t* first) {
    auto& used = pool.used[role];
    size_t run = 0;
    for (size_t i = 0; i < used.size(); ++i) {
      run = used[i] ? 0 : run + 1;
      if (run == count) {
        *first = i + 1 - count;
        std::fill(used.begin() + static_cast<long>(*first), used.begin() + static_cast<long>(i + 1), true);
        pool.used_chunks += count;
        in_use += count * chunk;
        peak_in_use = std::max(peak_in_use, in_use);
        return true;
      }
    }
    return false;
  }

  // A reference to chunks [first, first+count) of `role`; they go back to the pool when it is dropped. mu held.
  StagingRef MakeRefLocked(Pool* pool, int role, size_t first, size_t count) {
    auto* b = new StagingBuffer{pool->base[role] + first * chunk, count * chunk};
    std::shared_ptr<State> self = shared_from_this();
    return StagingRef(b, [self, pool, role, first, count](StagingBuffer* buf) {
      delete buf;
      self->Release(pool, role, first, count);
    });
  }

  void Release(Pool* pool, int role, size_t first, size_t count) {
    {
      std::lock_guard lock(mu);
      auto& used = pool->used[role];
      std::fill(used.begin() + static_cast<long>(first), used.begin() + static_cast<long>(first + count), false);
      pool->used_chunks -= count;
      in_use -= count * chunk;
      ServeLocked(pool, role);
      if (pool->holders == 0) {
        const size_t type = TypeOf(pool);
        if (type < pools.size()) MaybeRetireLocked(type);
      }
    }
    cv.notify_all();
  }

  // Hands free chunks to the waiters in order, then wakes whoever asked to be told of a free chunk. mu held.
  void ServeLocked(Pool* pool, int role) {
    auto& waiters = pool->waiters[role];
    while (!waiters.empty()) {
      size_t first = 0;
      if (!TakeRunLocked(*pool, role, waiters.front().chunks, &first)) break;
      StagingRef ref = MakeRefLocked(pool, role, first, waiters.front().chunks);
      auto granted = std::move(waiters.front().granted);
      waiters.pop_front();
      jobs.push_back(Job{nullptr, 0, [granted = std::move(granted), ref = std::move(ref)](const Status&) mutable {
                           granted(std::move(ref));
                         }});
    }
    if (!waiters.empty() || pool->wakes[role].empty()) return;
    for (auto& wake : pool->wakes[role]) jobs.push_back(Job{nullptr, 0, [wake = std::move(wake)](const Status&) { wake(); }});
    pool->wakes[role].clear();
  }

  void EnsureThreadsLocked() {
    if (!threads.empty() || stopping) return;
    for (int i = 0; i < kWaiters; ++i) threads.emplace_back([this] { Run(); });
  }

  void Run() {
    t_on_stager_thread = true;
    pthread_setname_np(pthread_self(), "mc-tcp-stager");
    std::unique_lock lock(mu);
    while (true) {
      cv.wait(lock, [this] { return (stopping && starting == 0) || !jobs.empty(); });
      if (jobs.empty()) return;  // stopping, no copy starting, and every copy started has been waited for
      Job job = std::move(jobs.front());
      jobs.pop_front();
      lock.unlock();
      Status st;
      if (job.completion) {
        st = job.completion->Wait();  // blocks (no polling) until the copy finished
        copies.fetch_add(1, std::memory_order_relaxed);
        if (st.ok()) {
          copied_bytes.fetch_add(job.length, std::memory_order_relaxed);
        } else {
          copy_errors.fetch_add(1, std::memory_order_relaxed);
          st = Status(st.code(), "tcp staging: device copy of " + std::to_string(job.length) +
                                     " bytes failed: " + st.message());
        }
      }
      job.done(st);
      std::shared_ptr<Pool> pool = std::move(job.pool);
      job = Job{};  // drops the continuation (and what it captured, e.g. staging buffers) outside the lock
      lock.lock();
      if (pool) CopyEndedLocked(pool.get());
    }
  }

  // A copy counted in `pool`'s copies has been waited for, or did not start; the pool may go now. mu held.
  void CopyEndedLocked(Pool* pool) {
    --pool->copies;
    const size_t type = TypeOf(pool);
    if (type < pools.size() && pool->holders == 0) MaybeRetireLocked(type);
  }

  const size_t chunk;
  const size_t chunks_per_role;
  std::mutex prepare_mu;  // serializes Prepare (allocation happens outside mu)
  std::mutex mu;          // guards everything below
  std::condition_variable cv;
  std::deque<Job> jobs;
  bool stopping = false;
  size_t starting = 0;  // Copy calls between their two locked sections (the platform call runs unlocked)
  std::vector<std::thread> threads;
  std::array<std::shared_ptr<Pool>, 8> pools{};  // by MemoryType; removed when retired (MaybeRetireLocked)
  size_t pinned = 0, in_use = 0, peak_in_use = 0;
  uint64_t acquire_waits = 0, target_pauses = 0, pools_freed = 0;
  std::atomic<uint64_t> copies{0}, copied_bytes{0}, copy_errors{0};
};

DeviceStager::DeviceStager(PlatformRegistry* platforms, size_t pool_bytes, size_t chunk_bytes, int streams_per_device)
    : platforms_(platforms),
      chunk_(std::clamp(chunk_bytes, kMinChunk, std::max(kMinChunk, pool_bytes / 2))),
      chunks_per_role_(std::max<size_t>(1, pool_bytes / 2 / chunk_)),
      streams_per_device_(std::max(1, streams_per_device)),
      s_(std::make_shared<State>(chunk_, chunks_per_role_)) {}

DeviceStager::~DeviceStager() { Stop(); }

size_t DeviceStager::SliceFitting(size_t slice) const {
  const size_t role = role_bytes();
  if (slice + slice / 4 <= role) return slice;
  return std::max(kMinChunk, role * 4 / 5 / kMinChunk * kMinChunk);  // s + s/4 <= role
}

std::shared_ptr<Platform> DeviceStager::PlatformFor(MemoryType type) {
  if (static_cast<size_t>(type) >= s_->pools.size() || platforms_ == nullptr) return nullptr;
  return platforms_->ForType(type);
}

bool DeviceStager::CanStage(const MemoryKind& kind) { return kind.is_device() && PlatformFor(kind.type) != nullptr; }

Status DeviceStager::Prepare(const MemoryKind& kind) {
  std::shared_ptr<Platform> platform = kind.is_device() ? PlatformFor(kind.type) : nullptr;
  if (!platform) {
    return Status(ErrorCode::kDeviceNotFound,
                  "tcp staging: no usable platform for " + kind.ToString() + " memory is registered");
  }
  const size_t type = static_cast<size_t>(kind.type);
  const int device = kind.device >= 0 ? kind.device : 0;
  std::lock_guard prepare(s_->prepare_mu);
  std::shared_ptr<StreamPool> streams;
  {
    std::lock_guard lock(s_->mu);
    if (s_->stopping) return ShuttingDown();
    if (s_->pools[type]) {
      ++s_->pools[type]->holders;
      streams = s_->pools[type]->streams;
    }
  }
  if (streams) {
    (void)streams->Prepare(device);  // this region's device (a failure is logged; copies then use the own stream)
    return Status::Ok();
  }
  auto pool = std::make_shared<State::Pool>();
  pool->platform = platform;
  pool->streams = std::make_shared<StreamPool>(platform, streams_per_device_);
  (void)pool->streams->Prepare(device);
  const size_t bytes = role_bytes();
  for (int role = 0; role < 2; ++role) {
    auto allocated = platform->Allocate(bytes, AllocationKind::kPinnedHost, kind.device >= 0 ? kind.device : 0);
    if (!allocated.ok()) {
      if (role == 1) {
        Status st = platform->Free(pool->base[0], bytes, AllocationKind::kPinnedHost);
        if (!st.ok()) MC_LOG(kWarning) << "tcp staging: freeing the pinned pool failed: " << st.message();
      }
      return Status(allocated.status().code(), "tcp staging: a pinned pool of " + std::to_string(2 * bytes) +
                                                   " bytes (MC_TCP_STAGING_POOL_BYTES) from " + platform->name() +
                                                   ": " + allocated.status().message());
    }
    pool->base[role] = static_cast<char*>(*allocated);
    pool->used[role].assign(chunks_per_role_, false);
  }
  pool->holders = 1;
  {
    std::lock_guard lock(s_->mu);
    if (!s_->stopping) {
      s_->pools[type] = std::move(pool);
      s_->pinned += 2 * bytes;
      s_->EnsureThreadsLocked();
      return Status::Ok();
    }
  }
  s_->FreePool(*pool);  // Stop ran meanwhile: nobody would use it (freed without the lock: a platform call)
  return ShuttingDown();
}

void DeviceStager::Unprepare(const MemoryKind& kind) {
  const size_t type = static_cast<size_t>(kind.type);
  {
    std::lock_guard lock(s_->mu);
    State::Pool* pool = kind.is_device() && type < s_->pools.size() ? s_->pools[type].get() : nullptr;
    if (pool == nullptr || pool->holders == 0) {
      MC_LOG(kWarning) << "tcp staging: Unprepare of " << kind.ToString() << " without a Prepare (ignored)";
      return;
    }
    if (--pool->holders > 0) return;
    s_->MaybeRetireLocked(type);
  }
  s_->cv.notify_one();
}

void DeviceStager::Acquire(const MemoryKind& kind, StagingRole role, size_t length,
                           std::function<void(StatusOr<StagingRef>)> granted) {
  if (length == 0) {
    granted(InvalidArgument("tcp staging: a staging buffer of 0 bytes"));
    return;
  }
  if (length > role_bytes()) {
    granted(InvalidArgument("tcp staging: " + std::to_string(length) + " bytes do not fit the " +
                            std::to_string(role_bytes()) + " bytes of pinned staging one side may hold (half of " +
                            "MC_TCP_STAGING_POOL_BYTES)"));
    return;
  }
  const size_t chunks = (length + chunk_ - 1) / chunk_;
  const int r = static_cast<int>(role);
  std::unique_lock lock(s_->mu);
  State::Pool* pool = kind.is_device() && static_cast<size_t>(kind.type) < s_->pools.size()
                          ? s_->pools[static_cast<size_t>(kind.type)].get()
                          : nullptr;
  if (s_->stopping || pool == nullptr) {
    lock.unlock();
    granted(s_->stopping ? ShuttingDown()
                         : Status(ErrorCode::kDeviceNotFound,
                                  "tcp staging: no staging pool for " + kind.ToString() + " (no region registered)"));
    return;
  }
  size_t first = 0;
  if (pool->waiters[r].empty() && s_->TakeRunLocked(*pool, r, chunks, &first)) {
    StagingRef ref = s_->MakeRefLocked(pool, r, first, chunks);
    lock.unlock();
    granted(std::move(ref));
    return;
  }
  ++s_->acquire_waits;
  pool->waiters[r].push_back({chunks, std::move(granted)});
}

StatusOr<StagingRef> DeviceStager::TryAcquireOrNotify(const MemoryKind& kind, StagingRole role,
                                                      std::function<void()> wake) {
  const int r = static_cast<int>(role);
  std::lock_guard lock(s_->mu);
  if (s_->stopping) return ShuttingDown();
  State::Pool* pool = kind.is_device() && static_cast<size_t>(kind.type) < s_->pools.size()
                          ? s_->pools[static_cast<size_t>(kind.type)].get()
                          : nullptr;
  if (pool == nullptr) {
    return Status(ErrorCode::kDeviceNotFound,
                  "tcp staging: no staging pool for " + kind.ToString() + " (no region registered)");
  }
  size_t first = 0;
  if (pool->waiters[r].empty() && s_->TakeRunLocked(*pool, r, 1, &first)) return s_->MakeRefLocked(pool, r, first, 1);
  ++s_->target_pauses;
  pool->wakes[r].push_back(std::move(wake));
  return StagingRef();
}

void DeviceStager::Copy(const MemoryKind& kind, void* dst, const void* src, size_t length,
                        std::function<void(const Status&)> done) {
  std::shared_ptr<Platform> platform = kind.is_device() ? PlatformFor(kind.type) : nullptr;
  if (!platform) {
    done(Status(ErrorCode::kDeviceNotFound, "tcp staging: no usable platform for " + kind.ToString() + " memory"));
    return;
  }
  const size_t type = static_cast<size_t>(kind.type);
  std::shared_ptr<State::Pool> pool;
  {
    std::unique_lock lock(s_->mu);
    if (s_->stopping) {
      lock.unlock();
      done(ShuttingDown());
      return;
    }
    // Counted as starting (and against its pool, which then stays) before the lock is let go: the stager threads
    // keep running while a copy is starting, so each copy is either refused above or waited for before Stop
    // returns. The platform is called without the lock, so a slow start holds up no other user of the stager.
    ++s_->starting;
    pool = s_->pools[type];
    if (pool) ++pool->copies;
    s_->EnsureThreadsLocked();
  }
  // On the pool's streams when there is a pool (its streams exist: Prepare made them).
  auto started = pool ? pool->streams->CopyAsync(dst, src, length, kind.device)
                      : platform->CopyAsync(dst, src, length, kind.device);
  {
    std::lock_guard lock(s_->mu);
    --s_->starting;
    if (started.ok()) {
      s_->jobs.push_back(State::Job{std::move(started.value()), length, std::move(done), std::move(pool)});
    } else if (pool) {
      s_->CopyEndedLocked(pool.get());
    }
  }
  s_->cv.notify_all();  // the job's waiter, or threads of a Stop waiting for the last start
  if (!started.ok()) {
    s_->copy_errors.fetch_add(1, std::memory_order_relaxed);
    done(Status(started.status().code(), "tcp staging: " + platform->name() + " copy of " + std::to_string(length) +
                                             " bytes did not start: " + started.status().message()));
  }
}

bool DeviceStager::OnStagerThread() { return t_on_stager_thread; }

void DeviceStager::Stop() {
  std::vector<std::function<void(StatusOr<StagingRef>)>> refused;
  std::vector<std::function<void()>> wakes;
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(s_->mu);
    if (s_->stopping) return;
    s_->stopping = true;
    for (auto& pool : s_->pools) {
      if (!pool) continue;
      for (int r = 0; r < 2; ++r) {
        for (auto& w : pool->waiters[r]) refused.push_back(std::move(w.granted));
        pool->waiters[r].clear();
        for (auto& w : pool->wakes[r]) wakes.push_back(std::move(w));
        pool->wakes[r].clear();
      }
    }
    threads.swap(s_->threads);
  }
  s_->cv.notify_all();
  for (auto& t : threads) t.join();  // every copy started is waited for and its continuation has run
  for (auto& granted : refused) granted(ShuttingDown());
  for (auto& wake : wakes) wake();
}

nlohmann::json DeviceStager::Stats() const {
  std::lock_guard lock(s_->mu);
  size_t streams = 0;
  for (const auto& pool : s_->pools) {
    if (pool && pool->streams) streams += pool->streams->streams();
  }
  return {{"copies", s_->copies.load()},
          {"copied_bytes", s_->copied_bytes.load()},
          {"copy_errors", s_->copy_errors.load()},
          {"pool_bytes", 2 * chunks_per_role_ * chunk_},
          {"chunk_bytes", chunk_},
          {"pinned_bytes", s_->pinned},
          {"in_use_bytes", s_->in_use},
          {"peak_in_use_bytes", s_->peak_in_use},
          {"acquire_waits", s_->acquire_waits},
          {"target_pauses", s_->target_pauses},
          {"pools_freed", s_->pools_freed},
          {"streams", streams},
          {"streams_per_device", streams_per_device_}};
}

}  // namespace mooncake::te::tcp
