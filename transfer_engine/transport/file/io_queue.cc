#include "transfer_engine/transport/file/io_queue.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mooncake::te::file {
namespace {

constexpr uint64_t kWakeUp = 0;  // user_data of the NOP that Stop submits
constexpr unsigned kGroupWaitUs = 20;

std::string Range(uint64_t offset, size_t length) {
  return "[" + std::to_string(offset) + ", +" + std::to_string(length) + ")";
}

}  // namespace

IoQueue::IoQueue(unsigned depth, bool private_driver) : depth_(depth == 0 ? 1 : depth), private_(private_driver) {}

IoQueue::~IoQueue() {
  Stop();
  std::vector<Op*> finished;
  {
    std::lock_guard lock(mu_);
    DrainQueuedLocked(finished);
  }
  Complete(finished);
}

Status IoQueue::Init() { return ring_.Init(depth_ + 1); }

Status IoQueue::Plan(Op* op) {
  const FileIo& io = op->io;
  const uint64_t off = io.offset, end = io.offset + io.length;
  auto add = [op](int fd, bool direct, char* buf, uint64_t o, size_t len) {
    Piece& p = op->pieces[op->count++];
    p.op = op;
    p.fd = fd;
    p.direct = direct;
    p.buf = buf;
    p.offset = o;
    p.length = len;
  };
  if (!io.file->direct()) {
    add(io.file->buffered_fd(), false, io.buf, off, io.length);
    return Status::Ok();
  }
  const uint64_t a = io.file->alignment().offset;
  const uint64_t m = io.file->alignment().memory;
  const uint64_t mid_start = (off + a - 1) / a * a, mid_end = end / a * a;
  const uint64_t head_end = std::min(end, mid_start);
  if (off % a != 0) add(io.file->buffered_fd(), false, io.buf, off, head_end - off);
  if (mid_start < mid_end) {
    char* user = io.buf + (mid_start - off);
    size_t len = mid_end - mid_start;
    if (reinterpret_cast<uintptr_t>(user) % m == 0) {
      add(io.file->direct_fd(), true, user, mid_start, len);
    } else {
      void* b = nullptr;
      if (posix_memalign(&b, std::max<size_t>(m, 4096), len) != 0) {
        return Status(ErrorCode::kMemory, "no memory for a " + std::to_string(len) + "-byte bounce buffer");
      }
      op->bounce = static_cast<char*>(b);
      op->bounce_user = user;
      op->bounce_len = len;
      if (io.write) memcpy(op->bounce, user, len);
      add(io.file->direct_fd(), true, op->bounce, mid_start, len);
    }
  }
  if (end % a != 0 && mid_end >= head_end) {
    uint64_t start = std::max(mid_end, head_end);
    add(io.file->buffered_fd(), false, io.buf + (start - off), start, end - start);
  }
  return Status::Ok();
}

void IoQueue::Enqueue(std::vector<FileIo> ios) {
  std::vector<Op*> finished;
  std::vector<Op*> planned;
  planned.reserve(ios.size());
  for (auto& io : ios) {
    Op* op = new Op();
    op->io = std::move(io);
    if (!op->io.file) {
      op->status = InvalidArgument("no file");
    } else if (op->io.write && op->io.file->read_only()) {
      op->status = Status(ErrorCode::kRemoteRejected, "file '" + op->io.file->path() + "' is read-only here");
    } else if (op->io.length > 0) {
      op->status = Plan(op);
    }
    if (!op->status.ok() || op->count == 0) {
      finished.push_back(op);
      continue;
    }
    op->remaining = op->count;
    planned.push_back(op);
  }
  {
    std::lock_guard lock(mu_);
    for (Op* op : planned) {
      if (stopping_) {
        op->status = Status(ErrorCode::kSocket, "the file transport is stopping");
        free(op->bounce);
        op->bounce = nullptr;
        finished.push_back(op);
        continue;
      }
      ++live_ops_;
      for (int i = 0; i < op->count; ++i) {
        Piece& p = op->pieces[i];
        (p.direct ? (op->bounce && p.buf == op->bounce ? counters_.bounced_pieces : counters_.direct_pieces)
                  : counters_.buffered_pieces)
            .fetch_add(1, std::memory_order_relaxed);
        queued_.push_back(&p);
      }
    }
    FillLocked();
  }
  Complete(finished);
}

void IoQueue::FillLocked() {
  bool any = false;
  while (in_flight_ < depth_ && !queued_.empty()) {
    io_uring_sqe* sqe = ring_.Sqe();
    if (!sqe) break;
    Piece* p = queued_.front();
    queued_.pop_front();
    sqe->opcode = p->op->io.write ? IORING_OP_WRITE : IORING_OP_READ;
    sqe->fd = p->fd;
    sqe->addr = reinterpret_cast<uint64_t>(p->buf + p->done);
    sqe->len = static_cast<uint32_t>(p->length - p->done);
    sqe->off = p->offset + p->done;
    sqe->user_data = reinterpret_cast<uint64_t>(p);
    ++in_flight_;
    any = true;
  }
  if (!any || private_) return;  // a private driver submits with its next wait
  Status st = ring_.Submit();
  (void)st;  // entries stay in the submission ring; the next Submit hands them over again
}

