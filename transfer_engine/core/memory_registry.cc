#include "transfer_engine/core/memory_registry.h"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <thread>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"

namespace mooncake::te {
const MemoryRegion::TransportEntry* MemoryRegion::transport(const std::string& name) const {
  for (const auto& e : transports) {
    if (e.transport == name) return &e;
  }
  return nullptr;
}

MemoryRegistry::MemoryRegistry() = default;
MemoryRegistry::~MemoryRegistry() = default;

Status MemoryRegistry::CheckRange(uint64_t addr, uint64_t length) const {
  std::shared_lock lock(mu_);
  return CheckRangeLocked(addr, length);
}

Status MemoryRegistry::CheckRangeLocked(uint64_t addr, uint64_t length) const {
  if (addr == 0) return InvalidArgument("cannot register a null address");
  if (length == 0) return InvalidArgument("cannot register zero bytes at " + Hex(addr));
  if (addr + length < addr) return InvalidArgument("range at " + Hex(addr) + " wraps around the address space");
  auto next = by_start_.lower_bound(addr);
  bool overlaps = next != by_start_.end() && next->second->start < addr + length;
  if (!overlaps && next != by_start_.begin()) overlaps = std::prev(next)->second->end() > addr;
  if (overlaps) {
    return Status(ErrorCode::kAddressOverlapped,
                  "range [" + Hex(addr) + ", +" + std::to_string(length) + ") overlaps a registered range");
  }
  return Status::Ok();
}

Status MemoryRegistry::Register(MemoryRegion region) {
  std::unique_lock lock(mu_);
  MC_RETURN_IF_ERROR(CheckRangeLocked(region.start, region.length));
  if (region.location.empty()) region.location = "*";
  uint64_t addr = region.start;
  by_start_.emplace(addr, std::make_shared<MemoryRegion>(std::move(region)));
  order_.push_back(addr);
  return Status::Ok();
}

Status MemoryRegistry::Unregister(uint64_t addr, std::chrono::milliseconds drain_timeout,
                                  const std::function<void(const MemoryRegion&)>& on_withdrawn,
                                  MemoryRegion* removed) {
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
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (on_withdrawn) on_withdrawn(*region);
  auto deadline = std::chrono::steady_clock::now() + drain_timeout;
  while (region.use_count() > 1) {
    if (std::chrono::steady_clock::now() > deadline) {
      MC_LOG(kWarning) << "unregistered " << Hex(addr) << " while " << region.use_count() - 1
                       << " transfer(s) still use it; they will fail or time out";
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (removed) *removed = *region;
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
