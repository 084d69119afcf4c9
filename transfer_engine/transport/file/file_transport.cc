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

std::string ProbeGds(PlatformRegistry* platforms, const std::string& library, std::unique_ptr<Gds>* opened) {
  auto cuda = platforms ? platforms->ForType(MemoryType::kCuda) : nullptr;
  if (!cuda) {
    return "unusable: no usable CUDA platform (GPU memory is declined; host memory uses io_uring)";
  }
  auto gds = Gds::Open(library);
  if (!gds.ok()) return "unusable: " + gds.status().message() + " (GPU memory is declined)";
  std::string usable = "usable: " + (*gds)->description() + " on the " + cuda->name() + " platform";
  if (opened) *opened = std::move(gds.value());
  return usable;
}

FileTransport::FileTransport() = default;

FileTransport::~FileTransport() { Stop(); }

TransportCapabilities FileTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = true;  // wherever the segment's files are visible
  c.same_host = true;
  c.memory = {{MemoryType::kHost, MemoryType::kFile}};
  if (gds_engine_) c.memory.push_back({MemoryType::kCuda, MemoryType::kFile});  // set once, at Start
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
  gds_ = ProbeGds(ctx.platforms, config_.cufile_lib, &gds_engine_);
  if (gds_engine_) gds_worker_ = std::make_unique<WorkQueue>(kGdsThreads);
  MC_LOG(kInfo) << "file transport: GPU memory (GDS) " << gds_;
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
  if (gds_worker_) gds_worker_->Stop();  // runs what was posted (each fails fast once running_ is false)
  std::lock_guard lock(mu_);
  files_.clear();  // nothing uses them now; their cuFile handles go before the driver closes (~Gds)
}

StatusOr<RegionRegistration> FileTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  if (region.kind.type == MemoryType::kCuda && gds_engine_) {
    void* ptr = reinterpret_cast<void*>(region.start);
    Status st = gds_engine_->RegisterBuffer(ptr, region.length);  // a speed-up only: transfers work without it
    if (st.ok()) {
      std::lock_guard lock(mu_);
      gds_buffers_[region.start] = region.length;
    } else {
      MC_LOG(kInfo) << "file transport: " << st.message() << " (transfers of this region still use cuFile)";
    }
  } else if (region.kind.type != MemoryType::kHost) {
    r.declined = true;
    r.why_declined = "the file transport moves host memory and, with GDS, CUDA memory (GDS " + gds_ + ")";
  }
  return r;
}

std::pair<void*, size_t> FileTransport::GdsBase(void* ptr) const {
  const auto p = reinterpret_cast<uint64_t>(ptr);
  std::lock_guard lock(mu_);
  auto it = gds_buffers_.upper_bound(p);
  if (it != gds_buffers_.begin()) {
    --it;
    if (p < it->first + it->second) return {reinterpret_cast<void*>(it->first), static_cast<size_t>(p - it->first)};
  }
  return {ptr, 0};
}

void FileTransport::UnregisterRegion(const MemoryRegion& region) {
  {
    std::lock_guard lock(mu_);
    if (gds_buffers_.erase(region.start) == 0) return;
  }
  gds_engine_->DeregisterBuffer(reinterpret_cast<void*>(region.start));
}

void FileTransport::Describe(nlohmann::json& /*descriptor*/) const {}

bool FileTransport::CompleteForeignDescriptor(const std::string& segment_name, nlohmann::json& d) const {
  auto protocol = JsonString(d, "protocol");
  if (!protocol || (*protocol != "nvmeof" && *protocol != "file")) return false;
  auto buffers = d.find("buffers");
  if (buffers == d.end() || !buffers->is_array() || buffers->empty()) return false;
  uint64_t next = kFileSegmentBase;
  for (auto& b : *buffers) {
    if (!b.is_object() || !JsonString(b, "file_path")) return false;
    auto length = JsonUint(b, "length");
    if (!length || *length == 0 || next + *length < next) return false;
    if (!b.contains("name")) b["name"] = kFileLocation;
    if (!b.contains("addr")) b["addr"] = next;
    auto addr = JsonUint(b, "addr");
    if (!addr || *addr + *length < *addr) return false;
    next = *addr + *length;
  }
  if (!d.contains("name")) {
    auto server = JsonString(d, "server_name");
    d["name"] = server && !server->empty() ? *server : segment_name;
  }
  return true;
}

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
    if (IsOpen(CacheKey(peer, path, *fb)) ||
        (access(path.c_str(), F_OK) == 0 && (peer.defined_locally || CheckAllowed(path).ok()))) {
      return true;
    }
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

