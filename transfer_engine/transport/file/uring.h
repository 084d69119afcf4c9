#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_URING_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_URING_H_

#include <linux/io_uring.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transfer_engine/api/status.h"

namespace mooncake::te::file {

/// One io_uring instance driven by the raw system calls (io_uring_setup / io_uring_enter): the kernel ABI of
/// <linux/io_uring.h>, no liburing, so the plugin NEEDs no library for it.
///
/// Threading: the submission side (Sqe, Submit) must be used by one thread at a time (callers hold a lock);
/// the completion side (Wait, Reap) by one thread at a time; the two sides may run concurrently.
class Ring {
 public:
  Ring() = default;
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  /// Creates the ring with room for `entries` submissions (rounded up to a power of two by the kernel).
  /// kNotImplemented with the reason when io_uring is unavailable (old kernel, io_uring_disabled, seccomp).
  Status Init(unsigned entries);
  bool ready() const { return fd_ >= 0; }
  unsigned sq_entries() const { return sq_entries_; }

  /// A zeroed submission entry to fill, or null when the submission queue is full (Submit first).
  io_uring_sqe* Sqe();
  /// Hands every entry taken with Sqe since the last Submit to the kernel. Errors: the errno of io_uring_enter.
  Status Submit();
  /// Blocks until at least one completion is available (EINTR is retried).
  Status Wait();
  /// Submit and Wait in one system call (for a ring whose two sides one thread drives).
  Status SubmitAndWait();
  /// Blocks until `want` completions are available or `timeout_us` passed with at least one available (so a
  /// busy queue is reaped in groups, one wake-up per group, never holding a completion back longer than the
  /// timeout). Falls back to Wait where the kernel lacks IORING_FEAT_EXT_ARG.
  Status WaitSome(unsigned want, unsigned timeout_us);
  /// Calls fn(user_data, res) for every available completion, then releases them; the count.
  template <typename Fn>
  unsigned Reap(Fn&& fn) {
    unsigned head = *cq_head_;
    unsigned n = 0;
    while (head != __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE)) {
      const io_uring_cqe& c = cqes_[head & *cq_mask_];
      fn(c.user_data, c.res);
      ++head;
      ++n;
    }
    __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
    return n;
  }

 private:
  int fd_ = -1;
  unsigned sq_entries_ = 0;
  bool ext_arg_ = false;
  void* sq_ptr_ = nullptr;
  size_t sq_len_ = 0;
  void* cq_ptr_ = nullptr;
  size_t cq_len_ = 0;
  io_uring_sqe* sqes_ = nullptr;
  size_t sqes_len_ = 0;
  unsigned* sq_head_ = nullptr;
  unsigned* sq_tail_ = nullptr;
  unsigned* sq_mask_ = nullptr;
  unsigned* sq_array_ = nullptr;
  unsigned* cq_head_ = nullptr;
  unsigned* cq_tail_ = nullptr;
  unsigned* cq_mask_ = nullptr;
  io_uring_cqe* cqes_ = nullptr;
  unsigned sqe_tail_ = 0;   // entries handed out by Sqe
  unsigned submitted_ = 0;  // entries published to the kernel
};

/// Whether io_uring works here (a ring of one entry can be created); the reason when not.
Status ProbeIoUring();

}  // namespace mooncake::te::file

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_URING_H_
