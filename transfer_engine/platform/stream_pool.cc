#include "transfer_engine/platform/stream_pool.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "transfer_engine/common/log.h"

namespace mooncake::te {

struct StreamPool::State {
  struct Device {
    std::vector<void*> streams;  // empty: the platform's own stream
    std::vector<size_t> in_flight;
    size_t next = 0;  // where the search for the least busy starts (ties are taken in turn)
  };

  State(std::shared_ptr<Platform> p, int n) : platform(std::move(p)), per_device(n) {}
  ~State() {
    for (auto& [device, d] : devices) {
      for (void* s : d.streams) {
        Status st = platform->DestroyStream(s);
        if (!st.ok()) MC_LOG(kWarning) << "stream pool: " << st.message();
      }
    }
  }

  // `device`'s entry, its streams created first when it has none yet (outside mu: creation may take a while).
  StatusOr<Device*> Ensure(int device) {
    {
      std::lock_guard lock(mu);
      auto it = devices.find(device);
      if (it != devices.end()) return &it->second;
    }
    std::vector<void*> made;
    Status failed;
    for (int i = 0; i < per_device; ++i) {
      StatusOr<void*> s = platform->CreateStream(device);
      if (!s.ok()) {
        failed = s.status();
        break;
      }
      made.push_back(*s);
    }
    if (!failed.ok()) {
      for (void* s : made) (void)platform->DestroyStream(s);
      made.clear();
    }
    std::lock_guard lock(mu);
    auto [it, inserted] = devices.try_emplace(device);
    if (!inserted) {  // another thread prepared it meanwhile: keep its streams
      for (void* s : made) (void)platform->DestroyStream(s);
      return &it->second;
    }
    it->second.streams = std::move(made);
    it->second.in_flight.assign(std::max<size_t>(1, it->second.streams.size()), 0);
    if (!failed.ok()) {
      if (failed.code() != ErrorCode::kNotImplemented) {
        MC_LOG(kWarning) << "stream pool: " << platform->name() << " device " << device
                         << " copies on the platform's own stream: " << failed.message();
      }
      return failed;
    }
    return &it->second;
  }

  void Release(int device, size_t index) {
    std::lock_guard lock(mu);
    --devices[device].in_flight[index];
  }

  const std::shared_ptr<Platform> platform;
  const int per_device;
  mutable std::mutex mu;  // devices (their vectors never change size once created)
  std::map<int, Device> devices;  // by device ordinal; -1: the platform's own stream only
};

namespace {

// The platform's completion, counted against its stream until it first reports the copy finished.
class PooledCompletion final : public CopyCompletion {
 public:
  PooledCompletion(std::unique_ptr<CopyCompletion> inner, std::shared_ptr<StreamPool::State> pool, int device,
                   size_t index)
      : inner_(std::move(inner)), pool_(std::move(pool)), device_(device), index_(index) {}
  ~PooledCompletion() override {
    inner_.reset();  // before the pool (and maybe its streams) goes
    Settle();
  }

  bool Done() override {
    if (!inner_->Done()) return false;
    Settle();
    return true;
  }
  Status Wait() override {
    Status st = inner_->Wait();
    Settle();
    return st;
  }

 private:
  void Settle() {
    std::call_once(settled_, [this] { pool_->Release(device_, index_); });
  }

  std::unique_ptr<CopyCompletion> inner_;
  std::shared_ptr<StreamPool::State> pool_;
  const int device_;
  const size_t index_;
  std::once_flag settled_;
};

}  // namespace

StreamPool::StreamPool(std::shared_ptr<Platform> platform, int per_device)
    : s_(std::make_shared<State>(std::move(platform), std::max(1, per_device))), per_device_(std::max(1, per_device)) {}

StreamPool::~StreamPool() = default;

StatusOr<size_t> StreamPool::Prepare(int device) {
  if (device < 0) return InvalidArgument("stream pool: no device " + std::to_string(device));
  StatusOr<State::Device*> d = s_->Ensure(device);
  if (!d.ok()) return d.status();
  std::lock_guard lock(s_->mu);
  return (*d)->streams.size();
}

StatusOr<std::unique_ptr<CopyCompletion>> StreamPool::CopyAsync(void* dst, const void* src, size_t length,
                                                                 int device) {
  State::Device* d = nullptr;
  if (device >= 0) {
    StatusOr<State::Device*> got = s_->Ensure(device);
    if (got.ok()) d = *got;
  }
  if (d == nullptr) {  // the platform's own stream
    std::lock_guard lock(s_->mu);
    d = &s_->devices.try_emplace(device < 0 ? -1 : device).first->second;
    if (d->in_flight.empty()) d->in_flight.assign(1, 0);
  }
  void* stream = nullptr;
  size_t index = 0;
  {
    std::lock_guard lock(s_->mu);
    const size_t n = d->in_flight.size();
    index = d->next % n;
    for (size_t k = 1; k < n; ++k) {
      const size_t i = (d->next + k) % n;
      if (d->in_flight[i] < d->in_flight[index]) index = i;
    }
    d->next = (index + 1) % n;
    ++d->in_flight[index];
    if (!d->streams.empty()) stream = d->streams[index];
  }
  const int key = device < 0 ? -1 : device;
  StatusOr<std::unique_ptr<CopyCompletion>> started = s_->platform->CopyAsync(dst, src, length, device, stream);
  if (!started.ok()) {
    s_->Release(key, index);
    return started.status();
  }
  return std::unique_ptr<CopyCompletion>(new PooledCompletion(std::move(started.value()), s_, key, index));
}

size_t StreamPool::streams() const {
  std::lock_guard lock(s_->mu);
  size_t n = 0;
  for (const auto& [device, d] : s_->devices) n += d.streams.size();
  return n;
}

size_t StreamPool::in_flight() const {
  std::lock_guard lock(s_->mu);
  size_t n = 0;
  for (const auto& [device, d] : s_->devices) {
    for (size_t c : d.in_flight) n += c;
  }
  return n;
}

}  // namespace mooncake::te
