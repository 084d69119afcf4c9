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
  if (stager_) max_staged_ = std::max(stager_->chunk_bytes(), stager_->role_bytes() / 4);
  peer_ = net::PeerName(fd);
  Progress();
  frame_start_ = std::chrono::steady_clock::now();
}

bool ServerConnection::Stalled(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds timeout) const {
  bool mid_frame = rend_ > rstart_ || write_left_ > 0;
  bool busy = mid_frame || !out_.empty() || read_left_ > 0;
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
  write_chunk_.reset();
  read_pin_.reset();
  read_left_ = 0;
  staged_bytes_ = 0;
  if (on_close_) on_close_(this);
}

bool ServerConnection::Backlogged() const {
  if (out_.size() >= kMaxQueuedResponses || waiting_chunk_) return true;
  // This connection's share of the staging applies wherever it would take a chunk: between frames, for the next
  // chunk of a staged WRITE or READ (a WRITE payload into host memory always continues).
  const bool wants_chunk = write_left_ == 0 || (write_staged_ && write_pin_ && !write_chunk_);
  return wants_chunk && staged_bytes_ >= max_staged_ && max_staged_ > 0;
}

void ServerConnection::Pump() {
  // Requests may sit in rbuf_ while reading paused on a full answer queue: keep going until the socket
  // is drained or answers are backed up behind a full send buffer (then EPOLLOUT resumes us), behind device
  // copies (their continuations resume us) or behind the pool (a released chunk resumes us).
  do {
    if (!ReadRequests() || !Flush()) return;
  } while (paused_ && !waiting_chunk_ && (out_.empty() || !Backlogged()));
}

void ServerConnection::OnEvents(uint32_t events) {
  if (fd_ < 0) return;
  Pump();
  if (fd_ >= 0 && (events & (EPOLLERR | EPOLLHUP)) && !(events & EPOLLIN)) Close("");
}

std::function<void(const Status&)> ServerConnection::StagedDone(uint64_t id, size_t bytes, StagingRef keep,
                                                                RegionPin pin) {
  std::weak_ptr<Anchor> anchor = anchor_;
  IoLoop* loop = loop_;
  // `keep` and `pin` hold the staging chunk and the device memory until the copy has finished.
  return [anchor, loop, id, bytes, keep = std::move(keep), pin = std::move(pin)](const Status& st) {
    loop->Post([anchor, id, bytes, st] {
      if (auto a = anchor.lock()) a->conn->OnStaged(id, bytes, st);
    });
  };
}

StatusOr<StagingRef> ServerConnection::TakeChunk(const MemoryKind& kind) {
  std::weak_ptr<Anchor> anchor = anchor_;
  IoLoop* loop = loop_;
  auto got = stager_->TryAcquireOrNotify(kind, StagingRole::kTarget, [anchor, loop] {
    loop->Post([anchor] {
      if (auto a = anchor.lock()) {
        a->conn->waiting_chunk_ = false;
        if (a->conn->fd_ >= 0) a->conn->Pump();
      }
    });
  });
  if (got.ok() && !*got) waiting_chunk_ = true;
  return got;
}

ServerConnection::Out* ServerConnection::FindStaged(uint64_t id) {
  for (Out& o : out_) {
    if (o.stage_id == id) return &o;
  }
  return nullptr;
}

void ServerConnection::SetStatus(Out& o, FrameStatus status) {
  ResponseHeader h;
  h.status = status;
  h.seq = o.seq;
  h.length = 0;
  EncodeResponse(h, o.header);
  o.header_len = kResponseHeaderSize;
  o.payload = nullptr;
  o.payload_len = 0;
  o.pin.reset();
  o.staging.reset();
}

void ServerConnection::MaybeReady(Out& o) {
  if (!o.recv_done || o.pending_copies > 0) return;
  o.ready = true;
  o.stage_id = 0;
  if (o.final_status != FrameStatus::kOk) SetStatus(o, o.final_status);
}

