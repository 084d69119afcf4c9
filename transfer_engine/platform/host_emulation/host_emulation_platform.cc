#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/common/checked_copy.h"
#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/common/shm_names.h"
#include "transfer_engine/platform/host_emulation/copy_worker.h"
#include "transfer_engine/platform/host_emulation/emulation_handle.h"
#include "transfer_engine/platform/util/remote_fd.h"
#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te {
namespace {

using host_emulation::CopyWorker;
using host_emulation::EmulationHandle;

using platform_util::PageSize;

size_t RoundUpToPage(size_t n) { return platform_util::RoundUp(n, PageSize()); }

std::string Addr(const void* p) { return Hex(reinterpret_cast<uintptr_t>(p)); }

Status Errno(ErrorCode code, const std::string& what) {
  return Status(code, "host_emulation: " + what + ": " + strerror(errno));
}

// One range the platform answers for.
struct Region {
  enum class Origin { kPinned, kDevice, kImported };
  Origin origin;
  AllocationKind kind;  // as allocated (kImported: kDevice)
  size_t length;        // bytes the caller asked for / imported
  void* map_base;       // the mmap'ed range containing it
  size_t map_length;
  int fd;               // the memfd of a device allocation (kept open for export); -1 otherwise
  int device;           // -1 for pinned host memory
  uint64_t serial;      // a device allocation's number (its memfd's name); 0 otherwise
  bool fabric = false;      // a kFabric allocation (fd: its shared file), or an ImportFabric mapping
  std::string fabric_path;  // a kFabric allocation's file (unlinked at Free)
};

// Whether `fd` is the memfd the handle names, with at least `size` bytes.
Status CheckEmulationMemfd(int fd, const std::string& type, const EmulationHandle& h, uint64_t size) {
  const std::string link = platform_util::FdTarget(fd);
  const std::string expected = "/memfd:" + host_emulation::MemfdName(type, h.device, h.serial) + " ";
  if (link.rfind(expected, 0) != 0) {
    return Status(ErrorCode::kNotFound, "host_emulation: fd " + std::to_string(h.fd) + " of process " +
                                            std::to_string(h.pid) + " is not the exported memory (it is " +
                                            link + "; the allocation was freed?)");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno(ErrorCode::kInvalidArgument, "fstat of the handle's memfd");
  if (static_cast<uint64_t>(st.st_size) < size) {
    return InvalidArgument("host_emulation: the handle's range ends at byte " + std::to_string(size) +
                           " but its memfd has " + std::to_string(st.st_size) + " bytes");
  }
  return Status::Ok();
}

constexpr int kDefaultDeviceCount = 2;

// The memory type MC_PLATFORM_EMULATION_DEVICE asks for ("cuda" when unset); nullopt for another value.
std::optional<MemoryType> RequestedType() {
  const char* v = getenv(kPlatformEmulationDeviceEnv);
  if (v == nullptr || std::string(v).empty() || std::string(v) == "cuda") return MemoryType::kCuda;
  if (std::string(v) == "rocm") return MemoryType::kRocm;
  return std::nullopt;
}

// The fabric files this process created and has not freed: unlinked when the process exits normally (platforms
// live until exit and managed buffers are not always freed), so test runs leave no files behind in kFabricDir.
// A process killed (SIGKILL, _exit) still leaves its files. Never destroyed (used from static destructors).
// Each path with the pid that created it: a forked child inherits the set, and must not unlink its parent's.
struct FabricFiles {
  std::mutex mu;
  std::set<std::pair<pid_t, std::string>> paths;
  void Add(const std::string& p) {
    std::lock_guard<std::mutex> lock(mu);
    paths.insert({getpid(), p});
  }
  void Remove(const std::string& p) {
    std::lock_guard<std::mutex> lock(mu);
    paths.erase({getpid(), p});
    unlink(p.c_str());
  }
};
FabricFiles& LiveFabricFiles() {
  static FabricFiles* files = new FabricFiles;
  return *files;
}
struct FabricFilesAtExit {
  ~FabricFilesAtExit() {
    FabricFiles& f = LiveFabricFiles();
    std::lock_guard<std::mutex> lock(f.mu);
    for (const auto& [pid, p] : f.paths) {
      if (pid == getpid()) unlink(p.c_str());
    }
    f.paths.clear();
  }
} fabric_files_at_exit;

// A fresh name for a fabric allocation's file: unique on this machine (pid, serial, random bits).
std::string FabricName(uint64_t serial) {
  uint64_t bits = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &bits, sizeof(bits)) != static_cast<ssize_t>(sizeof(bits))) bits = 0;
    close(fd);
  }
  bits ^= static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&bits));
  char tail[17];
  snprintf(tail, sizeof(tail), "%016llx", static_cast<unsigned long long>(bits));
  // The owner tag first (common/shm_names.h): files of killed processes are found and removed by the next one.
  static const int stale = RemoveStaleShmFiles(host_emulation::kFabricPrefix);
  if (stale > 0) MC_LOG(kInfo) << "host emulation: removed " << stale << " fabric file(s) of exited processes";
  return std::string(host_emulation::kFabricPrefix) + ShmOwnerTag() + "-" + std::to_string(serial) + "-" + tail;
}

