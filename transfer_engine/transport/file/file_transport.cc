#include "transfer_engine/transport/file/file_transport.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "transfer_engine/common/log.h"
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/transport/file/uring.h"

namespace mooncake::te::file {
namespace {

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

// Errors that may mean the descriptor is stale (the segment was republished with other files).
SliceRetry RetryFor(const Status& st) {
  return st.code() == ErrorCode::kRemoteRejected || st.code() == ErrorCode::kNotFound ? SliceRetry::kRefreshPeer
                                                                                      : SliceRetry::kFinal;
}

}  // namespace

TransportProbe ProbeFileTransport() {
  Status st = ProbeIoUring();
  if (st.ok()) return TransportProbe{};
  return TransportProbe{false, "io_uring unavailable: " + st.message()};
}

std::string ProbeGds(PlatformRegistry* platforms) {
  auto cuda = platforms ? platforms->ForType(MemoryType::kCuda) : nullptr;
  if (!cuda) {
    return "unusable: no usable CUDA platform (GPU memory is declined; host memory uses io_uring)";
  }
  void* h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return std::string("unusable: ") + (e ? e : "libcufile.so.0 does not load");
  }
  dlclose(h);
  return "unusable: libcufile.so.0 loads, but this transport does not drive cuFile (GPU memory is declined)";
}

FileTransport::FileTransport() = default;

FileTransport::~FileTransport() { Stop(); }

TransportCapabilities FileTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = true;  // wherever the segment's files are visible
  c.same_host = true;
  c.memory = {{MemoryType::kHost, MemoryType::kFile}};
  c.addressing = AddressMode::kOffset;
  return c;
}

Status FileTransport::Configure(const TransportOptions& options) {
  config_ = FileConfig::From(options);
  allowed_real_.clear();
  for (const auto& d : config_.allowed_dirs) {
    std::string r = RealPath(d);
    if (r.empty()) return InvalidArgument("file.allowed_dirs: '" + d + "' does not exist");
    allowed_real_.push_back(r == "/" ? r : r + "/");
  }
  return Status::Ok();
}

Status FileTransport::Start(const TransportContext& ctx) {
  local_names_.clear();
  if (!config_.local_name.empty()) local_names_.push_back(config_.local_name);
  if (!ctx.local_segment_name.empty()) {
    local_names_.push_back(ctx.local_segment_name);
    auto colon = ctx.local_segment_name.rfind(':');
    if (colon != std::string::npos) local_names_.push_back(ctx.local_segment_name.substr(0, colon));
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0 && host[0]) local_names_.push_back(host);
  gds_ = ProbeGds(ctx.platforms);
  queue_ = std::make_unique<IoQueue>(config_.queue_depth);
  MC_RETURN_IF_ERROR(queue_->Init());
  running_ = true;
  IoQueue* q = queue_.get();
  worker_ = std::thread([q] { q->Run(); });
  return Status::Ok();
}

void FileTransport::Stop() {
  running_ = false;  // later slices fail at once; the callers' pooled rings live until destruction
  if (queue_) queue_->Stop();
  if (worker_.joinable()) worker_.join();
}

StatusOr<RegionRegistration> FileTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  if (region.kind.type != MemoryType::kHost) {
    r.declined = true;
    r.why_declined = "the file transport moves host memory only (GDS " + gds_ + ")";
  }
  return r;
}

void FileTransport::Describe(nlohmann::json& /*descriptor*/) const {}