FileTransport::FileKey FileTransport::CacheKey(const SegmentDescriptor& peer, const std::string& path,
                                               const FileBuffer& b) {
  int how = (peer.defined_locally ? 1 : 0) | (b.read_only ? 2 : 0) | (b.direct ? (*b.direct ? 4 : 8) : 0);
  return FileKey{peer.name, path, how};
}

StatusOr<std::shared_ptr<OpenFile>> FileTransport::OpenCached(const std::string& path, const SegmentDescriptor& peer,
                                                               const FileBuffer& b) {
  // Keyed by how the file is opened too: a file a trusted definition opened is never handed to a descriptor
  // another engine wrote (which must pass CheckAllowed), nor a read-only open to a writer.
  const FileKey key = CacheKey(peer, path, b);
  {
    std::lock_guard lock(mu_);
    auto it = files_.find(key);
    if (it != files_.end()) return it->second;
  }
  if (!peer.defined_locally) MC_RETURN_IF_ERROR(CheckAllowed(path));  // the application's own word is trusted
  auto f = OpenFile::Open(path, b.direct.value_or(config_.direct), b.read_only);
  if (!f.ok()) return f.status();
  std::lock_guard lock(mu_);
  auto [it, inserted] = files_.emplace(key, *f);
  return it->second;
}

bool FileTransport::IsOpen(const FileKey& key) const {
  std::lock_guard lock(mu_);
  return files_.count(key) != 0;
}

void FileTransport::DropCached(const OpenFile* file) {
  std::lock_guard lock(mu_);
  for (auto it = files_.begin(); it != files_.end(); ++it) {
    if (it->second.get() == file) {
      files_.erase(it);
      return;
    }
  }
}

void FileTransport::ForgetPeer(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  for (auto it = files_.begin(); it != files_.end();) {
    it = std::get<0>(it->first) == segment_name ? files_.erase(it) : std::next(it);
  }
}

std::vector<FileIo> FileTransport::Prepare(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  std::vector<FileIo> ios;
  ios.reserve(slices.size());
  SegmentCounters* counters = CountersFor(peer.defined_locally ? kDefinedLocally : peer.name);
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
    auto file = OpenCached(path, peer, *fb);
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
      if (pre.code() == ErrorCode::kRemoteRejected) DropCached(file->get());
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
    const bool device = s->task && s->task->route.local_kind.type != MemoryType::kHost;
    io.done = [this, s, counters, raw, name = peer.name](const Status& st) {
      if (st.ok()) {
        counters->bytes.fetch_add(s->length, std::memory_order_relaxed);
        counters->slices.fetch_add(1, std::memory_order_relaxed);
        s->Complete(st);
        return;
      }
      if (st.code() == ErrorCode::kRemoteRejected) DropCached(raw);  // reopened next time
      counters->errors.fetch_add(1, std::memory_order_relaxed);
      s->Fail(Status(st.code(), "segment '" + name + "': " + st.message()), RetryFor(st));
    };
    if (device) {  // GPU memory: cuFile on the GDS threads (synchronous calls; never on the ring's thread)
      if (!gds_engine_ || !gds_worker_) {
        fail(s, Status(ErrorCode::kNotImplemented, "GPU memory needs GDS: " + gds_), SliceRetry::kOtherPath);
        continue;
      }
      const uint64_t end = offset + s->length;
      auto [base, base_offset] = GdsBase(io.buf);
      if (!gds_worker_->Post([this, io, end, base = base, base_offset = base_offset] {
            Status st = running_ ? gds_engine_->Transfer(*io.file, io.write, base, base_offset, io.length, io.offset)
                                 : Status(ErrorCode::kSocket, "the file transport is stopped");
            if (st.ok()) st = io.file->Check(end);  // removed or truncated under the transfer
            io.done(st);
          })) {
        io.done(Status(ErrorCode::kSocket, "the file transport is stopped"));
      }
      continue;
    }
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
  out["gds_buffers"] = gds_buffers_size();
  return out;
}

MC_TRANSPORT_PLUGIN("file", FileTransport, {"file", "nvmeof"}, "", ProbeFileTransport);

}  // namespace mooncake::te::file