class HostEmulationPlatform final : public Platform {
 public:
  /// The registered (plugin) form: enabled only when MC_PLATFORM_EMULATION=1.
  HostEmulationPlatform()
      : HostEmulationPlatform(kDefaultDeviceCount, HostEmulationRequestedByEnv() && RequestedType().has_value(),
                              {}, RequestedType().value_or(MemoryType::kCuda)) {
    if (HostEmulationRequestedByEnv() && !RequestedType()) {
      disabled_why_ = std::string("host_emulation is off: ") + kPlatformEmulationDeviceEnv + "=" +
                      getenv(kPlatformEmulationDeviceEnv) + " is neither cuda nor rocm";
    }
  }
  HostEmulationPlatform(int device_count, bool enabled, std::vector<DeviceLocality> locality = {},
                        MemoryType type = MemoryType::kCuda)
      : device_count_(device_count < 1 ? 1 : device_count),
        enabled_(enabled),
        type_(type),
        type_name_(MemoryTypeName(type)),
        locality_(std::move(locality)),
        worker_(std::make_unique<CopyWorker>()) {
    locality_.resize(static_cast<size_t>(device_count_));
  }

  ~HostEmulationPlatform() override {
    streams_.clear();  // each runs the copies already queued on it: they may touch the regions below
    worker_.reset();
    for (auto& [addr, r] : regions_) {
      munmap(r.map_base, r.map_length);
      if (r.fd >= 0) close(r.fd);
      if (!r.fabric_path.empty()) LiveFabricFiles().Remove(r.fabric_path);
    }
  }

  std::string name() const override { return "host_emulation"; }
  MemoryType device_type() const override { return type_; }

  PlatformProbe Probe() override {
    PlatformProbe p;
    if (!enabled_) {
      p.reason = disabled_why_.empty() ? kDisabled : disabled_why_;
      return p;
    }
    p.usable = true;
    p.device_count = device_count_;
    p.reason = "host EMULATION of " + std::to_string(device_count_) + " " + type_name_ +
               " device(s) on memfd-backed host memory (for tests; not a GPU)";
    return p;
  }

  std::optional<MemoryKind> Classify(const void* ptr) override {
    if (!enabled_) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    const Region* r = Find(reinterpret_cast<uintptr_t>(ptr));
    if (r == nullptr) return std::nullopt;
    if (r->origin == Region::Origin::kPinned) return MemoryKind{MemoryType::kHost, -1};
    return MemoryKind{type_, r->device};
  }

