#include "transfer_engine/transport/file/uring.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace mooncake::te::file {
namespace {

int SysSetup(unsigned entries, io_uring_params* p) {
  return static_cast<int>(syscall(__NR_io_uring_setup, entries, p));
}

int SysEnter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags, void* arg = nullptr,
             size_t arg_size = 0) {
  return static_cast<int>(syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, arg, arg_size));
}

std::string Errno(int e) { return std::string(strerror(e)) + " (errno " + std::to_string(e) + ")"; }

}  // namespace

Ring::~Ring() {
  if (sqes_) munmap(sqes_, sqes_len_);
  if (cq_ptr_ && cq_ptr_ != sq_ptr_) munmap(cq_ptr_, cq_len_);
  if (sq_ptr_) munmap(sq_ptr_, sq_len_);
  if (fd_ >= 0) close(fd_);
}

Status Ring::Init(unsigned entries) {
  if (fd_ >= 0) return InvalidArgument("ring already initialised");
  io_uring_params p;
  memset(&p, 0, sizeof(p));
  int fd = SysSetup(entries, &p);
  if (fd < 0) return Status(ErrorCode::kNotImplemented, "io_uring_setup failed: " + Errno(errno));
  fd_ = fd;
  sq_entries_ = p.sq_entries;
  ext_arg_ = p.features & IORING_FEAT_EXT_ARG;
  sq_len_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  cq_len_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
  bool single = p.features & IORING_FEAT_SINGLE_MMAP;
  if (single) sq_len_ = cq_len_ = std::max(sq_len_, cq_len_);
  sq_ptr_ = mmap(nullptr, sq_len_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQ_RING);
  if (sq_ptr_ == MAP_FAILED) {
    sq_ptr_ = nullptr;
    return Status(ErrorCode::kNotImplemented, "mmap of the io_uring SQ ring failed: " + Errno(errno));
  }
  if (single) {
    cq_ptr_ = sq_ptr_;
  } else {
    cq_ptr_ = mmap(nullptr, cq_len_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_CQ_RING);
    if (cq_ptr_ == MAP_FAILED) {
      cq_ptr_ = nullptr;
      return Status(ErrorCode::kNotImplemented, "mmap of the io_uring CQ ring failed: " + Errno(errno));
    }
  }
  sqes_len_ = p.sq_entries * sizeof(io_uring_sqe);
  void* sqes = mmap(nullptr, sqes_len_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQES);
  if (sqes == MAP_FAILED) {
    return Status(ErrorCode::kNotImplemented, "mmap of the io_uring SQEs failed: " + Errno(errno));
  }
  sqes_ = static_cast<io_uring_sqe*>(sqes);
  auto* sq = static_cast<char*>(sq_ptr_);
  auto* cq = static_cast<char*>(cq_ptr_);
  sq_head_ = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
  sq_tail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
  sq_mask_ = reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
  sq_array_ = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
  cq_head_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
  cq_tail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
  cq_mask_ = reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
  cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
  sqe_tail_ = submitted_ = *sq_tail_;
  return Status::Ok();
}

io_uring_sqe* Ring::Sqe() {
  unsigned head = __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
  if (sqe_tail_ - head >= sq_entries_) return nullptr;
  unsigned idx = sqe_tail_ & *sq_mask_;
  io_uring_sqe* sqe = &sqes_[idx];
  memset(sqe, 0, sizeof(*sqe));
  sq_array_[idx] = idx;
  ++sqe_tail_;
  return sqe;
}

Status Ring::Submit() {
  unsigned n = sqe_tail_ - submitted_;
  if (n == 0) return Status::Ok();
  __atomic_store_n(sq_tail_, sqe_tail_, __ATOMIC_RELEASE);
  submitted_ = sqe_tail_;
  while (n > 0) {
    int r = SysEnter(fd_, n, 0, 0);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EBUSY) continue;
      return Status(ErrorCode::kContext, "io_uring_enter (submit) failed: " + Errno(errno));
    }
    n -= std::min<unsigned>(n, static_cast<unsigned>(r));
    if (r == 0) break;
  }
  return Status::Ok();
}

Status Ring::Wait() {
  while (*cq_head_ == __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE)) {
    int r = SysEnter(fd_, 0, 1, IORING_ENTER_GETEVENTS);
    if (r < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
      return Status(ErrorCode::kContext, "io_uring_enter (wait) failed: " + Errno(errno));
    }
  }
  return Status::Ok();
}

Status Ring::WaitSome(unsigned want, unsigned timeout_us) {
  if (want <= 1 || !ext_arg_) return Wait();
  auto ready = [this] { return __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE) - *cq_head_; };
  if (ready() >= want) return Status::Ok();
  struct __kernel_timespec ts;
  ts.tv_sec = 0;
  ts.tv_nsec = static_cast<long long>(timeout_us) * 1000;
  io_uring_getevents_arg arg;
  memset(&arg, 0, sizeof(arg));
  arg.ts = reinterpret_cast<uint64_t>(&ts);
  int r = SysEnter(fd_, 0, want, IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg, sizeof(arg));
  if (r < 0 && errno != ETIME && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
    return Status(ErrorCode::kContext, "io_uring_enter (wait) failed: " + Errno(errno));
  }
  return ready() > 0 ? Status::Ok() : Wait();
}

Status Ring::SubmitAndWait() {
  unsigned n = sqe_tail_ - submitted_;
  __atomic_store_n(sq_tail_, sqe_tail_, __ATOMIC_RELEASE);
  submitted_ = sqe_tail_;
  for (;;) {
    bool empty = *cq_head_ == __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
    if (n == 0 && !empty) return Status::Ok();
    int r = SysEnter(fd_, n, empty ? 1 : 0, IORING_ENTER_GETEVENTS);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EBUSY) continue;
      return Status(ErrorCode::kContext, "io_uring_enter failed: " + Errno(errno));
    }
    n -= std::min<unsigned>(n, static_cast<unsigned>(r));
    if (n == 0 && *cq_head_ != __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE)) return Status::Ok();
  }
}

Status ProbeIoUring() {
  Ring r;
  return r.Init(1);
}

}  // namespace mooncake::te::file
