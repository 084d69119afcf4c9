#include "transfer_engine/transport/cxl/cxl_device.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <random>
#include <sstream>

#include "transfer_engine/common/process_watch.h"
#include "transfer_engine/transport/cxl/cxl_cache.h"

namespace mooncake::te::cxl {

namespace {

constexpr uint64_t kMagic = 0x3130304c58434d4dULL;  // "MMCXL001"
constexpr uint64_t kVersion = 1;

struct RawOwner {
  char kernel[64];
  int32_t pid;
  int32_t pad;
  uint64_t pid_start;
};
struct RawEngine {  // 128 bytes
  uint64_t state;   // 0 free, 1 live
  uint64_t epoch;
  char instance[32];
  RawOwner owner;
};
struct RawAllocation {  // 192 bytes
  uint64_t state;  // 0 free, 1 live
  uint64_t offset;
  uint64_t length;
  char tag[48];
  RawOwner owner;
  char pad[40];
};
static_assert(sizeof(RawEngine) == 128, "engine slot layout");
static_assert(sizeof(RawAllocation) == 192, "allocation entry layout");

void CopyString(char* dst, size_t cap, const std::string& s) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), std::min(cap - 1, s.size()));
}
std::string ReadString(const char* src, size_t cap) { return std::string(src, strnlen(src, cap)); }

void Store(RawOwner* raw, const Owner& o) {
  CopyString(raw->kernel, sizeof(raw->kernel), o.kernel);
  raw->pid = o.pid;
  raw->pad = 0;
  raw->pid_start = o.pid_start;
}
Owner Load(const RawOwner& raw) { return Owner{ReadString(raw.kernel, sizeof(raw.kernel)), raw.pid, raw.pid_start}; }

bool SameProcess(const Owner& a, const Owner& b) {
  return a.kernel == b.kernel && a.pid == b.pid && a.pid_start == b.pid_start;
}

std::string Errno(const std::string& what) { return what + ": " + strerror(errno); }

// /sys/bus/dax/devices/<name>/size for /dev/<name>; 0 when unknown.
uint64_t DaxSize(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  std::ifstream f("/sys/bus/dax/devices/" + name + "/size");
  uint64_t size = 0;
  return (f >> size) ? size : 0;
}

}  // namespace

struct CxlDevice::Header {
  uint64_t magic;
  uint64_t version;
  uint64_t size;
  uint64_t reserved;
  char uuid[32];  // hex, not NUL-terminated
  RawEngine engines[kMaxEngines];
  RawAllocation allocations[kMaxAllocations];
};

std::string KernelId() {
  static const std::string id = [] {
    std::string boot;
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
    struct stat st;
    std::string ns = stat("/proc/self/ns/pid", &st) == 0 ? std::to_string(st.st_ino) : "?";
    return boot + ":" + ns;
  }();
  return id;
}

Owner ThisProcess() { return Owner{KernelId(), getpid(), ProcessStartTime(getpid())}; }

bool OwnerGone(const Owner& o) {
  if (o.kernel != KernelId() || o.pid <= 0) return false;
  if (o.pid == getpid()) return o.pid_start != ProcessStartTime(getpid());
  return !ProcessWatch::Open(o.pid, o.pid_start, /*use_pidfd=*/false).ok();
}

