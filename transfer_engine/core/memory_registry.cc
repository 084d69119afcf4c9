#include "transfer_engine/core/memory_registry.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <thread>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"

namespace mooncake::te {
MemoryRegistry::MemoryRegistry() {
  epoch_ = &fallback_epoch_;
  int fd = memfd_create("mooncake-epoch", MFD_CLOEXEC);
  if (fd < 0) return;
  void* p = MAP_FAILED;
  if (ftruncate(fd, 4096) == 0) p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return;
  }
  epoch_fd_ = fd;
  epoch_ = new (p) std::atomic<uint64_t>(0);
}

MemoryRegistry::~MemoryRegistry() {
  if (epoch_fd_ >= 0) {
    munmap(reinterpret_cast<void*>(epoch_), 4096);
    close(epoch_fd_);
  }
}

uint64_t MemoryRegistry::epoch() const { return epoch_->load(std::memory_order_acquire); }

Status MemoryRegistry::Register(uint64_t addr, uint64_t length, std::string location, bool remote_accessible,
                                int shm_fd, uint64_t shm_offset) {
  if (addr == 0) return InvalidArgument("cannot register a null address");
  if (length == 0) return InvalidArgument("cannot register zero bytes at " + Hex(addr));
  if (addr + length < addr) return InvalidArgument("range at " + Hex(addr) + " wraps around the address space");
  std::unique_lock lock(mu_);
  auto next = by_start_.lower_bound(addr);
  bool overlaps = next != by_start_.end() && next->second->start < addr + length;
  if (!overlaps && next != by_start_.begin()) overlaps = std::prev(next)->second->end() > addr;
  if (overlaps) {
    return Status(ErrorCode::kAddressOverlapped,
                  "range [" + Hex(addr) + ", +" + std::to_string(length) + ") overlaps a registered range");
  }
  auto region = std::make_shared<MemoryRegion>();
  region->start = addr;
  region->length = length;
  region->location = location.empty() ? "*" : std::move(location);
  region->remote_accessible = remote_accessible;
  region->shm_fd = shm_fd;
  region->shm_offset = shm_offset;
  by_start_.emplace(addr, std::move(region));
  order_.push_back(addr);
  return Status::Ok();
}

Status MemoryRegistry::Unregister(uint64_t addr, std::chrono::milliseconds drain_timeout) {
  std::shared_ptr<MemoryRegion> region;
  {
    std::unique_lock lock(mu_);
    auto it = by_start_.find(addr);
    if (it == by_start_.end()) {
      return Status(ErrorCode::kAddressNotRegistered, "no registration starts at " + Hex(addr));
    }
    region = std::move(it->second);
    by_start_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), addr));
    epoch_->fetch_add(1, std::memory_order_acq_rel);
  }
  auto deadline = std::chrono::steady_clock::now() + drain_timeout;
  while (region.use_count() > 1) {
    if (std::chrono::steady_clock::now() > deadline) {
      MC_LOG(kWarning) << "unregistered " << Hex(addr) << " while " << region.use_count() - 1
                       << " transfer(s) still use it; they will fail or time out";
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return Status::Ok();
}

RegionPin MemoryRegistry::Find(uint64_t addr, uint64_t length, bool remote) const {
  if (addr + length < addr) return nullptr;
  std::shared_lock lock(mu_);
  auto it = by_start_.upper_bound(addr);
  if (it == by_start_.begin()) return nullptr;
  --it;
  const auto& r = it->second;
  if (addr + length > r->end()) return nullptr;
  if (remote && !r->remote_accessible) return nullptr;
  return r;
}

std::vector<MemoryRegion> MemoryRegistry::List() const {
  std::shared_lock lock(mu_);
  std::vector<MemoryRegion> out;
  out.reserve(order_.size());
  for (uint64_t start : order_) out.push_back(*by_start_.at(start));
  return out;
}

size_t MemoryRegistry::size() const {
  std::shared_lock lock(mu_);
  return by_start_.size();
}

}  // namespace mooncake::te
