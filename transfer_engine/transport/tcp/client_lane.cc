#include "transfer_engine/transport/tcp/client_lane.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"

namespace mooncake::te::tcp {
namespace {

constexpr int kMaxIov = 64;
// READ slices from this size on are received with a short spin between bursts (see TryDrive).
constexpr size_t kSpinMinSlice = 256u << 10;

size_t FrameBytes(const Slice* s) { return kRequestHeaderSize + (s->opcode == OpCode::kWrite ? s->length : 0); }

}  // namespace

ClientLane::ClientLane(const TcpConfig& config, IoLoop* loop, Path* path, LaneOwner* owner)
    : config_(config), loop_(loop), path_(path), owner_(owner) {}

ClientLane::~ClientLane() {
  if (fd_ >= 0) {
    loop_->Remove(fd_);
    close(fd_);
  }
}

void ClientLane::Settle(Outcome& out) {
  for (auto& [slice, status] : out.done) owner_->OnSliceDone(slice, status);
  out.done.clear();
  if (!out.failed.empty()) owner_->OnLaneFailed(this, std::move(out.failed), out.why);
  out.failed.clear();
}

Status ClientLane::ConnectLocked() {
  auto fd = net::Connect(path_->remote_ip, path_->port, config_.connect_timeout, path_->local_ip);
  if (!fd.ok()) return Status(ErrorCode::kPeerUnreachable, path_->label + ": " + fd.status().message());
  Status nonblocking = net::SetNonBlocking(*fd, true);
  if (!nonblocking.ok()) {
    close(*fd);
    return nonblocking;
  }
  // Let the kernel give up on a connection whose data goes unacknowledged (link down) as well.
  unsigned int user_timeout = static_cast<unsigned int>(config_.stall_timeout.count());
  setsockopt(*fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  fd_ = *fd;
  want_write_ = false;
  rstart_ = rend_ = 0;
  payload_left_ = 0;
  Status st = loop_->Add(fd_, EPOLLIN, this);
  if (!st.ok()) {
    close(fd_);
    fd_ = -1;
    return st;
  }
  connected_.store(true, std::memory_order_relaxed);
  MC_LOG(kDebug) << "connected " << path_->label;
  return Status::Ok();
}

bool ClientLane::QueueLocked(const std::vector<Slice*>& slices, Outcome* out) {
  if (shut_) {  // the transport stopped (its loops may be gone): nothing would ever complete these
    for (Slice* s : slices) out->done.emplace_back(s, shut_why_);
    return false;
  }
  if (fd_ < 0) {
    Status st = ConnectLocked();
    if (!st.ok()) {
      out->failed.insert(out->failed.end(), slices.begin(), slices.end());
      out->why = st;
      return false;
    }
  }
  if (pending_.empty()) last_progress_ = std::chrono::steady_clock::now();
  for (Slice* s : slices) {
    Pending p;
    p.slice = s;
    p.buf = owner_->PayloadBuffer(s);
    p.seq = next_seq_++;
    p.sent = 0;
    RequestHeader h;
    h.op = s->opcode == OpCode::kWrite ? FrameOp::kWrite : FrameOp::kRead;
    h.seq = p.seq;
    h.addr = s->remote;
    h.length = s->length;
    EncodeRequest(h, p.header);
    outstanding_bytes_.fetch_add(s->length, std::memory_order_relaxed);
    pending_.push_back(p);
  }
  return true;
}

void ClientLane::Enqueue(const std::vector<Slice*>& slices) {
  Outcome out;
  {
    std::lock_guard lock(mu_);
    // Write now if the socket was idle; otherwise the loop (or a driving caller) is already flushing.
    if (QueueLocked(slices, &out) && !want_write_) FlushLocked(&out);
  }
  Settle(out);
}

bool ClientLane::TryDrive(const std::vector<Slice*>& slices) {
  Outcome out;
  std::unique_lock lock(mu_);
  if (driving_ || !pending_.empty()) return false;
  if (!QueueLocked(slices, &out)) {
    lock.unlock();
    Settle(out);
    return true;
  }
  const uint64_t last_seq = next_seq_ - 1;
  driving_ = true;
  Status st = loop_->Modify(fd_, 0, this);  // the loop thread keeps off while we drive
  if (!st.ok()) MC_LOG(kWarning) << path_->label << ": " << st.message();
  FlushLocked(&out);
  // Until our answers (the first in line: the lane was idle) are in. Slices other threads add meanwhile are
  // moved along too; the loop thread takes over whatever is left.
  while (fd_ >= 0 && !pending_.empty() && pending_.front().seq <= last_seq) {
    if (payload_left_ > 0 && pending_.front().slice->length >= kSpinMinSlice && send_index_ == pending_.size() &&
        config_.recv_spin.count() > 0) {
      // Receiving a large payload, nothing left to send: the rest is streaming in from a sender that is running
      // right now. Keep the core for a moment (MC_TCP_RECV_SPIN_US) rather than sleep in poll and pay a wake-up
      // (tens of microseconds in a VM) per burst of segments: 1 MiB reads on loopback gain about 1.3x. Small
      // payloads sleep at once (their sender may need this core); the spin ends at the first byte received.
      auto until = std::chrono::steady_clock::now() + config_.recv_spin;
      size_t before = payload_left_;
      while (fd_ >= 0 && payload_left_ == before && std::chrono::steady_clock::now() < until) ReadLocked(&out);
      if (fd_ < 0 || payload_left_ != before) continue;
    }
    pollfd p{fd_, static_cast<short>(POLLIN | (send_index_ < pending_.size() ? POLLOUT : 0)), 0};
    lock.unlock();
    int r = poll(&p, 1, 100);  // wakes up now and then so stalls and shutdown are seen
    lock.lock();
    if (fd_ < 0 || r < 0) break;
    if (r == 0) {
      if (std::chrono::steady_clock::now() - last_progress_ >= config_.stall_timeout) {
        CloseLocked(Status(ErrorCode::kTimeout, path_->label + " moved no data for " +
                                                    std::to_string(config_.stall_timeout.count()) + " ms"),
                    /*reroute=*/true, &out);
      }
      continue;
    }
    if (p.revents & (POLLIN | POLLERR | POLLHUP)) ReadLocked(&out);
    if (fd_ >= 0 && (p.revents & POLLOUT)) FlushLocked(&out);
  }
  driving_ = false;
  if (fd_ >= 0) {
    want_write_ = send_index_ < pending_.size();
    st = loop_->Modify(fd_, EPOLLIN | (want_write_ ? EPOLLOUT : 0), this);
    if (!st.ok()) MC_LOG(kWarning) << path_->label << ": " << st.message();
  }
  // Slices queued for the peer while we drove may have found this lane full: it has room again.
  bool room = fd_ >= 0 && !out.done.empty();
  lock.unlock();
  Settle(out);
  if (room) owner_->OnLaneRoom(this);
  return true;
}

void ClientLane::FlushLocked(Outcome* out) {
  while (send_index_ < pending_.size()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (size_t i = send_index_; i < pending_.size() && n + 2 <= kMaxIov; ++i) {
      Pending& p = pending_[i];
      size_t off = p.sent;
      if (off < kRequestHeaderSize) {
        iov[n++] = {p.header + off, kRequestHeaderSize - off};
        off = kRequestHeaderSize;
      }
      if (p.slice->opcode == OpCode::kWrite) {
        size_t poff = off - kRequestHeaderSize;
        if (poff < p.slice->length) iov[n++] = {p.buf + poff, p.slice->length - poff};
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        UpdateInterestLocked(true);
        return;
      }
      CloseLocked(Status(ErrorCode::kSocket, "send on " + path_->label + ": " + strerror(errno)), true, out);
      return;
    }
    last_progress_ = std::chrono::steady_clock::now();
    size_t left = static_cast<size_t>(w);
    while (left > 0 && send_index_ < pending_.size()) {
      Pending& p = pending_[send_index_];
      size_t take = std::min(FrameBytes(p.slice) - p.sent, left);
      p.sent += take;
      left -= take;
      if (p.sent == FrameBytes(p.slice)) ++send_index_;
    }
  }
  UpdateInterestLocked(false);
}

void ClientLane::UpdateInterestLocked(bool want_write) {
  if (want_write == want_write_ || fd_ < 0) return;
  want_write_ = want_write;
  if (driving_) return;  // the driving caller polls for POLLOUT itself and re-arms epoll when done
  Status st = loop_->Modify(fd_, EPOLLIN | (want_write ? EPOLLOUT : 0), this);
  if (!st.ok()) MC_LOG(kWarning) << path_->label << ": " << st.message();
}

void ClientLane::OnEvents(uint32_t events) {
  Outcome out;
  bool room = false;
  {
    std::lock_guard lock(mu_);
    if (fd_ < 0 || driving_) return;  // stale event, or a caller drives this socket right now
    if (events & EPOLLIN) ReadLocked(&out);
    if (fd_ >= 0 && (events & EPOLLOUT)) FlushLocked(&out);
    if (fd_ >= 0 && (events & (EPOLLERR | EPOLLHUP)) && !(events & EPOLLIN)) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      CloseLocked(Status(ErrorCode::kSocket, path_->label + " failed: " + (err ? strerror(err) : "hang-up")), true,
                  &out);
    }
    room = fd_ >= 0 && !out.done.empty();
  }
  Settle(out);
  if (room) owner_->OnLaneRoom(this);
}

ssize_t ClientLane::RecvLocked(char* dst, size_t len, Outcome* out) {
  while (true) {
    ssize_t n = recv(fd_, dst, len, MSG_DONTWAIT);
    if (n > 0) {
      last_progress_ = std::chrono::steady_clock::now();
      return n;
    }
    if (n == 0) {
      CloseLocked(Status(ErrorCode::kSocket, "connection closed by the peer on " + path_->label), true, out);
      return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno != EINTR) {
      CloseLocked(Status(ErrorCode::kSocket, "recv on " + path_->label + ": " + strerror(errno)), true, out);
      return -1;
    }
  }
}

void ClientLane::CompleteFrontLocked(const Status& status, Outcome* out) {
  Pending p = pending_.front();
  pending_.pop_front();
  --send_index_;
  outstanding_bytes_.fetch_sub(p.slice->length, std::memory_order_relaxed);
  if (status.ok()) {
    path_->bytes.fetch_add(p.slice->length, std::memory_order_relaxed);
    path_->slices.fetch_add(1, std::memory_order_relaxed);
  } else {
    path_->errors.fetch_add(1, std::memory_order_relaxed);
  }
  out->done.emplace_back(p.slice, status);
}

void ClientLane::ReadLocked(Outcome* out) {
  while (fd_ >= 0) {
    if (payload_left_ > 0) {
      Slice* s = pending_.front().slice;
      char* dst = pending_.front().buf + (s->length - payload_left_);
      size_t buffered = rend_ - rstart_;
      if (buffered > 0) {
        size_t take = std::min(buffered, payload_left_);
        memcpy(dst, rbuf_ + rstart_, take);
        rstart_ += take;
        payload_left_ -= take;
      } else {
        ssize_t n = RecvLocked(dst, payload_left_, out);
        if (n <= 0) return;
        payload_left_ -= static_cast<size_t>(n);
      }
      if (payload_left_ == 0) CompleteFrontLocked(Status::Ok(), out);
      continue;
    }
    ResponseHeader h;
    ParseResult r = DecodeResponse(rbuf_ + rstart_, rend_ - rstart_, config_.max_frame, &h);
    if (r == ParseResult::kNeedMore) {
      if (rstart_ == rend_) rstart_ = rend_ = 0;
      if (sizeof(rbuf_) - rend_ < kResponseHeaderSize) {
        memmove(rbuf_, rbuf_ + rstart_, rend_ - rstart_);
        rend_ -= rstart_;
        rstart_ = 0;
      }
      // Before a large READ payload, take just the header: the payload then lands straight in (and aligned
      // to) the caller's memory instead of partly through this buffer.
      size_t want = sizeof(rbuf_) - rend_;
      if (send_index_ > 0 && pending_.front().slice->opcode == OpCode::kRead &&
          pending_.front().slice->length >= sizeof(rbuf_)) {
        want = std::min(want, kResponseHeaderSize - (rend_ - rstart_));
      }
      ssize_t n = RecvLocked(reinterpret_cast<char*>(rbuf_) + rend_, want, out);
      if (n <= 0) return;
      rend_ += static_cast<size_t>(n);
      continue;
    }
    if (r != ParseResult::kOk) {
      CloseLocked(Status(ErrorCode::kSocket, std::string("malformed response on ") + path_->label + ": " +
                                                 ParseResultName(r)),
                  true, out);
      return;
    }
    rstart_ += kResponseHeaderSize;
    if (send_index_ == 0 || pending_.front().seq != h.seq) {
      CloseLocked(Status(ErrorCode::kSocket, "unexpected response (seq " + std::to_string(h.seq) + ") on " +
                                                 path_->label),
                  true, out);
      return;
    }
    Slice* s = pending_.front().slice;
    if (h.status != FrameStatus::kOk) {
      if (h.length != 0) {
        CloseLocked(Status(ErrorCode::kSocket, "malformed rejection on " + path_->label), true, out);
        return;
      }
      CompleteFrontLocked(
          h.status == FrameStatus::kDeviceCopyFailed
              ? Status(ErrorCode::kMemory, "target " + path_->label + " could not copy " + Range(s->remote, s->length) +
                                               " of its device memory through its staging (device copy failed)")
              : Status(ErrorCode::kRemoteRejected, "target " + path_->label + " rejected " +
                                                       Range(s->remote, s->length) +
                                                       ": not inside memory it registered for remote access"),
          out);
      continue;
    }
    uint64_t expected = s->opcode == OpCode::kRead ? s->length : 0;
    if (h.length != expected) {
      CloseLocked(Status(ErrorCode::kSocket, "response length mismatch on " + path_->label), true, out);
      return;
    }
    if (expected > 0) {
      payload_left_ = expected;
      continue;
    }
    CompleteFrontLocked(Status::Ok(), out);
  }
}

void ClientLane::CheckTimeout(std::chrono::steady_clock::time_point now) {
  Outcome out;
  {
    std::lock_guard lock(mu_);
    if (fd_ < 0 || pending_.empty() || driving_) return;  // a driving caller checks for itself
    if (now - last_progress_ < config_.stall_timeout) return;
    CloseLocked(Status(ErrorCode::kTimeout, path_->label + " moved no data for " +
                                                std::to_string(config_.stall_timeout.count()) +
                                                " ms (MC_TCP_STALL_TIMEOUT_MS)"),
                true, &out);
  }
  Settle(out);
}

void ClientLane::Abort(const Status& why, bool reroute) {
  Outcome out;
  {
    std::lock_guard lock(mu_);
    if (!reroute) {
      shut_ = true;
      shut_why_ = why;
    }
    CloseLocked(why, reroute, &out);
  }
  Settle(out);
}

void ClientLane::CloseLocked(const Status& why, bool reroute, Outcome* out) {
  if (fd_ >= 0) {
    loop_->Remove(fd_);
    if (!pending_.empty()) {
      // Reset rather than close while slices are unanswered: the target drops what it has not read yet
      // instead of applying a WRITE whose slice is retried on another path or has failed (either way the
      // caller may reuse its buffer, and the target's range may be handed to someone else: stale bytes must
      // not land after that). A WRITE the target already read is applied; nothing here can stop that.
      linger reset{1, 0};
      setsockopt(fd_, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    }
    close(fd_);
    fd_ = -1;
    connected_.store(false, std::memory_order_relaxed);
    if (!pending_.empty()) MC_LOG(kWarning) << "lane closed: " << why.message();
  }
  for (auto& p : pending_) {
    if (reroute) out->failed.push_back(p.slice);
    else out->done.emplace_back(p.slice, why);
  }
  if (!pending_.empty()) path_->errors.fetch_add(pending_.size(), std::memory_order_relaxed);
  if (reroute && !pending_.empty()) out->why = why;
  pending_.clear();
  send_index_ = 0;
  payload_left_ = 0;
  rstart_ = rend_ = 0;
  want_write_ = false;
  outstanding_bytes_.store(0, std::memory_order_relaxed);
}

}  // namespace mooncake::te::tcp
