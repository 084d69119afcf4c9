#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_COMPLETION_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_COMPLETION_H_

// The cuda platform's context guard and copy completion (private to cuda_platform.cc).

#include <memory>
#include <mutex>

#include "transfer_engine/platform/cuda/cuda_driver.h"
#include "transfer_engine/platform/platform.h"

namespace mooncake::te::cuda {

// For its lifetime: whatever the calling thread does to its current context is undone at the end, which
// restores the context current at construction (none included). Every public entry point that makes a device's
// context current holds one, so callers (torch, say) keep their own context.
class ContextScope {
 public:
  explicit ContextScope(const DriverApi& api) : api_(api) {
    saved_ = api_.cuCtxGetCurrent(&previous_) == CUDA_SUCCESS;
  }
  ~ContextScope() {
    if (!saved_) return;
    CUcontext now = nullptr;
    if (api_.cuCtxGetCurrent(&now) != CUDA_SUCCESS || now != previous_) api_.cuCtxSetCurrent(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const DriverApi& api_;
  CUcontext previous_ = nullptr;
  bool saved_ = false;
};

class EventCompletion final : public CopyCompletion {
 public:
  EventCompletion(std::shared_ptr<const Driver> driver, CUcontext ctx, CUevent event)
      : driver_(std::move(driver)), ctx_(ctx), event_(event) {}
  ~EventCompletion() override {
    ContextScope scope(driver_->api());
    driver_->api().cuCtxSetCurrent(ctx_);
    driver_->api().cuEventDestroy(event_);
  }

  bool Done() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return true;
    ContextScope scope(driver_->api());
    driver_->api().cuCtxSetCurrent(ctx_);
    CUresult r = driver_->api().cuEventQuery(event_);
    if (r == CUDA_ERROR_NOT_READY) return false;
    Finish(r);
    return true;
  }

  Status Wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      ContextScope scope(driver_->api());
      driver_->api().cuCtxSetCurrent(ctx_);
      Finish(driver_->api().cuEventSynchronize(event_));
    }
    return status_;
  }

 private:
  void Finish(CUresult r) {
    done_ = true;
    status_ = driver_->Check(r, "cuda: the asynchronous copy", ErrorCode::kMemory);
  }

  std::shared_ptr<const Driver> driver_;
  CUcontext ctx_;
  CUevent event_;
  std::mutex mu_;
  bool done_ = false;
  Status status_;
};

}  // namespace mooncake::te::cuda

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_CUDA_CUDA_COMPLETION_H_
