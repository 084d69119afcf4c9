#include "transfer_engine/transport/shm/shm_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <vector>
#include <shared_mutex>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te::shm {

/// A peer's memfd mapped here. Unmapped when the last user lets go.
struct ShmTransport::Mapping {
  char* base = nullptr;
  size_t length = 0;
  uint64_t epoch = 0;  // the peer's registration epoch it was mapped under (fd numbers are reused after a free)
  std::atomic<bool> filling{false};  // the background page-table fill (PopulateInBackground) still runs
  ~Mapping() {
    if (base) munmap(base, length);
  }
};

namespace {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

std::string PeerKey(const SegmentDescriptor& d) { return d.json.value("instance", d.name); }

// The peer's registration epoch as its descriptor states it (0 when absent or malformed).
uint64_t DescriptorEpoch(const SegmentDescriptor& d) { return JsonUint(d.json, "epoch").value_or(0); }

// Fills a fresh mapping's page tables in the background, 32 MiB at a time, so copies into memory the peer has
// already committed do not take a page fault per 4 KiB page (about 0.26 ms per MiB here, a third of the copy
// itself). Only pages the peer's memfd already holds (mincore) are populated: populating a hole would commit
// the peer's memory (a 64 GiB segment the peer fills lazily would be allocated in full, at ~0.75 s of CPU per
// GiB). The thread runs at nice 19, in runs of at most 4 MiB. Transfers meanwhile proceed and fault as
// usual. The thread holds the mapping; it stops early once it is the last holder (the transport dropped the
// mapping) or on a kernel without MADV_POPULATE_READ.
constexpr size_t kRunPages = 1024;  // 4 MiB of 4 KiB pages per madvise call

// One chunk; false when populating is not possible (mincore or MADV_POPULATE_READ refused): stop.
bool PopulateResident(char* base, size_t length, std::vector<unsigned char>& resident, size_t page) {
  size_t pages = (length + page - 1) / page;
  if (mincore(base, length, resident.data()) != 0) return false;
  for (size_t i = 0; i < pages;) {
    while (i < pages && !(resident[i] & 1)) ++i;
    size_t j = i;
    while (j < pages && (resident[j] & 1)) ++j;
    for (size_t k = i; k < j; k += kRunPages) {  // bounded runs: the mmap lock is held for one at a time
      size_t n = std::min(j - k, kRunPages);
      if (madvise(base + k * page, std::min(length - k * page, n * page), MADV_POPULATE_READ) != 0) return false;
    }
    i = j;
  }
  return true;
}

void PopulateInBackground(std::shared_ptr<ShmTransport::Mapping> m) {
  m->filling = true;
  std::thread([m = std::move(m)] {
    char* base = m->base;
    const size_t length = m->length;
    // Lowest weight, not SCHED_IDLE: populating holds the process's mmap lock (read), and an mmap/munmap of
    // another thread waits for it; a SCHED_IDLE thread could be starved while holding it on a busy host.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);  // best effort
    constexpr size_t kChunk = 32u << 20;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> resident(kChunk / page + 1);
    for (size_t off = 0; off < length && m.use_count() > 1; off += kChunk) {
      if (!PopulateResident(base + off, std::min(kChunk, length - off), resident, page)) break;
    }
    m->filling = false;
  }).detach();
}

// Cross-memory attach, looping over partial transfers (the kernel may stop at page boundaries).
Status Attach(int pid, OpCode op, char* local, uint64_t remote, size_t len) {
  size_t done = 0;
  while (done < len) {
    iovec l{local + done, len - done};
    iovec r{reinterpret_cast<void*>(remote + done), len - done};
    ssize_t n = op == OpCode::kWrite ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return Status(ErrorCode::kSocket, std::string(op == OpCode::kWrite ? "process_vm_writev" : "process_vm_readv") +
                                            " to pid " + std::to_string(pid) + ": " +
                                            (n < 0 ? strerror(errno) : "no progress"));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// The engines of this process, by instance. A copy into one of them goes through that engine's own registry
// (never through the ranges a descriptor claims), holding `mu` shared; its Stop takes `mu` exclusively to
// leave, so once Stop returns no copy of this process touches its memory.
struct LocalEngines {
  std::shared_mutex mu;
  std::unordered_map<std::string, MemoryRegistry*> by_instance;
};
LocalEngines& Local() {
  static auto* engines = new LocalEngines();  // never destroyed: transports may stop during exit
  return *engines;
}

// The size of a peer's memfd when it can never shrink (F_SEAL_SHRINK): only then may it stay mapped here (a
// file that shrinks under a mapping turns the next access into SIGBUS); -1 otherwise.
off_t SealedSize(int fd) {
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &st) != 0) return -1;
  return st.st_size;
}

// Copies the slice's bytes at `remote`, a pointer valid in this process.
ParallelCopier::PartFn MemcpyParts(Slice* s, char* remote) {
  return [s, remote](size_t offset, size_t len) {
    if (s->opcode == OpCode::kWrite) memcpy(remote + offset, s->local + offset, len);
    else memcpy(s->local + offset, remote + offset, len);
    return Status::Ok();
  };
}

}  // namespace

