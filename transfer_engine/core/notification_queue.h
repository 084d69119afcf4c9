#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_NOTIFICATION_QUEUE_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_NOTIFICATION_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/api/types.h"

namespace mooncake::te {

/// Notifications received from peers and not yet taken (get_notifies). Any peer can send them, so the queue
/// is bounded in count and in bytes (name + message): a notification that does not fit is refused (the
/// sender is told), counted and logged (one line per overflow episode); the queued ones are kept.
///
/// Threading: all methods are thread-safe.
class NotificationQueue {
 public:
  NotificationQueue(size_t max_count, size_t max_bytes) : max_count_(max_count), max_bytes_(max_bytes) {}

  /// kTooManyRequests when it does not fit (nothing queued).
  Status Push(Notification n);
  /// Everything queued, oldest first; empties the queue.
  std::vector<Notification> TakeAll();

  struct Counters {
    size_t queued = 0;
    size_t queued_bytes = 0;
    uint64_t dropped = 0;
    uint64_t dropped_bytes = 0;
  };
  Counters counters() const;
  size_t max_count() const { return max_count_; }
  size_t max_bytes() const { return max_bytes_; }

 private:
  const size_t max_count_;
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::deque<Notification> queue_;
  size_t bytes_ = 0;
  uint64_t dropped_ = 0;
  uint64_t dropped_bytes_ = 0;
  bool overflowing_ = false;  // a drop was logged; reset once one fits again
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_NOTIFICATION_QUEUE_H_