void ServerConnection::OnStaged(uint64_t id, size_t bytes, const Status& st) {
  if (fd_ < 0) return;
  Out* o = FindStaged(id);
  if (o != nullptr && o->write_ack) {
    staged_bytes_ -= bytes;
    --o->pending_copies;
    if (!st.ok() && o->final_status == FrameStatus::kOk) {
      MC_LOG(kWarning) << "WRITE from " << peer_ << " into device memory: " << st.message();
      o->final_status = FrameStatus::kDeviceCopyFailed;
    }
    MaybeReady(*o);
  } else if (o != nullptr && st.ok()) {
    o->ready = true;
    o->stage_id = 0;
  } else if (o != nullptr) {
    // A chunk of a staged READ could not be read from the device: answer the READ with the failure if nothing of
    // it went out yet (its later chunks are dropped), else the stream cannot be repaired.
    MC_LOG(kWarning) << "READ from " << peer_ << " of device memory: " << st.message();
    const uint64_t op = o->op_id;
    Out* first = nullptr;
    for (Out& x : out_) {
      if (x.op_id == op && x.header_len > 0) first = &x;
    }
    if (first == nullptr || first->sent > 0) {
      Close("a device copy for a READ failed after its answer began: " + st.message());
      return;
    }
    staged_bytes_ -= first->staged_len;
    first->staged_len = 0;
    first->ready = true;
    first->stage_id = 0;
    first->op_id = 0;
    SetStatus(*first, FrameStatus::kDeviceCopyFailed);
    for (auto it = out_.begin(); it != out_.end();) {
      if (it->op_id == op) {
        staged_bytes_ -= it->staged_len;
        it = out_.erase(it);
      } else {
        ++it;
      }
    }
    if (read_op_id_ == op && read_left_ > 0) {  // still queuing its chunks: stop
      read_left_ = 0;
      read_pin_.reset();
    }
  }
  Pump();
}

void ServerConnection::CopyWriteChunk() {
  StagingRef chunk = std::move(write_chunk_);
  const size_t fill = write_chunk_fill_;
  write_chunk_fill_ = 0;
  Out* ack = FindStaged(write_stage_id_);
  if (ack == nullptr) return;  // cannot happen: the acknowledgement waits for this WRITE
  ++ack->pending_copies;
  char* data = chunk->data;
  const size_t held = chunk->capacity;
  stager_->Copy(write_kind_, reinterpret_cast<void*>(write_chunk_dev_), data, fill,
                StagedDone(write_stage_id_, held, std::move(chunk), write_pin_));
}

void ServerConnection::DiscardStagedWrite(FrameStatus why) {
  write_pin_.reset();
  if (write_chunk_) {
    staged_bytes_ -= write_chunk_->capacity;
    write_chunk_.reset();
    write_chunk_fill_ = 0;
  }
  if (Out* ack = FindStaged(write_stage_id_); ack != nullptr && ack->final_status == FrameStatus::kOk) {
    ack->final_status = why;
  }
}

void ServerConnection::FinishStagedWrite() {
  Out* ack = FindStaged(write_stage_id_);
  write_staged_ = false;
  write_pin_.reset();
  if (ack == nullptr) return;
  ack->recv_done = true;
  MaybeReady(*ack);
}