ShmTransport::ShmTransport() = default;
ShmTransport::~ShmTransport() { Stop(); }

TransportCapabilities ShmTransport::capabilities() const {
  TransportCapabilities c;
  c.remote_hosts = false;
  c.same_host = true;
  c.memory = {{MemoryType::kHost, MemoryType::kHost}};
  c.priority = 10;
  return c;
}

class ShmTransport::EpochPage {
 public:
  EpochPage() {
    int fd = memfd_create("mooncake-epoch", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return;
    void* p = MAP_FAILED;
    if (ftruncate(fd, 4096) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0) {
      p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (p == MAP_FAILED) {
      close(fd);
      return;
    }
    fd_ = fd;
    value_ = new (p) std::atomic<uint64_t>(0);
  }
  ~EpochPage() {
    if (fd_ < 0) return;
    munmap(reinterpret_cast<void*>(value_), 4096);
    close(fd_);
  }
  int fd() const { return fd_; }
  uint64_t value() const { return value_->load(std::memory_order_acquire); }
  void Advance() { value_->fetch_add(1, std::memory_order_acq_rel); }

 private:
  int fd_ = -1;
  std::atomic<uint64_t> fallback_{0};
  std::atomic<uint64_t>* value_ = &fallback_;  // in the shared page (or fallback_ without memfd)
};

Status ShmTransport::Configure(const TransportOptions& o) {
  threads_ = static_cast<int>(o.Int("threads", "MC_SHM_THREADS", 1, 1, 64));
  slice_size_ = static_cast<size_t>(o.Int("slice_size", "MC_SHM_SLICE_SIZE", 64 << 20, 4096, 1LL << 40));
  copy_threads_ = static_cast<int>(o.Int("copy_threads", "MC_SHM_COPY_THREADS", std::min(2, UsableCpus()), 1, 64));
  return Status::Ok();
}

Status ShmTransport::Start(const TransportContext& ctx) {
  ctx_ = ctx;
  pid_ = getpid();
  epoch_ = std::make_unique<EpochPage>();
  {
    std::unique_lock lock(Local().mu);
    Local().by_instance[ctx.instance] = ctx.memory;
  }
  if (!copier_) copier_ = std::make_unique<ParallelCopier>(copy_threads_);
  workers_ = std::make_unique<WorkQueue>(threads_);
  return Status::Ok();
}

StatusOr<RegionRegistration> ShmTransport::RegisterRegion(const MemoryRegion& region) {
  RegionRegistration r;
  if (region.kind.type != MemoryType::kHost) {
    r.declined = true;
    r.why_declined = "the same-host transport copies host memory only";
    return r;
  }
  if (region.backing_fd >= 0) {
    r.descriptor_fields["shm_fd"] = region.backing_fd;
    r.descriptor_fields["shm_offset"] = region.backing_offset;
  }
  return r;
}

void ShmTransport::WithdrawRegion(const MemoryRegion&) {
  if (epoch_) epoch_->Advance();
}

void ShmTransport::Describe(nlohmann::json& descriptor) const {
  if (!epoch_) return;
  descriptor["epoch"] = epoch_->value();
  if (epoch_->fd() >= 0) descriptor["epoch_fd"] = epoch_->fd();
}

void ShmTransport::Stop() {
  if (workers_) workers_->Stop();  // the workers finish the queue first: every slice completes
  if (copier_) copier_->Stop();    // a synchronous copy still running finishes on its caller's thread
  // Peers that mapped the epoch page (engines of this process included, which no process watch covers) see
  // it move on: their cached descriptors are stale, and a refresh finds this engine gone.
  if (epoch_) epoch_->Advance();
  {
    std::unique_lock lock(Local().mu);  // waits for copies of this process into our memory
    Local().by_instance.erase(ctx_.instance);
  }
  std::lock_guard lock(mu_);
  peers_.clear();
}

namespace {

// The owner of a segment whose name may be taken over by a later process (its descriptor says when it started,
// "pid_start": named segments of HTTP / etcd / Redis metadata) is watched; null for P2P names, which embed
// the owner's own bound RPC port.
StatusOr<std::unique_ptr<ProcessWatch>> WatchOwner(const SegmentDescriptor& desc) {
  if (!desc.json.contains("pid_start")) return std::unique_ptr<ProcessWatch>();
  return ProcessWatch::Open(desc.json.value("pid", 0), desc.json.value("pid_start", uint64_t{0}));
}

}  // namespace

ShmTransport::Peer& ShmTransport::PeerFor(const SegmentDescriptor& desc) const {
  auto [it, inserted] = peers_.try_emplace(PeerKey(desc));
  Peer& p = it->second;
  if (!inserted) return p;
  p.name = desc.name;
  p.pid = desc.json.value("pid", 0);
  if (p.pid == pid_) return p;  // this process: plain memcpy
  if (p.pid <= 0) {
    p.usable = false;
    p.why = "the descriptor has no pid";
  } else if (auto process = WatchOwner(desc); !process.ok()) {
    p.usable = false;
    p.why = process.status().message();
  } else {
    p.process = std::move(process.value());
    // Probe once whether the kernel lets us at the peer's memory (ptrace access mode): read one byte.
    if (!desc.buffers.empty()) {
      char byte;
      iovec l{&byte, 1}, r{reinterpret_cast<void*>(desc.buffers[0].addr), 1};
      if (process_vm_readv(p.pid, &l, 1, &r, 1, 0) != 1) {
        p.usable = false;
        p.why = std::string("cross-memory attach refused: ") + strerror(errno);
      }
    }
  }
  if (!p.usable) {
    MC_LOG(kWarning) << "same-host transport cannot reach '" << desc.name << "' (" << p.why
                     << "); using the network transport for it";
  }
  return p;
}

bool ShmTransport::CanReach(const SegmentDescriptor& peer) const {
  if (peer.json.value("host_id", "") != ctx_.host_id || ctx_.host_id.empty()) return false;
  std::lock_guard lock(mu_);
  return PeerFor(peer).usable;
}

StatusOr<std::shared_ptr<ShmTransport::Mapping>> ShmTransport::MapBuffer(const SegmentDescriptor& desc,
                                                                         const BufferDescriptor& buf) {
  const uint64_t epoch = DescriptorEpoch(desc);
  const int shm_fd = static_cast<int>(JsonInt(buf.json, "shm_fd").value_or(-1));
  const uint64_t shm_offset = JsonUint(buf.json, "shm_offset").value_or(0);
  {
    std::lock_guard lock(mu_);
    Peer& p = PeerFor(desc);
    auto it = p.mappings.find(shm_fd);
    // A mapping made under another epoch may be of a memfd the peer has since freed (and whose number it
    // reused): map the descriptor's file afresh.
    if (it != p.mappings.end() && it->second->epoch == epoch && shm_offset <= it->second->length &&
        buf.length <= it->second->length - shm_offset) {
      return it->second;
    }
  }
  int pid = desc.json.value("pid", 0);
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(shm_fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Status(ErrorCode::kSocket, "open " + path + ": " + strerror(errno));
  off_t size = SealedSize(fd);
  if (size < 0) {
    close(fd);
    return Status(ErrorCode::kSocket, path + " may shrink (no F_SEAL_SHRINK): not mapped");
  }
  const uint64_t usize = static_cast<uint64_t>(size);
  if (shm_offset > usize || buf.length > usize - shm_offset) {
    close(fd);
    return Status(ErrorCode::kSocket, path + " is smaller than the buffer it should back");
  }
  void* base = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base != MAP_FAILED) madvise(base, static_cast<size_t>(size), MADV_HUGEPAGE);  // see managed_memory.cc
  close(fd);
  if (base == MAP_FAILED) return Status(ErrorCode::kMemory, "mmap " + path + ": " + strerror(errno));
  auto m = std::make_shared<Mapping>();
  m->base = static_cast<char*>(base);
  m->length = static_cast<size_t>(size);
  m->epoch = epoch;
  {
    std::lock_guard lock(mu_);
    PeerFor(desc).mappings[shm_fd] = m;
  }
  PopulateInBackground(m);
  return m;
}

Status ShmTransport::CheckEpoch(const SegmentDescriptor& desc) {
  const std::atomic<uint64_t>* epoch = nullptr;
  std::shared_ptr<Mapping> page;  // keeps the page mapped while we read it (ForgetPeer may drop the peer)
  {
    std::lock_guard lock(mu_);
    Peer& p = PeerFor(desc);
    auto epoch_fd = JsonInt(desc.json, "epoch_fd");
    if (!p.epoch && epoch_fd && *epoch_fd >= 0) {
      std::string path = "/proc/" + std::to_string(p.pid) + "/fd/" + std::to_string(*epoch_fd);
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0 && SealedSize(fd) < 4096) {
        close(fd);
        fd = -1;
      }
      if (fd >= 0) {
        void* page = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (page != MAP_FAILED) {
          p.epoch = std::make_shared<Mapping>();
          p.epoch->base = static_cast<char*>(page);
          p.epoch->length = 4096;
        }
      }
    }
    page = p.epoch;
    if (page) epoch = reinterpret_cast<const std::atomic<uint64_t>*>(page->base);
  }
  if (!epoch) {
    return Status(ErrorCode::kRemoteRejected, "cannot check the registrations of '" + desc.name + "'");
  }
  if (epoch->load(std::memory_order_acquire) != DescriptorEpoch(desc)) {
    return Status(ErrorCode::kStaleMetadata, "'" + desc.name + "' unregistered memory since its descriptor was "
                                                 "fetched; refresh it and retry");
  }
  return Status::Ok();
}

Status ShmTransport::CopyInParts(const SegmentDescriptor& desc, Slice* s, uint64_t Peer::*kind,
                                 const ParallelCopier::PartFn& part) {
  ParallelCopier::Outcome out = copier_->Run(s->length, part);
  std::lock_guard lock(mu_);
  Peer& p = PeerFor(desc);
  p.parts += out.parts;
  p.helper_parts += out.helper_parts;
  if (kind && out.status.ok()) p.*kind += 1;
  return out.status;
}

Status ShmTransport::CheckAlive(const SegmentDescriptor& desc) {
  std::lock_guard lock(mu_);
  Peer& p = PeerFor(desc);
  if (!p.process || !p.process->Exited()) return Status::Ok();
  if (p.usable) {
    p.usable = false;
    p.why = "its process " + std::to_string(p.pid) + " has exited";
  }
  p.mappings.clear();  // the dead peer's memory: freed once the last copy lets go
  p.epoch.reset();
  return Status(ErrorCode::kPeerUnreachable, "segment '" + desc.name + "' is gone (" + p.why +
                                                 "): refresh its descriptor, its name may have a new owner");
}

Status ShmTransport::CopySlice(const SegmentDescriptor& desc, Slice* s) {
  if (desc.json.value("instance", "") == ctx_.instance) {
    // This engine's own segment: its registry is the authority, and the pin blocks unregistering meanwhile.
    RegionPin pin = ctx_.memory->Find(s->remote, s->length, /*remote=*/true);
    if (!pin || pin->kind.type != MemoryType::kHost) {
      return Status(ErrorCode::kRemoteRejected,
                    "range " + Range(s->remote, s->length) + " is not registered for remote access");
    }
    return CopyInParts(desc, s, nullptr, MemcpyParts(s, reinterpret_cast<char*>(s->remote)));
  }
  // Checked after the copy too: a peer that exited meanwhile may not have received it.
  MC_RETURN_IF_ERROR(CheckAlive(desc));
  Status st = CopyToPeer(desc, s);
  return st.ok() ? CheckAlive(desc) : st;
}

Status ShmTransport::CopyToPeer(const SegmentDescriptor& desc, Slice* s) {
  MC_RETURN_IF_ERROR(CheckEpoch(desc));
  const BufferDescriptor* buf = desc.FindBuffer(s->remote, s->length);
  if (!buf) {
    return Status(ErrorCode::kAddressNotRegistered,
                  "range " + Range(s->remote, s->length) + " is not inside a buffer of '" + desc.name + "'");
  }
  int pid = desc.json.value("pid", 0);
  if (pid == pid_) {  // another engine in this process: same address space, its registry decides
    std::shared_lock lock(Local().mu);
    auto it = Local().by_instance.find(desc.json.value("instance", ""));
    if (it == Local().by_instance.end()) {
      return Status(ErrorCode::kPeerUnreachable, "segment '" + desc.name + "' was an engine of this process that "
                                                     "has stopped; its name may have a new owner");
    }
    RegionPin pin = it->second->Find(s->remote, s->length, /*remote=*/true);
    if (!pin || pin->kind.type != MemoryType::kHost) {
      return Status(ErrorCode::kStaleMetadata, "'" + desc.name + "' no longer registers " + Range(s->remote, s->length) +
                                                   " for remote access");
    }
    return CopyInParts(desc, s, nullptr, MemcpyParts(s, reinterpret_cast<char*>(s->remote)));
  }
  if (JsonInt(buf->json, "shm_fd").value_or(-1) >= 0) {
    auto m = MapBuffer(desc, *buf);
    if (m.ok()) {
      // `m` keeps the mapping alive until every part is done.
      uint64_t offset = JsonUint(buf->json, "shm_offset").value_or(0);
      return CopyInParts(desc, s, &Peer::mapped_copies, MemcpyParts(s, (*m)->base + offset + (s->remote - buf->addr)));
    }
    MC_LOG(kDebug) << "mapping a buffer of '" << desc.name << "' failed (" << m.status().message()
                   << "); using cross-memory attach";
  }
  return CopyInParts(desc, s, &Peer::attach_copies, [pid, s](size_t offset, size_t len) {
    return Attach(pid, s->opcode, s->local + offset, s->remote + offset, len);
  });
}

void ShmTransport::Copy(const SegmentDescriptor& desc, const std::vector<Slice*>& slices) {
  for (Slice* s : slices) {
    Status st = CopySlice(desc, s);
    {
      std::lock_guard lock(mu_);
      Peer& p = PeerFor(desc);
      if (st.ok()) {
        p.bytes += s->length;
        p.slices++;
      } else {
        p.errors++;
      }
    }
    // A stale descriptor (memory unregistered since) or a peer that has exited: a fresh descriptor may
    // show the range again, or the name's new owner.
    bool stale = st.code() == ErrorCode::kStaleMetadata || st.code() == ErrorCode::kPeerUnreachable;
    if (st.ok()) s->Complete(st);
    else s->Fail(st, stale ? SliceRetry::kRefreshPeer : SliceRetry::kFinal);
  }
}

void ShmTransport::Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  if (slices.empty()) return;
  auto desc = std::make_shared<SegmentDescriptor>(peer);
  if (workers_ && workers_->Post([this, desc, slices] { Copy(*desc, slices); })) return;
  for (Slice* s : slices) s->Complete(Status(ErrorCode::kSocket, "transfer engine is shutting down"));
}

void ShmTransport::SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
  Copy(peer, slices);
}

void ShmTransport::ForgetPeer(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    it = it->second.name == segment_name ? peers_.erase(it) : std::next(it);
  }
}

nlohmann::json ShmTransport::Stats() const {
  std::lock_guard lock(mu_);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, p] : peers_) {
    int filling = 0;
    for (const auto& [fd, m] : p.mappings) filling += m->filling ? 1 : 0;
    out[p.name] = {{"bytes", p.bytes},
                   {"slices", p.slices},
                   {"errors", p.errors},
                   {"mapped_copies", p.mapped_copies},
                   {"attach_copies", p.attach_copies},
                   {"parts", p.parts},
                   {"helper_parts", p.helper_parts},
                   {"filling_mappings", filling},
                   {"state", p.usable ? "up" : "unusable: " + p.why}};
  }
  return out;
}

MC_TRANSPORT_PLUGIN("shm", ShmTransport, {"shm"}, "", nullptr);

}  // namespace mooncake::te::shm