void IoQueue::OnCompletion(Piece* p, int res, std::vector<Op*>& finished) {
  --in_flight_;
  Op* op = p->op;
  const FileIo& io = op->io;
  if (res == -EAGAIN || res == -EINTR) {
    queued_.push_front(p);
    return;
  }
  if (res < 0) {
    int e = -res;
    std::string what = std::string(io.write ? "write to" : "read from") + " file '" + io.file->path() + "' at " +
                       Range(p->offset + p->done, p->length - p->done) + ": " + ErrnoText(e);
    Status st;
    if (e == ENOSPC || e == EDQUOT) {
      st = Status(ErrorCode::kMemory, "no space left: " + what);
    } else if (e == EINVAL && p->direct) {
      st = InvalidArgument("direct I/O refused (alignment " + std::to_string(io.file->alignment().offset) +
                           "): " + what);
    } else {
      st = Status(ErrorCode::kContext, what);
    }
    if (op->status.ok()) op->status = st;
    FinishPiece(p, finished);
    return;
  }
  if (res == 0) {
    if (op->status.ok()) {
      if (io.write) {
        op->status = Status(ErrorCode::kContext, "write to file '" + io.file->path() + "' made no progress at byte " +
                                                     std::to_string(p->offset + p->done));
      } else {
        Status size = io.file->Check(io.offset + io.length);
        op->status = Status(ErrorCode::kRemoteRejected,
                            "short read: file '" + io.file->path() + "' ends before byte " +
                                std::to_string(p->offset + p->length) + " (read " + Range(io.offset, io.length) +
                                " stopped at byte " + std::to_string(p->offset + p->done) + ")" +
                                (size.ok() ? std::string() : "; " + size.message()));
      }
    }
    FinishPiece(p, finished);
    return;
  }
  p->done += static_cast<size_t>(res);
  if (p->done < p->length) {
    queued_.push_front(p);  // continue where it stopped
    return;
  }
  FinishPiece(p, finished);
}

void IoQueue::FinishPiece(Piece* p, std::vector<Op*>& finished) {
  if (--p->op->remaining == 0) Finalize(p->op, finished);
}

void IoQueue::Finalize(Op* op, std::vector<Op*>& finished) {
  if (op->bounce) {
    if (op->status.ok() && !op->io.write) memcpy(op->bounce_user, op->bounce, op->bounce_len);
    free(op->bounce);
    op->bounce = nullptr;
  }
  if (op->status.ok()) op->status = op->io.file->Check(op->io.offset + op->io.length);
  --live_ops_;
  finished.push_back(op);
}

void IoQueue::Complete(std::vector<Op*>& finished) {
  for (Op* op : finished) {
    if (op->status.ok()) {
      counters_.ios.fetch_add(1, std::memory_order_relaxed);
      counters_.bytes.fetch_add(op->io.length, std::memory_order_relaxed);
    } else {
      counters_.errors.fetch_add(1, std::memory_order_relaxed);
    }
    op->io.done(op->status);
    delete op;
  }
  finished.clear();
}

bool IoQueue::Step(bool until_stopped) {
  std::vector<Op*> finished;
  bool idle;
  unsigned in_flight;
  {
    std::lock_guard lock(mu_);
    in_flight = in_flight_;
    idle = until_stopped ? (stopping_ && in_flight_ == 0 && !wake_pending_) : (in_flight_ == 0 && queued_.empty());
    if (idle) DrainQueuedLocked(finished);
  }
  if (idle) {
    Complete(finished);
    return false;
  }
  // A shared queue (the worker's) reaps a busy ring in groups of a quarter of what is in flight, waiting at most
  // kGroupWaitUs for a group to fill.
  Status st = private_ ? ring_.SubmitAndWait() : ring_.WaitSome(in_flight / 4, kGroupWaitUs);
  {
    std::lock_guard lock(mu_);
    ring_.Reap([&](uint64_t user_data, int res) {
      if (user_data == kWakeUp) {
        wake_pending_ = false;
        return;
      }
      OnCompletion(reinterpret_cast<Piece*>(user_data), res, finished);
    });
    if (stopping_) {
      DrainQueuedLocked(finished);
    } else {
      FillLocked();
    }
  }
  Complete(finished);
  return st.ok();
}

void IoQueue::DrainQueuedLocked(std::vector<Op*>& finished) {
  while (!queued_.empty()) {
    Piece* p = queued_.front();
    queued_.pop_front();
    if (p->op->status.ok()) p->op->status = Status(ErrorCode::kSocket, "the file transport is stopping");
    FinishPiece(p, finished);
  }
}

void IoQueue::Run() {
  while (Step(/*until_stopped=*/true)) {
  }
}

void IoQueue::DriveUntilIdle() {
  while (Step(/*until_stopped=*/false)) {
  }
}

void IoQueue::Stop() {
  std::lock_guard lock(mu_);
  if (stopping_ || !ring_.ready()) {
    stopping_ = true;
    return;
  }
  stopping_ = true;
  io_uring_sqe* sqe = ring_.Sqe();
  if (sqe) {
    sqe->opcode = IORING_OP_NOP;
    sqe->user_data = kWakeUp;
    wake_pending_ = true;
    Status st = ring_.Submit();
    if (!st.ok()) wake_pending_ = false;
  }
}

}  // namespace mooncake::te::file
