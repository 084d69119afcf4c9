#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_EPOCH_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_EPOCH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/efa/fabric_domain.h"

namespace mooncake::te::efa {

/// The registration epoch: an 8-byte counter alone on a page, which peers read remotely before they post
/// (each domain registers the page for remote reads only); WithdrawRegion moves it on. Thread-safe.
class EpochPage {
 public:
  static StatusOr<std::unique_ptr<EpochPage>> Create();
  ~EpochPage();
  EpochPage(const EpochPage&) = delete;
  EpochPage& operator=(const EpochPage&) = delete;

  uint64_t value() const { return value_->load(std::memory_order_acquire); }
  void Advance() { value_->fetch_add(1, std::memory_order_acq_rel); }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(value_); }
  void* page() const { return value_; }
  static constexpr size_t kPageSize = 4096;

 private:
  EpochPage() = default;
  std::atomic<uint64_t>* value_ = nullptr;
};

/// Registered 8-byte slots of one domain that epoch reads land in. Thread-safe.
class EpochSlots {
 public:
  explicit EpochSlots(std::shared_ptr<FabricDomain> domain) : domain_(std::move(domain)) {}
  ~EpochSlots();

  struct Slot {
    uint64_t* ptr = nullptr;
    void* desc = nullptr;
  };
  /// A free slot (registers another block of them when none is free).
  StatusOr<Slot> Take();
  void Give(Slot s);

 private:
  static constexpr size_t kBlockSlots = 512;
  struct Block {
    uint64_t* mem = nullptr;
    std::unique_ptr<FabricMr> mr;
  };
  std::shared_ptr<FabricDomain> domain_;
  std::mutex mu_;
  std::vector<Block> blocks_;
  std::vector<Slot> free_;
};

}  // namespace mooncake::te::efa

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_EPOCH_H_
