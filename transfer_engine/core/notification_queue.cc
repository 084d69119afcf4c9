#include "transfer_engine/core/notification_queue.h"

#include <algorithm>
#include <string>
#include <utility>

#include "transfer_engine/common/log.h"

namespace mooncake::te {

Status NotificationQueue::Push(Notification n) {
  const size_t size = n.name.size() + n.message.size();
  std::lock_guard lock(mu_);
  if (queue_.size() >= max_count_ || size > max_bytes_ - std::min(bytes_, max_bytes_)) {
    ++dropped_;
    dropped_bytes_ += size;
    if (!overflowing_) {
      MC_LOG(kWarning) << "notification queue full (" << queue_.size() << " unread, " << bytes_
                       << " bytes; limits " << max_count_ << " and MC_NOTIFY_QUEUE_BYTES=" << max_bytes_
                       << "): refusing new notifications until get_notifies drains it (" << dropped_
                       << " refused so far)";
    }
    overflowing_ = true;
    return Status(ErrorCode::kTooManyRequests, "the receiver's notification queue is full (" +
                                                   std::to_string(queue_.size()) + " unread, " +
                                                   std::to_string(bytes_) + " bytes)");
  }
  overflowing_ = false;
  bytes_ += size;
  queue_.push_back(std::move(n));
  return Status::Ok();
}

std::vector<Notification> NotificationQueue::TakeAll() {
  std::lock_guard lock(mu_);
  std::vector<Notification> out(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
  queue_.clear();
  bytes_ = 0;
  return out;
}

NotificationQueue::Counters NotificationQueue::counters() const {
  std::lock_guard lock(mu_);
  return {queue_.size(), bytes_, dropped_, dropped_bytes_};
}

}  // namespace mooncake::te
