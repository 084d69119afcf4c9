#include "transfer_engine/transport/tcp/device_stager.h"

#include <map>
#include <utility>
#include <vector>

#include "transfer_engine/common/log.h"

namespace mooncake::te::tcp {
namespace {

constexpr size_t kMinClass = 64 << 10;

// The size class of a request: a power of two, at least kMinClass (so buffers of nearby sizes are shared).
size_t SizeClass(size_t length) {
  size_t c = kMinClass;
  while (c < length && c <= (SIZE_MAX >> 1)) c <<= 1;
  return c < length ? length : c;
}

}  // namespace

struct DeviceStager::Cache {
  struct Entry {
    std::shared_ptr<Platform> platform;
    void* ptr;
  };
  explicit Cache(size_t limit_bytes) : limit(limit_bytes) {}
  ~Cache() {
    for (auto& [key, entries] : free) {
      for (auto& e : entries) {
        Status st = e.platform->Free(e.ptr, key.second, AllocationKind::kPinnedHost);
        if (!st.ok()) MC_LOG(kWarning) << "tcp staging: freeing a pinned buffer failed: " << st.message();
      }
    }
  }

  // Keeps the buffer for reuse while the cache has room; frees it otherwise.
  void Release(const std::shared_ptr<Platform>& platform, void* ptr, size_t capacity) {
    {
      std::lock_guard lock(mu);
      if (cached + capacity <= limit) {
        free[{platform.get(), capacity}].push_back({platform, ptr});
        cached += capacity;
        return;
      }
      pinned -= capacity;
    }
    Status st = platform->Free(ptr, capacity, AllocationKind::kPinnedHost);
    if (!st.ok()) MC_LOG(kWarning) << "tcp staging: freeing a pinned buffer failed: " << st.message();
  }

  const size_t limit;
  std::mutex mu;
  std::map<std::pair<const Platform*, size_t>, std::vector<Entry>> free;
  size_t cached = 0;  // bytes in `free`
  size_t pinned = 0;  // bytes allocated and not freed (cached or in use)
};

DeviceStager::DeviceStager(PlatformRegistry* platforms, size_t cache_bytes)
    : platforms_(platforms), cache_(std::make_shared<Cache>(cache_bytes)) {}

DeviceStager::~DeviceStager() { Stop(); }

std::shared_ptr<Platform> DeviceStager::PlatformFor(MemoryType type) {
  size_t i = static_cast<size_t>(type);
  if (i >= by_type_.size() || platforms_ == nullptr) return nullptr;
  std::lock_guard lock(mu_);
  if (!by_type_[i]) by_type_[i] = platforms_->ForType(type);
  return by_type_[i];
}

bool DeviceStager::CanStage(const MemoryKind& kind) { return kind.is_device() && PlatformFor(kind.type) != nullptr; }

StatusOr<StagingRef> DeviceStager::Acquire(const MemoryKind& kind, size_t length) {
  if (length == 0) return InvalidArgument("tcp staging: a staging buffer of 0 bytes");
  std::shared_ptr<Platform> platform = kind.is_device() ? PlatformFor(kind.type) : nullptr;
  if (!platform) {
    return Status(ErrorCode::kDeviceNotFound,
                  "tcp staging: no usable platform for " + kind.ToString() + " memory is registered");
  }
  const size_t capacity = SizeClass(length);
  void* ptr = nullptr;
  {
    std::lock_guard lock(cache_->mu);
    auto it = cache_->free.find({platform.get(), capacity});
    if (it != cache_->free.end() && !it->second.empty()) {
      ptr = it->second.back().ptr;
      it->second.pop_back();
      cache_->cached -= capacity;
    }
  }
  if (ptr == nullptr) {
    auto allocated = platform->Allocate(capacity, AllocationKind::kPinnedHost, kind.device >= 0 ? kind.device : 0);
    if (!allocated.ok()) {
      return Status(allocated.status().code(), "tcp staging: pinned host buffer of " + std::to_string(capacity) +
                                                   " bytes from " + platform->name() + ": " +
                                                   allocated.status().message());
    }
    ptr = *allocated;
    std::lock_guard lock(cache_->mu);
    cache_->pinned += capacity;
  }
  auto* b = new StagingBuffer{static_cast<char*>(ptr), capacity};
  std::shared_ptr<Cache> cache = cache_;
  return StagingRef(b, [cache, platform, capacity](StagingBuffer* buf) {
    cache->Release(platform, buf->data, capacity);
    delete buf;
  });
}

void DeviceStager::Copy(const MemoryKind& kind, void* dst, const void* src, size_t length,
                        std::function<void(const Status&)> done) {
  std::shared_ptr<Platform> platform = kind.is_device() ? PlatformFor(kind.type) : nullptr;
  if (!platform) {
    done(Status(ErrorCode::kDeviceNotFound, "tcp staging: no usable platform for " + kind.ToString() + " memory"));
    return;
  }
  std::unique_lock lock(mu_);
  if (stopping_) {
    lock.unlock();
    done(Status(ErrorCode::kSocket, "tcp staging: the transport is shutting down"));
    return;
  }
  // Started under the lock, so the thread waits for copies in the order they were started.
  auto started = platform->CopyAsync(dst, src, length, kind.device);
  if (!started.ok()) {
    lock.unlock();
    copy_errors_.fetch_add(1, std::memory_order_relaxed);
    done(Status(started.status().code(), "tcp staging: " + platform->name() + " copy of " + std::to_string(length) +
                                             " bytes did not start: " + started.status().message()));
    return;
  }
  jobs_.push_back(Job{std::move(started.value()), length, std::move(done)});
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  lock.unlock();
  cv_.notify_one();
}

namespace {
thread_local bool t_on_stager_thread = false;
}  // namespace

bool DeviceStager::OnStagerThread() { return t_on_stager_thread; }

void DeviceStager::Run() {
  t_on_stager_thread = true;
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and every copy started has been waited for
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    Status st = job.completion->Wait();
    copies_.fetch_add(1, std::memory_order_relaxed);
    if (st.ok()) {
      copied_bytes_.fetch_add(job.length, std::memory_order_relaxed);
    } else {
      copy_errors_.fetch_add(1, std::memory_order_relaxed);
      st = Status(st.code(), "tcp staging: device copy of " + std::to_string(job.length) + " bytes failed: " +
                                 st.message());
    }
    job.done(st);
    job = Job{};  // drops the continuation (and what it captured) outside the lock
    lock.lock();
  }
}

void DeviceStager::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

nlohmann::json DeviceStager::Stats() const {
  size_t pinned, cached;
  {
    std::lock_guard lock(cache_->mu);
    pinned = cache_->pinned;
    cached = cache_->cached;
  }
  return {{"copies", copies_.load()},
          {"copied_bytes", copied_bytes_.load()},
          {"copy_errors", copy_errors_.load()},
          {"pinned_bytes", pinned},
          {"cached_bytes", cached}};
}

}  // namespace mooncake::te::tcp
