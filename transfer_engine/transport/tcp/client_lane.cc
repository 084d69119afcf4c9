#include "transfer_engine/transport/tcp/client_lane.h"

#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"

namespace mooncake::te::tcp {
namespace {

constexpr int kMaxIov = 64;


size_t FrameBytes(const Slice* s) {
  return kRequestHeaderSize + (s->opcode == OpCode::kWrite ? s->length : 0);
}

}  // namespace

ClientLane::ClientLane(const EngineConfig& config, IoLoop* loop, PeerEndpoint* peer)
    : config_(config), loop_(loop), peer_(peer) {}

ClientLane::~ClientLane() {
  if (fd_ >= 0) {
    loop_->Remove(fd_);
    close(fd_);
  }
}

void ClientLane::Finish(Completions& done) {
  for (auto& [slice, status] : done) slice->Complete(status);
  done.clear();
}

Status ClientLane::ConnectLocked() {
  {
    std::lock_guard lock(peer_->mu);
    if (std::chrono::steady_clock::now() < peer_->down_until) {
      return Status(ErrorCode::kPeerUnreachable,
                    "peer " + peer_->label + " is unreachable (" + peer_->last_error + "); not retrying yet");
    }
  }
  auto fd = net::Connect(peer_->host, peer_->port, config_.handshake_connect_timeout);
  if (!fd.ok()) {
    std::lock_guard lock(peer_->mu);
    peer_->down_until = std::chrono::steady_clock::now() + config_.peer_retry_backoff;
    peer_->last_error = fd.status().message();
    return Status(ErrorCode::kPeerUnreachable, "peer " + peer_->label + ": " + fd.status().message());
  }
  MC_RETURN_IF_ERROR(net::SetNonBlocking(*fd, true));
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
  MC_LOG(kDebug) << "connected to " << peer_->label;
  return Status::Ok();
}

bool ClientLane::QueueLocked(const std::vector<Slice*>& slices, Completions* done) {
  if (fd_ < 0) {
    Status st = ConnectLocked();
    if (!st.ok()) {
      for (Slice* s : slices) done->emplace_back(s, st);
      peer_->errors.fetch_add(slices.size(), std::memory_order_relaxed);
      return false;
    }
  }
  auto now = std::chrono::steady_clock::now();
  for (Slice* s : slices) {
    Pending p;
    p.slice = s;
    p.seq = next_seq_++;
    p.sent = 0;
    p.queued = now;
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
  Completions done;
  {
    std::lock_guard lock(mu_);
    // Write now if the socket was idle; otherwise the loop (or a driving caller) is already flushing.
    if (QueueLocked(slices, &done) && !want_write_) FlushLocked(&done);
  }
  Finish(done);
}

bool ClientLane::TryDrive(const std::vector<Slice*>& slices) {
  Completions done;
  std::unique_lock lock(mu_);
  if (driving_ || !pending_.empty()) return false;
  if (!QueueLocked(slices, &done)) {
    lock.unlock();
    Finish(done);
    return true;
  }
  const uint64_t last_seq = next_seq_ - 1;
  driving_ = true;
  Status st = loop_->Modify(fd_, 0, this);  // the loop thread keeps off while we drive
  if (!st.ok()) MC_LOG(kWarning) << "lane to " << peer_->label << ": " << st.message();
  FlushLocked(&done);
  // Until our answers (the first in line: the lane was idle) are in. Slices other threads add meanwhile are
  // moved along too; the loop thread takes over whatever is left.
  while (fd_ >= 0 && !pending_.empty() && pending_.front().seq <= last_seq) {
    pollfd p{fd_, static_cast<short>(POLLIN | (send_index_ < pending_.size() ? POLLOUT : 0)), 0};
    lock.unlock();
    int r = poll(&p, 1, 100);  // wakes up now and then so timeouts and shutdown are seen
    lock.lock();
    if (fd_ < 0 || r < 0) break;
    if (r == 0) {
      if (std::chrono::steady_clock::now() - pending_.front().queued >= config_.transfer_timeout) {
        CloseLocked(Status(ErrorCode::kTimeout, "no response from " + peer_->label + " within " +
                                                    std::to_string(config_.transfer_timeout.count()) +
                                                    " s (MC_TRANSFER_TIMEOUT)"),
                    &done);
      }
      continue;
    }
    if (p.revents & (POLLIN | POLLERR | POLLHUP)) ReadLocked(&done);
    if (fd_ >= 0 && (p.revents & POLLOUT)) FlushLocked(&done);
  }
  driving_ = false;
  if (fd_ >= 0) {
    want_write_ = send_index_ < pending_.size();
    st = loop_->Modify(fd_, EPOLLIN | (want_write_ ? EPOLLOUT : 0), this);
    if (!st.ok()) MC_LOG(kWarning) << "lane to " << peer_->label << ": " << st.message();
  }
  lock.unlock();
  Finish(done);
  return true;
}

void ClientLane::FlushLocked(Completions* done) {
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
        if (poff < p.slice->length) iov[n++] = {p.slice->local + poff, p.slice->length - poff};
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
      CloseLocked(Status(ErrorCode::kSocket, "send to " + peer_->label + ": " + strerror(errno)), done);
      return;
    }
    size_t left = static_cast<size_t>(w);
    while (left > 0 && send_index_ < pending_.size()) {
      Pending& p = pending_[send_index_];
      size_t need = FrameBytes(p.slice) - p.sent;
      size_t take = std::min(need, left);
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
  if (!st.ok()) MC_LOG(kWarning) << "lane to " << peer_->label << ": " << st.ToString();
}

void ClientLane::OnEvents(uint32_t events) {
  Completions done;
  {
    std::lock_guard lock(mu_);
    if (fd_ < 0 || driving_) return;  // stale event, or a caller drives this socket right now
    if (events & EPOLLIN) ReadLocked(&done);
    if (fd_ >= 0 && (events & EPOLLOUT)) FlushLocked(&done);
    if (fd_ >= 0 && (events & (EPOLLERR | EPOLLHUP)) && !(events & EPOLLIN)) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      CloseLocked(Status(ErrorCode::kSocket, "connection to " + peer_->label + " failed: " +
                                                 (err ? strerror(err) : "hang-up")),
                  &done);
    }
  }
  Finish(done);
}

ssize_t ClientLane::RecvLocked(char* dst, size_t len, Completions* done) {
  while (true) {
    ssize_t n = recv(fd_, dst, len, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
      CloseLocked(Status(ErrorCode::kSocket, "connection closed by " + peer_->label), done);
      return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno != EINTR) {
      CloseLocked(Status(ErrorCode::kSocket, "recv from " + peer_->label + ": " + strerror(errno)), done);
      return -1;
    }
  }
}

void ClientLane::ReadLocked(Completions* done) {
  while (fd_ >= 0) {
    if (payload_left_ > 0) {
      Slice* s = pending_.front().slice;
      char* dst = s->local + (s->length - payload_left_);
      size_t buffered = rend_ - rstart_;
      if (buffered > 0) {
        size_t take = std::min(buffered, payload_left_);
        memcpy(dst, rbuf_ + rstart_, take);
        rstart_ += take;
        payload_left_ -= take;
      } else {
        ssize_t n = RecvLocked(dst, payload_left_, done);
        if (n <= 0) return;
        payload_left_ -= static_cast<size_t>(n);
      }
      if (payload_left_ == 0) {
        Pending p = pending_.front();
        pending_.pop_front();
        --send_index_;
        outstanding_bytes_.fetch_sub(p.slice->length, std::memory_order_relaxed);
        peer_->bytes.fetch_add(p.slice->length, std::memory_order_relaxed);
        peer_->slices.fetch_add(1, std::memory_order_relaxed);
        done->emplace_back(p.slice, Status::Ok());
      }
      continue;
    }
    ResponseHeader h;
    ParseResult r = DecodeResponse(rbuf_ + rstart_, rend_ - rstart_, config_.tcp_max_frame, &h);
    if (r == ParseResult::kNeedMore) {
      if (rstart_ == rend_) rstart_ = rend_ = 0;
      if (sizeof(rbuf_) - rend_ < kResponseHeaderSize) {
        memmove(rbuf_, rbuf_ + rstart_, rend_ - rstart_);
        rend_ -= rstart_;
        rstart_ = 0;
      }
      ssize_t n = RecvLocked(reinterpret_cast<char*>(rbuf_) + rend_, sizeof(rbuf_) - rend_, done);
      if (n <= 0) return;
      rend_ += static_cast<size_t>(n);
      continue;
    }
    if (r != ParseResult::kOk) {
      CloseLocked(Status(ErrorCode::kSocket, std::string("malformed response from ") + peer_->label + ": " +
                                                 ParseResultName(r)),
                  done);
      return;
    }
    rstart_ += kResponseHeaderSize;
    if (send_index_ == 0 || pending_.front().seq != h.seq) {
      CloseLocked(Status(ErrorCode::kSocket, "unexpected response (seq " + std::to_string(h.seq) + ") from " +
                                                 peer_->label),
                  done);
      return;
    }
    Slice* s = pending_.front().slice;
    if (h.status == FrameStatus::kAddressRejected) {
      if (h.length != 0) {
        CloseLocked(Status(ErrorCode::kSocket, "malformed rejection from " + peer_->label), done);
        return;
      }
      pending_.pop_front();
      --send_index_;
      outstanding_bytes_.fetch_sub(s->length, std::memory_order_relaxed);
      peer_->errors.fetch_add(1, std::memory_order_relaxed);
      done->emplace_back(s, Status(ErrorCode::kRemoteRejected,
                                   "target " + peer_->label + " rejected [" + Hex(s->remote) + ", +" +
                                       std::to_string(s->length) +
                                       "): not inside memory it registered for remote access"));
      continue;
    }
    uint64_t expected = s->opcode == OpCode::kRead ? s->length : 0;
    if (h.length != expected) {
      CloseLocked(Status(ErrorCode::kSocket, "response length mismatch from " + peer_->label), done);
      return;
    }
    if (expected > 0) {
      payload_left_ = expected;
      continue;
    }
    pending_.pop_front();
    --send_index_;
    outstanding_bytes_.fetch_sub(s->length, std::memory_order_relaxed);
    peer_->bytes.fetch_add(s->length, std::memory_order_relaxed);
    peer_->slices.fetch_add(1, std::memory_order_relaxed);
    done->emplace_back(s, Status::Ok());
  }
}

void ClientLane::CheckTimeout(std::chrono::steady_clock::time_point now) {
  Completions done;
  {
    std::lock_guard lock(mu_);
    if (fd_ < 0 || pending_.empty()) return;
    if (now - pending_.front().queued < config_.transfer_timeout) return;
    std::lock_guard plock(peer_->mu);
    peer_->down_until = now + config_.peer_retry_backoff;
    peer_->last_error = "no response within " + std::to_string(config_.transfer_timeout.count()) + " s";
  }
  {
    std::lock_guard lock(mu_);
    CloseLocked(Status(ErrorCode::kTimeout, "no response from " + peer_->label + " within " +
                                                std::to_string(config_.transfer_timeout.count()) +
                                                " s (MC_TRANSFER_TIMEOUT)"),
                &done);
  }
  Finish(done);
}

void ClientLane::Shutdown(const Status& why) {
  Completions done;
  {
    std::lock_guard lock(mu_);
    CloseLocked(why, &done);
  }
  Finish(done);
}

void ClientLane::CloseLocked(const Status& why, Completions* done) {
  if (fd_ >= 0) {
    loop_->Remove(fd_);
    close(fd_);
    fd_ = -1;
    connected_.store(false, std::memory_order_relaxed);
    if (!pending_.empty()) MC_LOG(kWarning) << "lane to " << peer_->label << " closed: " << why.message();
  }
  peer_->errors.fetch_add(pending_.size(), std::memory_order_relaxed);
  for (auto& p : pending_) done->emplace_back(p.slice, why);
  pending_.clear();
  send_index_ = 0;
  payload_left_ = 0;
  rstart_ = rend_ = 0;
  want_write_ = false;
  outstanding_bytes_.store(0, std::memory_order_relaxed);
}

}  // namespace mooncake::te::tcp