Status FileTransport::CheckAllowed(const std::string& path) const {
  // Paths come from descriptors other engines published: none is opened unless a directory was allowed.
  if (allowed_real_.empty()) {
    return Status(ErrorCode::kRemoteRejected, "file '" + path + "' is not opened: no directory is allowed (set "
                                              "file.allowed_dirs / MC_FILE_ALLOWED_DIRS to the directories of "
                                              "the file segments this host may read and write)");
  }
  std::string real = RealPath(path);
  if (real.empty()) return Status(ErrorCode::kNotFound, "file '" + path + "' does not exist here");
  for (const auto& dir : allowed_real_) {
    if (real.compare(0, dir.size(), dir) == 0) return Status::Ok();
  }
  return Status(ErrorCode::kRemoteRejected,
                "file '" + path + "' is outside the allowed directories (file.allowed_dirs / MC_FILE_ALLOWED_DIRS)");
}

bool FileTransport::CanReach(const SegmentDescriptor& peer) const {
  for (const auto& b : peer.buffers) {
    if (!IsFileBuffer(b)) continue;
    auto fb = ParseFileBuffer(b);
    if (!fb.ok()) continue;
    std::string path = LocalPath(*fb, local_names_);
    if (IsOpen(path) || (access(path.c_str(), F_OK) == 0 && CheckAllowed(path).ok())) return true;
  }
  return false;
}

FileTransport::SegmentCounters* FileTransport::CountersFor(const std::string& segment) {
  std::lock_guard lock(mu_);
  auto& c = counters_[segment];
  if (!c) {
    c = std::make_unique<SegmentCounters>();
    c->name = segment;
  }
  return c.get();
}

StatusOr<std::shared_ptr<OpenFile>> FileTransport::OpenCached(const std::string& path, const std::string& segment) {
  {
    std::lock_guard lock(mu_);
    auto it = files_.find(path);
    if (it != files_.end()) return it->second.file;
  }
  MC_RETURN_IF_ERROR(CheckAllowed(path));
  auto f = OpenFile::Open(path, config_.direct);
  if (!f.ok()) return f.status();
  std::lock_guard lock(mu_);
  auto [it, inserted] = files_.emplace(path, CachedFile{*f, segment});
  return it->second.file;
}

bool FileTransport::IsOpen(const std::string& path) const {
  std::lock_guard lock(mu_);
  return files_.count(path) != 0;
}

void FileTransport::DropCached(const std::string& path, const OpenFile* file) {
  std::lock_guard lock(mu_);
  auto it = files_.find(path);
  if (it != files_.end() && it->second.file.get() == file) files_.erase(it);
}

void FileTransport::ForgetPeer(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  for (auto it = files_.begin(); it != files_.end();) {
    it = it->second.segment == segment_name ? files_.erase(it) : std::next(it);
  }
}

std::vector<FileIo> FileTransport::Prepare(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  std::vector<FileIo> ios;
  ios.reserve(slices.size());
  SegmentCounters* counters = CountersFor(peer.name);
  auto fail = [counters](Slice* s, const Status& st, SliceRetry retry) {
    counters->errors.fetch_add(1, std::memory_order_relaxed);
    s->Fail(st, retry);
  };
  for (Slice* s : slices) {
    if (!running_) {
      fail(s, Status(ErrorCode::kSocket, "the file transport is stopped"), SliceRetry::kFinal);
      continue;
    }
    const BufferDescriptor* b = peer.FindBuffer(s->remote, s->length == 0 ? 1 : s->length);
    if (!b || !IsFileBuffer(*b)) {
      fail(s, Status(ErrorCode::kNotImplemented, "segment '" + peer.name + "': the range is not in a file buffer"),
           SliceRetry::kOtherPath);
      continue;
    }
    auto fb = ParseFileBuffer(*b);
    if (!fb.ok()) {
      fail(s, Status(fb.status().code(), "segment '" + peer.name + "': " + fb.status().message()), SliceRetry::kFinal);
      continue;
    }
    std::string path = LocalPath(*fb, local_names_);
    auto file = OpenCached(path, peer.name);
    if (!file.ok()) {
      fail(s, Status(file.status().code(), "segment '" + peer.name + "': " + file.status().message()),
           RetryFor(file.status()));
      continue;
    }
    const uint64_t offset = fb->file_offset + (s->remote - b->addr);
    const bool write = s->opcode == OpCode::kWrite;
    // Writes check first that the file still backs the range (a write would silently extend a truncated
    // file) and reserve its blocks; reads find truncation by their short read. Both check after the I/O.
    Status pre = write ? (*file)->Check(offset + s->length) : Status::Ok();
    if (pre.ok() && write) pre = (*file)->Reserve(fb->file_offset + fb->length);
    if (!pre.ok()) {
      if (pre.code() == ErrorCode::kRemoteRejected) DropCached(path, file->get());
      fail(s, Status(pre.code(), "segment '" + peer.name + "': " + pre.message()), RetryFor(pre));
      continue;
    }
    FileIo io;
    io.file = *file;
    io.write = write;
    io.buf = s->local;
    io.offset = offset;
    io.length = s->length;
    const OpenFile* raw = file->get();
    io.done = [this, s, counters, raw](const Status& st) {
      if (st.ok()) {
        counters->bytes.fetch_add(s->length, std::memory_order_relaxed);
        counters->slices.fetch_add(1, std::memory_order_relaxed);
        s->Complete(st);
        return;
      }
      if (st.code() == ErrorCode::kRemoteRejected) DropCached(raw->path(), raw);  // reopened next time
      counters->errors.fetch_add(1, std::memory_order_relaxed);
      s->Fail(Status(st.code(), "segment '" + counters->name + "': " + st.message()), RetryFor(st));
    };
    ios.push_back(std::move(io));
  }
  return ios;
}