  StatusOr<void*> Allocate(size_t length, AllocationKind kind, int device) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    if (length == 0) return InvalidArgument("host_emulation: cannot allocate 0 bytes");
    const size_t mapped = RoundUpToPage(length);
    if (mapped < length) return InvalidArgument("host_emulation: length " + std::to_string(length) + " too large");
    if (kind == AllocationKind::kPinnedHost) {
      void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return Errno(ErrorCode::kMemory, "mmap of " + std::to_string(mapped) + " bytes");
      std::lock_guard<std::mutex> lock(mu_);
      regions_[reinterpret_cast<uintptr_t>(p)] =
          Region{Region::Origin::kPinned, kind, length, p, mapped, -1, -1, 0};
      return p;
    }
    MC_RETURN_IF_ERROR(CheckDevice(device, false));
    static std::atomic<uint64_t> next_serial{1};  // process-wide: a memfd name is never reused in this process
    const uint64_t serial = next_serial.fetch_add(1);
    std::string fabric_path;
    int fd = -1;
    if (kind == AllocationKind::kFabric) {
      fabric_path = std::string(host_emulation::kFabricDir) + "/" + FabricName(serial);
      fd = open(fabric_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) return Errno(ErrorCode::kMemory, "creating the fabric file " + fabric_path);
    } else {
      fd = memfd_create(host_emulation::MemfdName(type_name_, device, serial).c_str(), MFD_CLOEXEC);
      if (fd < 0) return Errno(ErrorCode::kMemory, "memfd_create");
    }
    auto undo = [&] {
      close(fd);
      if (!fabric_path.empty()) unlink(fabric_path.c_str());
    };
    if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      Status st = Errno(ErrorCode::kMemory, "ftruncate of the memfd to " + std::to_string(mapped) + " bytes");
      undo();
      return st;
    }
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      Status st = Errno(ErrorCode::kMemory, "mmap of " + std::to_string(mapped) + " bytes");
      undo();
      return st;
    }
    if (!fabric_path.empty()) LiveFabricFiles().Add(fabric_path);
    std::lock_guard<std::mutex> lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(p)] = Region{
        Region::Origin::kDevice, kind, length, p, mapped, fd, device, serial, !fabric_path.empty(), fabric_path};
    return p;
  }

  Status Free(void* ptr, size_t length, AllocationKind kind) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == regions_.end() || it->second.origin == Region::Origin::kImported) {
      return InvalidArgument("host_emulation: " + Addr(ptr) + " was not allocated by this platform" +
                             (it != regions_.end() ? " (it is an IPC import: use CloseIpc)" : ""));
    }
    const Region& r = it->second;
    if (r.kind != kind || r.length != length) {
      return InvalidArgument("host_emulation: free of " + Addr(ptr) + " (" + std::to_string(length) +
                             " bytes, kind " + std::to_string(static_cast<int>(kind)) + ") does not match its " +
                             "allocation (" + std::to_string(r.length) + " bytes, kind " +
                             std::to_string(static_cast<int>(r.kind)) + ")");
    }
    munmap(r.map_base, r.map_length);
    if (r.fd >= 0) close(r.fd);
    if (!r.fabric_path.empty()) LiveFabricFiles().Remove(r.fabric_path);  // no new import; mappings keep it
    regions_.erase(it);
    return Status::Ok();
  }

  // Offset of `addr` from the start of r's mapping (byte 0 of its memfd).
  static uint64_t OffsetIn(const Region& r, uintptr_t addr) {
    return addr - reinterpret_cast<uintptr_t>(r.map_base);
  }

  // mu_ held: the device allocation of this platform holding all of [addr, addr+length), or why none does.
  StatusOr<const Region*> DeviceRangeLocked(uintptr_t addr, size_t length) const {
    const Region* r = Find(addr);
    void* ptr = reinterpret_cast<void*>(addr);
    if (r == nullptr || r->origin != Region::Origin::kDevice) {
      return InvalidArgument("host_emulation: " + Addr(ptr) + " is not in a device allocation of this platform" +
                             (r != nullptr ? " (pinned host memory or an IPC import)" : ""));
    }
    const auto base = reinterpret_cast<uintptr_t>(r->map_base);
    if (length > r->length - (addr - base)) {
      return InvalidArgument("host_emulation: " + Range(addr, length) + " runs past its allocation " +
                             Range(base, r->length));
    }
    return r;
  }

  // mu_ held: the device allocation [ptr, ptr+length) lies in, when it is (`fabric`) a kFabric allocation or
  // (!`fabric`) another device allocation; why not otherwise.
  StatusOr<const Region*> ExportableLocked(void* ptr, size_t length, bool fabric) const {
    if (length == 0) return InvalidArgument("host_emulation: cannot export 0 bytes");
    StatusOr<const Region*> found = DeviceRangeLocked(reinterpret_cast<uintptr_t>(ptr), length);
    if (!found.ok() || (*found)->fabric == fabric) return found;
    return InvalidArgument("host_emulation: " + Addr(ptr) + (fabric ? " is not in a fabric allocation (kFabric)"
                                                                    : " is a fabric allocation: use ExportFabric"));
  }

  StatusOr<std::string> ExportIpc(void* ptr, size_t length) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    std::lock_guard<std::mutex> lock(mu_);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    StatusOr<const Region*> found = ExportableLocked(ptr, length, false);
    if (!found.ok()) return found.status();
    const Region* r = *found;
    EmulationHandle h;
    h.pid = getpid();
    h.fd = r->fd;
    h.serial = r->serial;
    h.offset = OffsetIn(*r, addr);
    h.length = length;
    h.device = r->device;
    return h.Encode();
  }

  StatusOr<DmabufExport> ExportDmabuf(const void* ptr, size_t length) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    if (ptr == nullptr || length == 0) {
      return InvalidArgument("host_emulation: ExportDmabuf needs a non-null address and length");
    }
    std::lock_guard<std::mutex> lock(mu_);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    StatusOr<const Region*> found = DeviceRangeLocked(addr, length);
    if (!found.ok()) return found.status();
    const Region* r = *found;
    // The emulation's "dma-buf" is the allocation's memfd (mapped from its byte 0), duplicated for the caller.
    const int fd = fcntl(r->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return Errno(ErrorCode::kMemory, "dup of the allocation's memfd");
    return DmabufExport{fd, OffsetIn(*r, addr)};
  }

  StatusOr<DeviceLocality> Locality(int device) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    MC_RETURN_IF_ERROR(CheckDevice(device, false));
    return locality_[static_cast<size_t>(device)];
  }

  StatusOr<void*> ImportIpc(const std::string& handle, int owner_pid, size_t length) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    StatusOr<EmulationHandle> h = EmulationHandle::Decode(handle);
    if (!h.ok()) return h.status();
    if (h->pid != owner_pid) {
      return InvalidArgument("host_emulation: the handle was exported by process " + std::to_string(h->pid) +
                             ", not by " + std::to_string(owner_pid));
    }
    if (length == 0 || length > h->length) {
      return InvalidArgument("host_emulation: cannot import " + std::to_string(length) + " bytes of a handle for " +
                             std::to_string(h->length));
    }
    StatusOr<int> fd = platform_util::DuplicateRemoteFd(h->pid, h->fd, "host_emulation");
    if (!fd.ok()) return fd.status();
    Status checked = CheckEmulationMemfd(*fd, type_name_, *h, h->offset + length);
    if (!checked.ok()) {
      close(*fd);
      return checked;
    }
    StatusOr<void*> local = MapImported(*fd, h->offset, length, h->device, false, false);
    close(*fd);  // the mapping keeps the memory
    return local;
  }

  // Maps [offset, offset+length) of `fd` as an import of `device` (PROT_READ only when `read_only`); the local
  // address.
  StatusOr<void*> MapImported(int fd, uint64_t offset, size_t length, int device, bool fabric, bool read_only) {
    const uint64_t start = offset / PageSize() * PageSize();
    const size_t delta = static_cast<size_t>(offset - start);
    const size_t map_length = RoundUpToPage(delta + length);
    const int prot = read_only ? PROT_READ : PROT_READ | PROT_WRITE;
    void* base = mmap(nullptr, map_length, prot, MAP_SHARED, fd, static_cast<off_t>(start));
    if (base == MAP_FAILED) return Errno(ErrorCode::kMemory, "mmap of the imported range");
    void* local = static_cast<char*>(base) + delta;
    std::lock_guard<std::mutex> lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(local)] =
        Region{Region::Origin::kImported, AllocationKind::kDevice, length, base, map_length, -1, device, 0, fabric};
    return local;
  }

  StatusOr<std::string> ExportFabric(void* ptr, size_t length) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    std::lock_guard<std::mutex> lock(mu_);
    StatusOr<const Region*> found = ExportableLocked(ptr, length, true);
    if (!found.ok()) return found.status();
    const Region* r = *found;
    host_emulation::EmulationFabricHandle h;
    h.type = type_name_;
    h.name = r->fabric_path.substr(r->fabric_path.rfind('/') + 1);
    h.offset = OffsetIn(*r, reinterpret_cast<uintptr_t>(ptr));
    h.length = length;
    h.device = r->device;
    return h.Encode();
  }

  using Platform::ImportFabric;
  StatusOr<void*> ImportFabric(const std::string& handle, size_t length, FabricAccess access) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    StatusOr<host_emulation::EmulationFabricHandle> h = host_emulation::EmulationFabricHandle::Decode(handle);
    if (!h.ok()) return h.status();
    if (h->type != type_name_) {
      return InvalidArgument("host_emulation: a fabric handle of " + h->type + " memory; this platform emulates " +
                             type_name_);
    }
    if (length == 0 || length > h->length) {
      return InvalidArgument("host_emulation: cannot import " + std::to_string(length) + " bytes of a handle for " +
                             std::to_string(h->length));
    }
    const std::string path = std::string(host_emulation::kFabricDir) + "/" + h->name;
    const bool read_only = access == FabricAccess::kReadOnly;
    int fd = open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      return Status(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInvalidArgument,
                    "host_emulation: opening the fabric file " + path + ": " + strerror(errno) +
                        (errno == ENOENT ? " (the exporter freed it)" : ""));
    }
    struct stat st;
    Status checked = Status::Ok();
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      checked = InvalidArgument("host_emulation: " + path + " is not a fabric file");
    } else if (static_cast<uint64_t>(st.st_size) < h->offset + length) {
      checked = InvalidArgument("host_emulation: the handle's range ends at byte " + std::to_string(h->offset + length) +
                                " but " + path + " has " + std::to_string(st.st_size));
    }
    StatusOr<void*> local = checked.ok() ? MapImported(fd, h->offset, length, h->device, true, read_only) : checked;
    close(fd);  // the mapping keeps the memory
    return local;
  }

  Status CloseFabric(void* mapped, size_t length) override { return CloseImport(mapped, length, true); }

  Status CloseIpc(void* mapped, size_t length) override { return CloseImport(mapped, length, false); }

  Status CloseImport(void* mapped, size_t length, bool fabric) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(mapped));
    if (it == regions_.end() || it->second.origin != Region::Origin::kImported || it->second.fabric != fabric) {
      return InvalidArgument("host_emulation: " + Addr(mapped) + " is not an address " +
                             (fabric ? "ImportFabric" : "ImportIpc") + " returned");
    }
    if (it->second.length != length) {
      return InvalidArgument("host_emulation: CloseIpc of " + Addr(mapped) + " with " + std::to_string(length) +
                             " bytes; it was imported with " + std::to_string(it->second.length));
    }
    munmap(it->second.map_base, it->second.map_length);
    regions_.erase(it);
    return Status::Ok();
  }

  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* dst, const void* src, size_t length, int device,
                                                      void* stream) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    MC_RETURN_IF_ERROR(CheckDevice(device, true));
    if (length > 0 && (dst == nullptr || src == nullptr)) {
      return InvalidArgument("host_emulation: copy of " + std::to_string(length) + " bytes with a null address");
    }
    std::shared_ptr<CopyWorker> on;  // held while submitting, so a racing DestroyStream cannot pull it away
    if (stream != nullptr) {
      std::lock_guard<std::mutex> lock(streams_mu_);
      auto it = streams_.find(stream);
      if (it == streams_.end()) {
        return InvalidArgument("host_emulation: " + Addr(stream) +
                               " is not a stream of this platform (no streams but CreateStream's are accepted)");
      }
      if (device != -1 && device != it->second.device) {
        return InvalidArgument("host_emulation: stream " + Addr(stream) + " belongs to device " +
                               std::to_string(it->second.device) + ", not " + std::to_string(device));
      }
      on = it->second.worker;
    }
    CopyWorker* worker = on ? on.get() : worker_.get();
    return worker->Submit([dst, src, length] {
      Status st = CheckedCopy(dst, src, length);
      if (st.ok()) return st;
      return Status(st.code(), "host_emulation: async copy failed: " + st.message());
    });
  }

  StatusOr<void*> CreateStream(int device) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    MC_RETURN_IF_ERROR(CheckDevice(device, false));
    auto worker = std::make_shared<CopyWorker>();
    void* handle = worker.get();
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams_[handle] = EmulatedStream{device, std::move(worker)};
    return handle;
  }

  Status DestroyStream(void* stream) override {
    MC_RETURN_IF_ERROR(CheckEnabled());
    std::shared_ptr<CopyWorker> gone;
    {
      std::lock_guard<std::mutex> lock(streams_mu_);
      auto it = streams_.find(stream);
      if (it == streams_.end()) {
        return InvalidArgument("host_emulation: " + Addr(stream) + " is not a stream CreateStream made (or it was "
                               "destroyed)");
      }
      gone = std::move(it->second.worker);
      streams_.erase(it);
    }
    gone.reset();  // runs what is queued on it, then ends its thread (outside the lock)
    return Status::Ok();
  }

 private:
  // The region containing `addr`; null when none. Needs mu_.
  const Region* Find(uintptr_t addr) const {
    auto it = regions_.upper_bound(addr);
    if (it == regions_.begin()) return nullptr;
    --it;
    return addr - it->first < it->second.length ? &it->second : nullptr;
  }

  static constexpr const char* kDisabled =
      "host_emulation is off: it is a test EMULATION of a CUDA device on host memory; set MC_PLATFORM_EMULATION=1 "
      "(or create it with MakeHostEmulationPlatform) to use it";

  Status CheckEnabled() const {
    return enabled_ ? Status::Ok() : Status(ErrorCode::kDeviceNotFound, kDisabled);
  }

  Status CheckDevice(int device, bool allow_any) const {
    if ((allow_any && device == -1) || (device >= 0 && device < device_count_)) return Status::Ok();
    return Status(ErrorCode::kDeviceNotFound, "host_emulation: no device " + std::to_string(device) + " (it emulates " +
                                                  std::to_string(device_count_) + ")");
  }

  const int device_count_;
  const bool enabled_;
  const MemoryType type_;          // kCuda or kRocm
  const std::string type_name_;    // "cuda", "rocm"
  std::string disabled_why_;       // set at construction: a bad MC_PLATFORM_EMULATION_DEVICE
  std::vector<DeviceLocality> locality_;  // per device (device_count_ entries); immutable after construction
  std::mutex mu_;
  std::map<uintptr_t, Region> regions_;  // user-visible address -> region
  std::unique_ptr<CopyWorker> worker_;   // the platform's own stream

  struct EmulatedStream {
    int device;
    std::shared_ptr<CopyWorker> worker;
  };
  std::mutex streams_mu_;
  std::map<const void*, EmulatedStream> streams_;  // CreateStream's handle (its worker's address) -> stream
};

}  // namespace

// Linked in: registered at start-up; as a .so: the plugin entry point. Either way the instance is enabled only
// by MC_PLATFORM_EMULATION=1 (its Probe says so otherwise).
MC_PLATFORM_PLUGIN("host_emulation", HostEmulationPlatform, nullptr);

bool HostEmulationRequestedByEnv() {
  const char* v = getenv(kPlatformEmulationEnv);
  return v != nullptr && std::string(v) == "1";
}

std::shared_ptr<Platform> MakeHostEmulationPlatform(int device_count) {
  return std::make_shared<HostEmulationPlatform>(device_count, true);
}

std::shared_ptr<Platform> MakeHostEmulationPlatform(int device_count, std::vector<DeviceLocality> locality) {
  return std::make_shared<HostEmulationPlatform>(device_count, true, std::move(locality));
}

std::shared_ptr<Platform> MakeHostEmulationPlatformOf(MemoryType type, int device_count) {
  if (type != MemoryType::kCuda && type != MemoryType::kRocm) return nullptr;
  return std::make_shared<HostEmulationPlatform>(device_count, true, std::vector<DeviceLocality>{}, type);
}

}  // namespace mooncake::te
