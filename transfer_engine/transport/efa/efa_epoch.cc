#include "transfer_engine/transport/efa/efa_epoch.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace mooncake::te::efa {

StatusOr<std::unique_ptr<EpochPage>> EpochPage::Create() {
  void* mem = aligned_alloc(kPageSize, kPageSize);
  if (mem == nullptr) return Status(ErrorCode::kMemory, "cannot allocate the epoch page");
  memset(mem, 0, kPageSize);
  std::unique_ptr<EpochPage> p(new EpochPage());
  p->value_ = new (mem) std::atomic<uint64_t>(0);
  return p;
}

EpochPage::~EpochPage() { free(value_); }

EpochSlots::~EpochSlots() {
  for (auto& b : blocks_) {
    b.mr.reset();  // closed before its memory is freed
    free(b.mem);
  }
}

StatusOr<EpochSlots::Slot> EpochSlots::Take() {
  std::lock_guard lock(mu_);
  if (free_.empty()) {
    Block b;
    b.mem = static_cast<uint64_t*>(aligned_alloc(4096, kBlockSlots * sizeof(uint64_t)));
    if (b.mem == nullptr) return Status(ErrorCode::kMemory, "cannot allocate epoch read slots");
    auto mr = domain_->Register(b.mem, kBlockSlots * sizeof(uint64_t), FabricDomain::RemoteAccess::kNone);
    if (!mr.ok()) {
      free(b.mem);
      return mr.status();
    }
    b.mr = std::move(mr.value());
    for (size_t i = 0; i < kBlockSlots; ++i) free_.push_back({b.mem + i, b.mr->desc()});
    blocks_.push_back(std::move(b));
  }
  Slot s = free_.back();
  free_.pop_back();
  return s;
}

void EpochSlots::Give(Slot s) {
  std::lock_guard lock(mu_);
  free_.push_back(s);
}

}  // namespace mooncake::te::efa