void FileTransport::Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  std::vector<FileIo> ios = Prepare(peer, slices);
  if (!ios.empty()) queue_->Enqueue(std::move(ios));
}

void FileTransport::SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  IoQueue* q = nullptr;
  {
    std::lock_guard lock(pool_mu_);
    if (!idle_queues_.empty()) {
      q = idle_queues_.back();
      idle_queues_.pop_back();
    }
  }
  if (!q) {
    auto fresh = std::make_unique<IoQueue>(config_.queue_depth, /*private_driver=*/true);
    if (!running_ || !fresh->Init().ok()) {
      Submit(peer, slices);  // the worker's ring
      return;
    }
    q = fresh.get();
    std::lock_guard lock(pool_mu_);
    drive_queues_.push_back(std::move(fresh));
  }
  std::vector<FileIo> ios = Prepare(peer, slices);
  if (!ios.empty()) {
    q->Enqueue(std::move(ios));
    q->DriveUntilIdle();
  }
  std::lock_guard lock(pool_mu_);
  idle_queues_.push_back(q);
}

nlohmann::json FileTransport::Stats() const {
  nlohmann::json out = nlohmann::json::object();
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, c] : counters_) {
      out[name] = {{"bytes", c->bytes.load()}, {"slices", c->slices.load()}, {"errors", c->errors.load()}};
    }
    out["open_files"] = files_.size();
  }
  uint64_t v[6] = {0, 0, 0, 0, 0, 0};
  auto add = [&v](const IoCounters& c) {
    v[0] += c.ios.load();
    v[1] += c.bytes.load();
    v[2] += c.errors.load();
    v[3] += c.direct_pieces.load();
    v[4] += c.bounced_pieces.load();
    v[5] += c.buffered_pieces.load();
  };
  if (queue_) add(queue_->counters());
  {
    std::lock_guard lock(pool_mu_);
    for (const auto& q : drive_queues_) add(q->counters());
  }
  out["io"] = {{"ios", v[0]},           {"moved_bytes", v[1]},          {"errors", v[2]},
               {"direct_pieces", v[3]}, {"bounced_pieces", v[4]}, {"buffered_pieces", v[5]}};
  out["gds"] = gds_;
  return out;
}

MC_TRANSPORT_PLUGIN("file", FileTransport, {"file", "nvmeof"}, "", ProbeFileTransport);

}  // namespace mooncake::te::file
