#include "transfer_engine/core/batch.h"

namespace mooncake::te {

std::vector<Slice> CutIntoSlices(OpCode op, char* local, uint64_t remote, size_t length, size_t slice_size) {
  std::vector<Slice> slices;
  if (slice_size == 0) slice_size = length;
  slices.reserve(length / (slice_size ? slice_size : 1) + 1);
  for (size_t off = 0; off < length;) {
    size_t n = std::min(slice_size, length - off);
    size_t rest = length - off - n;
    if (rest > 0 && rest <= slice_size / 4) n += rest;
    Slice s;
    s.opcode = op;
    s.local = local + off;
    s.remote = remote + off;
    s.length = n;
    slices.push_back(s);
    off += n;
  }
  return slices;
}

void Slice::Complete(const Status& status) { task->OnSliceDone(status.ok() ? length : 0, status); }

void Slice::Fail(const Status& status, SliceRetry retry) {
  if (status.ok()) return Complete(status);
  const SliceRetryHook& hook = task->batch_->retry_hook();
  if (retry != SliceRetry::kFinal && hook && hook(this, status, retry)) return;
  task->OnSliceDone(0, status);
}

TransferStatus Task::status() const {
  return TransferStatus{static_cast<TransferState>(state_.load(std::memory_order_acquire)),
                        transferred_.load(std::memory_order_relaxed)};
}

Status Task::error() const {
  std::lock_guard lock(error_mu_);
  return error_;
}

void Task::Start(std::shared_ptr<Batch> owner, std::vector<Slice> slices, RegionPin local_pin) {
  slices_ = std::move(slices);
  local_pin_ = std::move(local_pin);
  for (auto& s : slices_) s.task = this;
  if (slices_.empty()) {
    state_.store(static_cast<uint8_t>(TransferState::kCompleted), std::memory_order_release);
    batch_->TaskFinished();
    return;
  }
  keep_alive_ = std::move(owner);
  if (route.latency) started_ = std::chrono::steady_clock::now();
  remaining_.store(slices_.size(), std::memory_order_relaxed);
  state_.store(static_cast<uint8_t>(TransferState::kPending), std::memory_order_release);
}

void Task::Fail(std::shared_ptr<Batch> /*owner*/, const Status& status) {
  {
    std::lock_guard lock(error_mu_);
    error_ = status;
  }
  auto state = status.code() == ErrorCode::kTimeout ? TransferState::kTimeout : TransferState::kFailed;
  state_.store(static_cast<uint8_t>(state), std::memory_order_release);
  batch_->TaskFinished();
}

void Task::OnSliceDone(size_t bytes, const Status& status) {
  if (!status.ok()) {
    std::lock_guard lock(error_mu_);
    if (error_.ok()) error_ = status;
  }
  if (bytes) transferred_.fetch_add(bytes, std::memory_order_relaxed);
  if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) Finish();
}

void Task::Finish() {
  TransferState state = TransferState::kCompleted;
  {
    std::lock_guard lock(error_mu_);
    if (!error_.ok()) state = error_.code() == ErrorCode::kTimeout ? TransferState::kTimeout : TransferState::kFailed;
  }
  local_pin_.reset();
  if (state == TransferState::kCompleted && route.latency) {
    route.latency->Record(std::chrono::steady_clock::now() - started_, transferred_.load(std::memory_order_relaxed));
  }
  state_.store(static_cast<uint8_t>(state), std::memory_order_release);
  // Drop our reference last: it may destroy the batch, and with it this task.
  std::shared_ptr<Batch> owner = std::move(keep_alive_);
  batch_->TaskFinished();
}

Batch::Batch(size_t capacity) : capacity_(capacity), tasks_(new Task[capacity == 0 ? 1 : capacity]) {
  for (size_t i = 0; i < capacity_; ++i) tasks_[i].batch_ = this;
}

Batch::~Batch() = default;

StatusOr<Task*> Batch::AddTask() {
  size_t i = size_.load(std::memory_order_relaxed);
  if (i >= capacity_) {
    return Status(ErrorCode::kTooManyRequests,
                  "batch capacity " + std::to_string(capacity_) + " exceeded; allocate a larger batch");
  }
  unfinished_.fetch_add(1, std::memory_order_acq_rel);
  size_.store(i + 1, std::memory_order_release);
  return &tasks_[i];
}

void Batch::StartTask(Task* task, std::vector<Slice> slices, RegionPin local_pin) {
  task->Start(shared_from_this(), std::move(slices), std::move(local_pin));
}

void Batch::FailTask(Task* task, const Status& status) { task->Fail(shared_from_this(), status); }

TransferStatus Batch::status() const {
  TransferStatus out;
  size_t n = size();
  if (n == 0) return out;
  bool all_terminal = true;
  bool all_completed = true;
  TransferState failure = TransferState::kFailed;
  bool failed = false;
  for (size_t i = 0; i < n; ++i) {
    TransferStatus s = tasks_[i].status();
    out.transferred_bytes += s.transferred_bytes;
    if (!IsTerminal(s.state)) all_terminal = false;
    if (s.state != TransferState::kCompleted) all_completed = false;
    if (s.state == TransferState::kFailed || s.state == TransferState::kTimeout) {
      if (!failed) failure = s.state;
      failed = true;
    }
  }
  if (all_completed) out.state = TransferState::kCompleted;
  else if (all_terminal && failed) out.state = failure;
  else if (all_terminal) out.state = TransferState::kFailed;
  else out.state = TransferState::kPending;
  return out;
}

bool Batch::WaitUntil(std::chrono::steady_clock::time_point deadline) {
  if (finished()) return true;
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return finished(); });
}

void Batch::OnFinished(std::function<void(const Batch&)> fn) {
  {
    std::lock_guard lock(mu_);
    if (!finished()) {
      on_finished_.push_back(std::move(fn));
      return;
    }
  }
  fn(*this);
}

void Batch::TaskFinished() {
  if (unfinished_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::vector<std::function<void(const Batch&)>> fns;
  {
    std::lock_guard lock(mu_);
    fns.swap(on_finished_);
    cv_.notify_all();
  }
  for (auto& fn : fns) fn(*this);
}

}  // namespace mooncake::te