bool ServerConnection::StageReadChunk() {
  if (memory_->generation() != read_piece_generation_) {
    read_piece_generation_ = memory_->generation();
    if (memory_->Find(read_next_addr_, read_left_, /*remote=*/true) != read_pin_) {
      read_left_ = 0;
      read_pin_.reset();
      if (!read_first_) {
        Close("the source of a READ was unregistered before it was sent");
        return false;
      }
      QueueResponse(FrameStatus::kAddressRejected, read_seq_, nullptr, 0, nullptr);
      return true;
    }
  }
  auto got = TakeChunk(read_pin_->kind);
  if (!got.ok()) {
    MC_LOG(kWarning) << "READ from " << peer_ << " of device memory: " << got.status().message();
    read_left_ = 0;
    read_pin_.reset();
    if (!read_first_) {
      Close("no staging for the rest of a READ: " + got.status().message());
      return false;
    }
    QueueResponse(FrameStatus::kDeviceCopyFailed, read_seq_, nullptr, 0, nullptr);
    return true;
  }
  if (!*got) {  // no free chunk: reading waits for one
    paused_ = true;
    return false;
  }
  StagingRef chunk = std::move(got.value());
  const size_t len = std::min(read_left_, chunk->capacity);
  const uint64_t id = next_stage_id_++;
  Out o;
  if (read_first_) {
    ResponseHeader h;
    h.status = FrameStatus::kOk;
    h.seq = read_seq_;
    h.length = read_total_;
    EncodeResponse(h, o.header);
  } else {
    o.header_len = 0;
  }
  o.seq = read_seq_;
  o.payload = chunk->data;
  o.payload_len = len;
  o.addr = read_next_addr_;
  o.pin = read_pin_;
  o.ready = false;
  o.stage_id = id;
  o.op_id = read_op_id_;
  o.staged_len = chunk->capacity;
  o.staging = chunk;
  staged_bytes_ += chunk->capacity;
  out_.push_back(std::move(o));
  const uint64_t from = read_next_addr_;
  read_next_addr_ += len;
  read_left_ -= len;
  read_first_ = false;
  RegionPin pin = read_pin_;
  if (read_left_ == 0) read_pin_.reset();
  char* data = chunk->data;
  stager_->Copy(pin->kind, data, reinterpret_cast<const void*>(from), len, StagedDone(id, 0, std::move(chunk), pin));
  return fd_ >= 0;
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
    if (read_left_ > 0) {  // the chunks of a staged READ are queued before the next request is read
      if (!StageReadChunk()) {
        if (fd_ < 0) return false;
        paused_ = true;
        break;
      }
      continue;
    }
    if (write_left_ > 0) {
      bool accepting = write_staged_ ? write_pin_ != nullptr : write_dst_ != nullptr;
      if (accepting && memory_->generation() != write_generation_) {
        write_generation_ = memory_->generation();
        if (memory_->Find(write_target_, write_left_, /*remote=*/true) != write_pin_) {
          MC_LOG(kWarning) << "WRITE from " << peer_ << ": its destination was unregistered; discarding the rest";
          if (write_staged_) {
            DiscardStagedWrite(FrameStatus::kAddressRejected);
          } else {
            write_dst_ = nullptr;  // the rest is discarded and the WRITE rejected
            write_pin_.reset();
          }
          accepting = false;
        }
      }
      char* dst = accepting && !write_staged_ ? write_dst_ : nullptr;
      size_t want = write_left_;
      if (accepting && write_staged_) {
        if (!write_chunk_) {
          auto chunk = TakeChunk(write_kind_);
          if (!chunk.ok()) {
            MC_LOG(kWarning) << "WRITE from " << peer_ << " into device memory: " << chunk.status().message();
            DiscardStagedWrite(FrameStatus::kDeviceCopyFailed);
            accepting = false;
          } else if (!*chunk) {  // no free chunk: reading waits for one (backpressure)
            paused_ = true;
            break;
          } else {
            write_chunk_ = std::move(chunk.value());
            write_chunk_fill_ = 0;
            write_chunk_dev_ = write_target_;
            staged_bytes_ += write_chunk_->capacity;
          }
        }
        if (accepting) {
          dst = write_chunk_->data + write_chunk_fill_;
          want = std::min(write_left_, write_chunk_->capacity - write_chunk_fill_);
        }
      }
      size_t buffered = rend_ - rstart_;
      size_t got = 0;
      if (buffered > 0) {
        got = std::min(buffered, want);
        if (dst) memcpy(dst, rbuf_ + rstart_, got);
        rstart_ += got;
      } else {
        if (!dst) {
          if (!discard_) discard_.reset(new char[kDiscardChunk]);
          dst = discard_.get();
          want = std::min(want, kDiscardChunk);
        }
        ssize_t n = RecvSome(dst, want, "peer closed the connection in the middle of a frame");
        if (n <= 0) return n == 0;
        got = static_cast<size_t>(n);
      }
      if (accepting && !write_staged_) write_dst_ += got;
      if (accepting && write_staged_) write_chunk_fill_ += got;
      write_target_ += got;
      write_left_ -= got;
      if (accepting && write_staged_ && (write_chunk_fill_ == write_chunk_->capacity || write_left_ == 0)) {
        CopyWriteChunk();  // the chunk is full (or the payload ends): to the device, while the next one fills
      }
      if (write_left_ == 0) {
        frame_start_ = std::chrono::steady_clock::now();  // the next frame (maybe buffered already) starts
        write_dst_ = nullptr;
        if (write_staged_) {
          FinishStagedWrite();  // acknowledged once every chunk's device copy finished
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
      write_staged_ = staged;
      write_pin_ = pin;
      write_dst_ = pin && !staged ? reinterpret_cast<char*>(h.addr) : nullptr;
      if (!pin) MC_LOG(kDebug) << "rejected WRITE from " << peer_ << " outside registered memory";
      if (staged) {
        // Answered in request order: the acknowledgement is queued now and sent once the payload is on the device.
        write_kind_ = pin->kind;
        write_stage_id_ = next_stage_id_++;
        QueueResponse(FrameStatus::kOk, h.seq, nullptr, 0, nullptr);
        Out& ack = out_.back();
        ack.ready = false;
        ack.stage_id = write_stage_id_;
        ack.write_ack = true;
        ack.recv_done = false;
      }
      if (h.length == 0) {
        QueueResponse(pin ? FrameStatus::kOk : FrameStatus::kAddressRejected, h.seq, nullptr, 0, nullptr);
        write_pin_.reset();
      }
    } else if (staged) {
      if (out_.empty()) read_generation_ = generation;
      read_seq_ = h.seq;
      read_total_ = read_left_ = h.length;
      read_next_addr_ = h.addr;
      read_op_id_ = next_stage_id_++;
      read_first_ = true;
      read_piece_generation_ = generation;
      read_pin_ = std::move(pin);
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
      if (off < o.header_len) {
        iov[n++] = {o.header + off, o.header_len - off};
        off = o.header_len;
      }
      size_t poff = off - o.header_len;
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
      size_t need = o.header_len + o.payload_len - o.sent;
      size_t take = std::min(need, left);
      o.sent += take;
      left -= take;
      if (o.sent == o.header_len + o.payload_len) {
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