class CxlDevice::TableLock {
 public:
  explicit TableLock(const CxlDevice& d) : d_(d), lock_(d.mu_) {
    while (flock(d_.fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
    Invalidate(d_.base_, sizeof(Header));
  }
  ~TableLock() {
    WriteBack(d_.base_, sizeof(Header));
    flock(d_.fd_, LOCK_UN);
  }

 private:
  const CxlDevice& d_;
  std::lock_guard<std::mutex> lock_;
};

StatusOr<std::unique_ptr<CxlDevice>> CxlDevice::Open(const std::string& path, uint64_t size) {
  if (path.empty()) return InvalidArgument("no CXL device path (MC_CXL_DEV_PATH / cxl.dev_path)");
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Status(ErrorCode::kDeviceNotFound, Errno("open " + path));
  std::unique_ptr<CxlDevice> d(new CxlDevice());
  d->fd_ = fd;
  d->path_ = path;
  struct stat st;
  if (fstat(fd, &st) != 0) return Status(ErrorCode::kDeviceNotFound, Errno("fstat " + path));
  if (size == 0) size = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : DaxSize(path);
  if (size < 2 * kReservedBytes || size % kAlignment != 0) {
    return InvalidArgument("CXL device " + path + ": size " + std::to_string(size) +
                           " must be a multiple of 2 MiB and at least 4 MiB (set MC_CXL_DEV_SIZE)");
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < size &&
      ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return Status(ErrorCode::kDeviceNotFound, Errno("growing " + path + " to " + std::to_string(size)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status(ErrorCode::kDeviceNotFound, Errno("mmap " + path));
  d->base_ = static_cast<char*>(p);
  d->identity_.dev = st.st_dev;
  d->identity_.ino = st.st_ino;
  d->identity_.size = size;
  MC_RETURN_IF_ERROR(d->Format());
  return d;
}

CxlDevice::~CxlDevice() {
  if (base_) munmap(base_, identity_.size);
  if (fd_ >= 0) close(fd_);
}

CxlDevice::Header* CxlDevice::header() const { return reinterpret_cast<Header*>(base_); }

Status CxlDevice::Format() {
  static_assert(sizeof(Header) <= kReservedBytes, "the table must fit the reserved bytes");
  TableLock lock(*this);
  Header* h = header();
  if (h->magic == kMagic) {
    if (h->version != kVersion || h->size != identity_.size || h->reserved != kReservedBytes) {
      return InvalidArgument("CXL device " + path_ + " was formatted for " + std::to_string(h->size) +
                             " bytes (table version " + std::to_string(h->version) + "), not " +
                             std::to_string(identity_.size) + ": every engine must map the same size");
    }
  } else {
    std::memset(static_cast<void*>(h), 0, sizeof(Header));
    std::random_device rd;
    std::ostringstream id;
    id << std::hex;
    for (int i = 0; i < 4; ++i) id << std::setw(8) << std::setfill('0') << rd();
    std::memcpy(h->uuid, id.str().data(), sizeof(h->uuid));
    h->version = kVersion;
    h->size = identity_.size;
    h->reserved = kReservedBytes;
    WriteBack(h, sizeof(Header));
    h->magic = kMagic;  // last: a table without its magic is formatted again
  }
  identity_.uuid.assign(h->uuid, sizeof(h->uuid));
  return Status::Ok();
}

bool CxlDevice::Contains(uint64_t addr, uint64_t len) const {
  auto b = reinterpret_cast<uint64_t>(base_);
  return addr >= b + kReservedBytes && len <= identity_.size && addr - b <= identity_.size - len;
}

StatusOr<Allocation> CxlDevice::Allocate(uint64_t length, const std::string& tag) {
  if (length == 0) return InvalidArgument("CXL allocation of 0 bytes");
  if (length > identity_.size) return Status(ErrorCode::kMemory, "CXL allocation larger than the device");
  length = (length + kAlignment - 1) / kAlignment * kAlignment;
  TableLock lock(*this);
  Header* h = header();
  std::vector<std::pair<uint64_t, uint64_t>> used;  // (offset, length) of live entries
  int free_entry = -1;
  for (int i = 0; i < kMaxAllocations; ++i) {
    RawAllocation& a = h->allocations[i];
    if (a.state == 1 && OwnerGone(Load(a.owner))) a.state = 0;  // its owner died: reclaimed
    if (a.state == 1) used.emplace_back(a.offset, a.length);
    else if (free_entry < 0) free_entry = i;
  }
  if (free_entry < 0) return Status(ErrorCode::kMemory, "the CXL allocation table is full");
  std::sort(used.begin(), used.end());
  uint64_t at = kReservedBytes;
  for (const auto& [off, len] : used) {
    if (off >= at && off - at >= length) break;
    at = std::max(at, off + len);
  }
  if (at > identity_.size || identity_.size - at < length) {
    return Status(ErrorCode::kMemory, "no free range of " + std::to_string(length) + " bytes on CXL device " + path_);
  }
  Allocation out{at, length, tag.substr(0, 47), ThisProcess()};
  RawAllocation& a = h->allocations[free_entry];
  a.offset = out.offset;
  a.length = out.length;
  CopyString(a.tag, sizeof(a.tag), out.tag);
  Store(&a.owner, out.owner);
  a.state = 1;
  return out;
}

Status CxlDevice::Free(uint64_t offset) {
  TableLock lock(*this);
  Owner me = ThisProcess();
  for (auto& a : header()->allocations) {
    if (a.state == 1 && a.offset == offset && SameProcess(Load(a.owner), me)) {
      a.state = 0;
      return Status::Ok();
    }
  }
  return InvalidArgument("no CXL allocation of this process starts at offset " + std::to_string(offset));
}

std::vector<Allocation> CxlDevice::Allocations() const {
  TableLock lock(*this);
  std::vector<Allocation> out;
  for (const auto& a : header()->allocations) {
    if (a.state == 1) out.push_back({a.offset, a.length, ReadString(a.tag, sizeof(a.tag)), Load(a.owner)});
  }
  std::sort(out.begin(), out.end(), [](const Allocation& x, const Allocation& y) { return x.offset < y.offset; });
  return out;
}

bool CxlDevice::OverlapsForeign(uint64_t offset, uint64_t len, Allocation* found) const {
  Owner me = ThisProcess();
  for (const auto& a : Allocations()) {
    if (a.offset < offset + len && offset < a.offset + a.length && !SameProcess(a.owner, me) && !OwnerGone(a.owner)) {
      if (found) *found = a;
      return true;
    }
  }
  return false;
}

StatusOr<int> CxlDevice::ClaimSlot(const std::string& instance) {
  TableLock lock(*this);
  Header* h = header();
  for (int i = 0; i < kMaxEngines; ++i) {
    RawEngine& e = h->engines[i];
    if (e.state == 1 && !OwnerGone(Load(e.owner))) continue;
    e.epoch = 0;
    CopyString(e.instance, sizeof(e.instance), instance);
    Store(&e.owner, ThisProcess());
    e.state = 1;
    return i;
  }
  return Status(ErrorCode::kMemory, "all " + std::to_string(kMaxEngines) + " engine slots of CXL device " + path_ +
                                        " are taken by live engines");
}

void CxlDevice::ReleaseSlot(int slot) {
  if (slot < 0 || slot >= kMaxEngines) return;
  TableLock lock(*this);
  RawEngine& e = header()->engines[slot];
  e.state = 0;
  e.epoch++;
  CopyString(e.instance, sizeof(e.instance), "");
}

uint64_t CxlDevice::AdvanceEpoch(int slot) {
  if (slot < 0 || slot >= kMaxEngines) return 0;
  TableLock lock(*this);
  return ++header()->engines[slot].epoch;
}

CxlDevice::SlotState CxlDevice::ReadSlot(int slot) const {
  SlotState s;
  if (slot < 0 || slot >= kMaxEngines) return s;
  const RawEngine& e = header()->engines[slot];
  Invalidate(&e, sizeof(e));
  s.live = e.state == 1;
  s.epoch = e.epoch;
  s.instance = ReadString(e.instance, sizeof(e.instance));
  s.owner = Load(e.owner);
  return s;
}

}  // namespace mooncake::te::cxl
