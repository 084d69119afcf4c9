#include "transfer_engine/transport/tcp/server_connection.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"

namespace mooncake::te::tcp {
namespace {
constexpr int kMaxIov = 64;
constexpr size_t kDiscardChunk = 64 << 10;
constexpr size_t kMaxQueuedResponses = 4096;  // stop reading requests while this many answers wait
constexpr size_t kMaxStagedBytes = 64 << 20;  // stop reading requests while this much device memory is staged
}  // namespace

ServerConnection::ServerConnection(int fd, IoLoop* loop, const MemoryRegistry* memory, uint64_t max_frame,
                                   DeviceStager* stager, std::function<void(ServerConnection*)> on_close)
    : fd_(fd),
      loop_(loop),
      memory_(memory),
      max_frame_(max_frame),
      stager_(stager),
      on_close_(std::move(on_close)),
      anchor_(std::make_shared<Anchor>(Anchor{this})) {
  peer_ = net::PeerName(fd);
  Progress();
  frame_start_ = std::chrono::steady_clock::now();
}

bool ServerConnection::Stalled(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds timeout) const {
  bool mid_frame = rend_ > rstart_ || write_left_ > 0;
  bool busy = mid_frame || !out_.empty();
  return fd_ >= 0 && ((busy && now - last_progress() > timeout) || (mid_frame && now - frame_start_ > timeout));
}

ServerConnection::~ServerConnection() {
  if (fd_ >= 0) close(fd_);
}

Status ServerConnection::Register() {
  interest_ = EPOLLIN;
  return loop_->Add(fd_, interest_, this);
}

void ServerConnection::Close(const std::string& why) {
  if (fd_ < 0) return;
  if (!why.empty()) MC_LOG(kWarning) << "closing data connection from " << peer_ << ": " << why;
  loop_->Remove(fd_);
  close(fd_);
  fd_ = -1;
  out_.clear();
  write_pin_.reset();
  write_staging_.reset();
  staged_bytes_ = 0;
  if (on_close_) on_close_(this);
}

bool ServerConnection::Backlogged() const {
  // The staging bound applies between frames only: a WRITE payload being received always continues.
  return out_.size() >= kMaxQueuedResponses || (write_left_ == 0 && staged_bytes_ >= kMaxStagedBytes);
}

void ServerConnection::Pump() {
  // Requests may sit in rbuf_ while reading paused on a full answer queue: keep going until the socket
  // is drained or answers are backed up behind a full send buffer (then EPOLLOUT resumes us) or behind
  // device copies (then their continuations resume us).
  do {
    if (!ReadRequests() || !Flush()) return;
  } while (paused_ && (out_.empty() || !Backlogged()));
}

void ServerConnection::OnEvents(uint32_t events) {
  if (fd_ < 0) return;
  Pump();
  if (fd_ >= 0 && (events & (EPOLLERR | EPOLLHUP)) && !(events & EPOLLIN)) Close("");
}

std::function<void(const Status&)> ServerConnection::StagedDone(uint64_t id, StagingRef keep, RegionPin pin) {
  std::weak_ptr<Anchor> anchor = anchor_;
  IoLoop* loop = loop_;
  // `keep` and `pin` hold the staging buffer and the device memory until the copy has finished.
  return [anchor, loop, id, keep = std::move(keep), pin = std::move(pin)](const Status& st) {
    loop->Post([anchor, id, st] {
      if (auto a = anchor.lock()) a->conn->OnStaged(id, st);
    });
  };
}

void ServerConnection::OnStaged(uint64_t id, const Status& st) {
  if (fd_ < 0) return;
  for (Out& o : out_) {
    if (o.stage_id != id) continue;
    o.ready = true;
    o.stage_id = 0;
    if (o.payload_len == 0) {  // a WRITE's acknowledgement: its staging is done with
      staged_bytes_ -= o.staged_len;
      o.staged_len = 0;
    }
    if (!st.ok()) {
      MC_LOG(kWarning) << "data connection from " << peer_ << ": " << st.message() << "; the request is refused";
      ResponseHeader h;
      h.status = FrameStatus::kAddressRejected;
      h.seq = o.seq;
      h.length = 0;
      EncodeResponse(h, o.header);
      staged_bytes_ -= o.staged_len;
      o.staged_len = 0;
      o.payload = nullptr;
      o.payload_len = 0;
      o.pin.reset();
      o.staging.reset();
    }
    break;
  }
  Pump();
}

void ServerConnection::FinishStagedWrite() {
  StagingRef staging = std::move(write_staging_);
  RegionPin pin = std::move(write_pin_);
  if (pin && memory_->generation() != write_generation_ &&
      memory_->Find(write_addr_, write_len_, /*remote=*/true) != pin) {
    MC_LOG(kWarning) << "WRITE from " << peer_ << ": its destination was unregistered; not copied";
    pin.reset();
  }
  if (!pin) {
    staged_bytes_ -= write_len_;
    QueueResponse(FrameStatus::kAddressRejected, write_seq_, nullptr, 0, nullptr);
    return;
  }
  const uint64_t id = next_stage_id_++;
  QueueResponse(FrameStatus::kOk, write_seq_, nullptr, 0, nullptr);
  out_.back().ready = false;
  out_.back().stage_id = id;
  out_.back().staged_len = write_len_;
  MemoryKind kind = pin->kind;
  char* data = staging->data;
  stager_->Copy(kind, reinterpret_cast<void*>(write_addr_), data, write_len_,
                StagedDone(id, std::move(staging), std::move(pin)));
}

void ServerConnection::StartStagedRead(uint64_t seq, uint64_t addr, size_t len, RegionPin pin) {
  auto staging = stager_->Acquire(pin->kind, len);
  if (!staging.ok()) {
    MC_LOG(kWarning) << "READ from " << peer_ << " of device memory: " << staging.status().message();
    QueueResponse(FrameStatus::kAddressRejected, seq, nullptr, 0, nullptr);
    return;
  }
  const uint64_t id = next_stage_id_++;
  MemoryKind kind = pin->kind;
  QueueResponse(FrameStatus::kOk, seq, (*staging)->data, len, pin);
  Out& o = out_.back();
  o.addr = addr;
  o.ready = false;
  o.stage_id = id;
  o.staged_len = len;
  o.staging = *staging;
  staged_bytes_ += len;
  stager_->Copy(kind, (*staging)->data, reinterpret_cast<const void*>(addr), len,
                StagedDone(id, *staging, std::move(pin)));
}

void ServerConnection::QueueResponse(FrameStatus status, uint64_t seq, const char* payload, size_t len,
                                     RegionPin pin) {
  Out o;
  ResponseHeader h;
  h.status = status;
  h.seq = seq;
  h.length = len;
  EncodeResponse(h, o.header);
  o.seq = seq;
  o.payload = payload;
  o.payload_len = len;
  o.addr = reinterpret_cast<uint64_t>(payload);
  o.pin = std::move(pin);
  out_.push_back(std::move(o));
}

ssize_t ServerConnection::RecvSome(char* dst, size_t len, const char* eof_why) {
  while (true) {
    ssize_t n = recv(fd_, dst, len, MSG_DONTWAIT);
    if (n > 0) {
      Progress();
      return n;
    }
    if (n == 0) {
      Close(eof_why);
      return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno != EINTR) {
      Close(std::string("recv: ") + strerror(errno));
      return -1;
    }
  }
}

bool ServerConnection::ReadRequests() {
  paused_ = false;
  while (fd_ >= 0) {
    if (Backlogged()) {
      paused_ = true;
      break;
    }
    if (write_left_ > 0) {
      if (write_dst_ && memory_->generation() != write_generation_) {
        write_generation_ = memory_->generation();
        if (memory_->Find(write_target_, write_left_, /*remote=*/true) != write_pin_) {
          MC_LOG(kWarning) << "WRITE from " << peer_ << ": its destination was unregistered; discarding the rest";
          write_dst_ = nullptr;  // the rest is discarded and the WRITE rejected
          write_pin_.reset();
          if (write_staging_) {
            write_staging_.reset();
            staged_bytes_ -= write_len_;
          }
        }
      }
      size_t buffered = rend_ - rstart_;
      size_t got = 0;
      if (buffered > 0) {
        got = std::min(buffered, write_left_);
        if (write_dst_) memcpy(write_dst_, rbuf_ + rstart_, got);
        rstart_ += got;
      } else {
        char* dst = write_dst_;
        size_t want = write_left_;
        if (!dst) {
          if (!discard_) discard_.reset(new char[kDiscardChunk]);
          dst = discard_.get();
          want = std::min(want, kDiscardChunk);
        }
        ssize_t n = RecvSome(dst, want, "peer closed the connection in the middle of a frame");
        if (n <= 0) return n == 0;
        got = static_cast<size_t>(n);
      }
      if (write_dst_) {
        write_dst_ += got;
        write_target_ += got;
      }
      write_left_ -= got;
      if (write_left_ == 0) {
        frame_start_ = std::chrono::steady_clock::now();  // the next frame (maybe buffered already) starts
        write_dst_ = nullptr;
        if (write_staging_) {
          FinishStagedWrite();  // acknowledged once the device copy finished
          continue;
        }
        // The payload is in place: only now acknowledge it.
        QueueResponse(write_pin_ ? FrameStatus::kOk : FrameStatus::kAddressRejected, write_seq_, nullptr, 0,
                      nullptr);
        write_pin_.reset();
      }
      continue;
    }
    RequestHeader h;
    ParseResult r = DecodeRequest(rbuf_ + rstart_, rend_ - rstart_, max_frame_, &h);
    if (r == ParseResult::kNeedMore) {
      if (rstart_ == rend_) rstart_ = rend_ = 0;
      if (rstart_ == rend_) frame_start_ = std::chrono::steady_clock::now();  // a new frame starts with what comes
      if (sizeof(rbuf_) - rend_ < kRequestHeaderSize) {
        memmove(rbuf_, rbuf_ + rstart_, rend_ - rstart_);
        rend_ -= rstart_;
        rstart_ = 0;
      }
      ssize_t n = RecvSome(reinterpret_cast<char*>(rbuf_) + rend_, sizeof(rbuf_) - rend_,
                           rend_ > rstart_ ? "peer closed the connection in the middle of a frame header" : "");
      if (n <= 0) return n == 0;
      rend_ += static_cast<size_t>(n);
      continue;
    }
    if (r != ParseResult::kOk) {
      Close(std::string("malformed request frame: ") + ParseResultName(r));
      return false;
    }
    rstart_ += kRequestHeaderSize;
    if (h.op != FrameOp::kWrite || h.length == 0) frame_start_ = std::chrono::steady_clock::now();  // complete
    const uint64_t generation = memory_->generation();  // read before the lookup: a later unregistration changes it
    RegionPin pin = memory_->Find(h.addr, h.length, /*remote=*/true);
    // Only memory this transport took part in registering: host memory directly, device memory through staging.
    if (pin && (pin->declined_by("tcp") || (pin->kind.type != MemoryType::kHost && !pin->kind.is_device()) ||
                (pin->kind.is_device() && stager_ == nullptr))) {
      pin.reset();
    }
    const bool staged = pin && pin->kind.is_device() && h.length > 0;
    if (h.op == FrameOp::kWrite) {
      write_seq_ = h.seq;
      write_generation_ = generation;
      write_left_ = h.length;
      write_addr_ = write_target_ = h.addr;
      write_len_ = h.length;
      if (staged) {
        auto staging = stager_->Acquire(pin->kind, h.length);
        if (staging.ok()) {
          write_staging_ = std::move(staging.value());
          staged_bytes_ += h.length;
        } else {
          MC_LOG(kWarning) << "WRITE from " << peer_ << " into device memory: " << staging.status().message();
          pin.reset();
        }
      }
      write_pin_ = pin;
      write_dst_ = !pin ? nullptr : staged ? write_staging_->data : reinterpret_cast<char*>(h.addr);
      if (!pin) MC_LOG(kDebug) << "rejected WRITE from " << peer_ << " outside registered memory";
      if (h.length == 0) {
        QueueResponse(pin ? FrameStatus::kOk : FrameStatus::kAddressRejected, h.seq, nullptr, 0, nullptr);
        write_pin_.reset();
      }
    } else if (staged) {
      if (out_.empty()) read_generation_ = generation;
      StartStagedRead(h.seq, h.addr, h.length, std::move(pin));
    } else if (pin) {
      if (out_.empty()) read_generation_ = generation;
      QueueResponse(FrameStatus::kOk, h.seq, reinterpret_cast<const char*>(h.addr), h.length, std::move(pin));
    } else {
      MC_LOG(kDebug) << "rejected READ from " << peer_ << " outside registered memory";
      QueueResponse(FrameStatus::kAddressRejected, h.seq, nullptr, 0, nullptr);
    }
  }
  return fd_ >= 0;
}

bool ServerConnection::Flush() {
  if (!out_.empty() && memory_->generation() != read_generation_) {
    read_generation_ = memory_->generation();
    for (const Out& o : out_) {
      if (!o.pin || o.payload_len == 0) continue;
      if (memory_->Find(o.addr, o.payload_len, /*remote=*/true) != o.pin) {
        Close("the source of a READ was unregistered before it was sent");
        return false;
      }
    }
  }
  while (!out_.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (size_t i = 0; i < out_.size() && n + 2 <= kMaxIov && out_[i].ready; ++i) {
      Out& o = out_[i];
      size_t off = o.sent;
      if (off < kResponseHeaderSize) {
        iov[n++] = {o.header + off, kResponseHeaderSize - off};
        off = kResponseHeaderSize;
      }
      size_t poff = off - kResponseHeaderSize;
      if (poff < o.payload_len) iov[n++] = {const_cast<char*>(o.payload) + poff, o.payload_len - poff};
    }
    if (n == 0) break;  // the answer in front waits for its device copy
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Close(std::string("send: ") + strerror(errno));
      return false;
    }
    if (w > 0) Progress();
    size_t left = static_cast<size_t>(w);
    while (left > 0 && !out_.empty()) {
      Out& o = out_.front();
      size_t need = kResponseHeaderSize + o.payload_len - o.sent;
      size_t take = std::min(need, left);
      o.sent += take;
      left -= take;
      if (o.sent == kResponseHeaderSize + o.payload_len) {
        staged_bytes_ -= o.staged_len;
        out_.pop_front();
      }
    }
  }
  // Writable interest only for an answer that can go out now (not one waiting for its device copy).
  bool want_write = !out_.empty() && out_.front().ready;
  // While answers are backed up, stop reading new requests (the client pipelines; it waits). Re-armed on
  // every change, not only of want_write: a full queue must drop EPOLLIN or unread requests wake us forever.
  uint32_t ev = (want_write ? EPOLLOUT : 0) | (Backlogged() ? 0 : EPOLLIN);
  if (ev != interest_) {
    interest_ = ev;
    want_write_ = want_write;
    Status st = loop_->Modify(fd_, ev, this);
    if (!st.ok()) MC_LOG(kWarning) << "data connection from " << peer_ << ": " << st.message();
  }
  return true;
}

}  // namespace mooncake::te::tcp
