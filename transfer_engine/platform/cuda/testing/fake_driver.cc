// A FAKE CUDA driver for the cuda platform's tests on machines without a GPU: a shared library that exports
// cuGetProcAddress_v2 (or, built with -DFAKE_CUDA_V1_ONLY, only cuGetProcAddress), like libcuda's entry, plus
// test hooks (fake_cuda_stream_ops, fake_cuda_stream_flags, fake_cuda_live_streams, fake_cuda_last_event_flags,
// fake_cuda_primary_retains, fake_cuda_last_dmabuf, below), and implements the entry points the
// platform resolves on host memory. It is not CUDA; it checks the platform's discipline as the real driver would:
// cuInit first, a current context (per thread) for allocations, streams and events, copies and events only on
// streams cuStreamCreate made (or the default streams CU_STREAM_LEGACY / CU_STREAM_PER_THREAD), with the
// stream's own context current; cuStreamCreate takes only CU_STREAM_DEFAULT / CU_STREAM_NON_BLOCKING,
// cuStreamDestroy only a live stream it made (not a default stream, not twice), cuEventCreate only
// CU_EVENT_DISABLE_TIMING, optionally with CU_EVENT_BLOCKING_SYNC. cuPointerGetAttribute(s) answer MEMORY_TYPE and DEVICE_ORDINAL with no context
// current, as the real driver does under unified addressing.
//
// "Device" memory is a memfd mapping (so legacy IPC handles can name it across processes), VMM handles are
// memfds (exported as a dup of the fd, as CUDA's POSIX-fd handles are), host memory is an anonymous mapping.
//
// Knobs (environment, read at cuInit): FAKE_CUDA_DEVICES (default 2), FAKE_CUDA_INIT_RESULT (cuInit's result,
// default 0), FAKE_CUDA_MISSING (an entry point reported as absent), FAKE_CUDA_EVENT_PENDING (how many
// cuEventQuery calls answer CUDA_ERROR_NOT_READY before success), FAKE_CUDA_POINTER_NEEDS_CONTEXT (when 1,
// cuPointerGetAttribute(s) answer CUDA_ERROR_INVALID_CONTEXT on a thread with no current context),
// FAKE_CUDA_NO_DMABUF (when 1, devices report no dma-buf support), FAKE_CUDA_FABRIC (fabric handles, below).
//
// Fabric handles: by default devices report CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 0 and cuMemCreate
// with CU_MEM_HANDLE_TYPE_FABRIC answers CUDA_ERROR_NOT_SUPPORTED (a GPU without an NVSwitch fabric).
// FAKE_CUDA_FABRIC=1: supported; such an allocation's memory is a file /dev/shm/fake-cuda-fabric-<pid>-<n>
// (unlinked when the creating handle is released), its CUmemFabricHandle names that file (FabricBytes), and
// cuMemImportFromShareableHandle(FABRIC) in any process of this machine opens it. FAKE_CUDA_FABRIC=no-imex: the
// attribute says supported but cuMemCreate(FABRIC) answers CUDA_ERROR_NOT_PERMITTED (no IMEX channel).
// A VMM handle exports only as the handle types it was created with.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace {

struct Region {
  size_t size;
  CUmemorytype type;
  int device;
  int fd;          // cuMemAlloc memory: its memfd (for IPC); -1 otherwise
  bool ipc_mapped; // opened by cuIpcOpenMemHandle
  int backing = -1;           // the memfd the range is mapped from (cuMemAlloc, cuMemMap); -1: none
  size_t backing_offset = 0;  // the range's first byte in it
};

struct Vmm {
  int fd;
  size_t size;
  int device;
  unsigned long long handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // cuMemCreate's requested types
  std::string fabric_name;  // the /dev/shm file of a fabric allocation; unlinked at release when `owner`
  bool owner = false;
};

// What the fake's CUmemFabricHandle holds.
struct FabricBytes {
  char magic[8];   // "FAKEFAB"
  uint64_t size;   // of the allocation
  int32_t device;  // where it was created
  char name[44];   // the file under /dev/shm, NUL-terminated
};
static_assert(sizeof(FabricBytes) == sizeof(CUmemFabricHandle), "fills a CUmemFabricHandle");

struct Event {
  int pending;
};

struct IpcBytes {
  char magic[8];
  int pid;
  int fd;
  uint64_t size;
  int device;
};
static_assert(sizeof(IpcBytes) <= sizeof(CUipcMemHandle), "fits a CUipcMemHandle");

std::mutex mu;
bool initialized = false;
int devices = 2;
int event_pending = 0;
bool pointer_needs_context = false;
bool no_dmabuf = false;
enum class Fabric { kNone, kSupported, kNoImex } fabric = Fabric::kNone;
unsigned fabric_serial = 0;  // names this process's fabric files (mu)
CUdeviceptr last_dmabuf_ptr = 0;  // the last successful cuMemGetHandleForAddressRange's range
size_t last_dmabuf_size = 0;
std::map<int, int> primary_retains;  // device -> cuDevicePrimaryCtxRetain calls
std::string missing;
std::map<uintptr_t, Region> regions;
thread_local int current = -1;  // device of the current context

int EnvInt(const char* name, int fallback) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? atoi(v) : fallback;
}

CUresult Ready(bool need_context) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (need_context && current < 0) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

const Region* Find(uintptr_t p, uintptr_t* base) {
  auto it = regions.upper_bound(p);
  if (it == regions.begin()) return nullptr;
  --it;
  if (p - it->first >= it->second.size) return nullptr;
  *base = it->first;
  return &it->second;
}

CUresult FakeInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = static_cast<CUresult>(EnvInt("FAKE_CUDA_INIT_RESULT", 0));
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(mu);
  devices = EnvInt("FAKE_CUDA_DEVICES", 2);
  event_pending = EnvInt("FAKE_CUDA_EVENT_PENDING", 0);
  pointer_needs_context = EnvInt("FAKE_CUDA_POINTER_NEEDS_CONTEXT", 0) == 1;
  no_dmabuf = EnvInt("FAKE_CUDA_NO_DMABUF", 0) == 1;
  const char* f = getenv("FAKE_CUDA_FABRIC");
  const std::string fabric_knob = f != nullptr ? f : "";
  fabric = fabric_knob == "1" ? Fabric::kSupported : fabric_knob == "no-imex" ? Fabric::kNoImex : Fabric::kNone;
  initialized = true;
  return CUDA_SUCCESS;
}

CUresult FakeDriverGetVersion(int* v) {
  *v = 12090;
  return CUDA_SUCCESS;
}

CUresult FakeGetErrorName(CUresult r, const char** s) {
  switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_PERMITTED: *s = "CUDA_ERROR_NOT_PERMITTED"; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult FakeGetErrorString(CUresult r, const char** s) {
  if (r == CUDA_ERROR_NO_DEVICE) {
    *s = "no CUDA-capable device is detected";
    return CUDA_SUCCESS;
  }
  const char* name = nullptr;
  if (FakeGetErrorName(r, &name) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  *s = "fake driver error";
  return CUDA_SUCCESS;
}

CUresult FakeDeviceGetCount(int* n) {
  if (CUresult r = Ready(false)) return r;
  *n = devices;
  return CUDA_SUCCESS;
}

CUresult FakeDeviceGet(CUdevice* d, int ordinal) {
  if (CUresult r = Ready(false)) return r;
  if (ordinal < 0 || ordinal >= devices) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

// PCI address of device d: domain 0, bus 0x3b + d, device 0; dma-buf supported unless FAKE_CUDA_NO_DMABUF=1;
// fabric handles as FAKE_CUDA_FABRIC says.
CUresult FakeDeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice d) {
  if (CUresult r = Ready(false)) return r;
  if (d < 0 || d >= devices) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = 0x3b + d; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: *v = no_dmabuf ? 0 : 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: *v = fabric == Fabric::kNone ? 0 : 1; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult FakePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (CUresult r = Ready(false)) return r;
  if (d < 0 || d >= devices) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(mu);
  ++primary_retains[d];
  *ctx = reinterpret_cast<CUcontext>(static_cast<intptr_t>(d) + 1);
  return CUDA_SUCCESS;
}

CUresult FakeCtxSetCurrent(CUcontext ctx) {
  if (CUresult r = Ready(false)) return r;
  const intptr_t v = reinterpret_cast<intptr_t>(ctx);
  if (v < 0 || v > devices) return CUDA_ERROR_INVALID_CONTEXT;
  current = static_cast<int>(v) - 1;
  return CUDA_SUCCESS;
}

CUresult FakeCtxGetCurrent(CUcontext* ctx) {
  if (CUresult r = Ready(false)) return r;
  *ctx = current < 0 ? nullptr : reinterpret_cast<CUcontext>(static_cast<intptr_t>(current) + 1);
  return CUDA_SUCCESS;
}

CUresult Attribute(CUpointer_attribute attr, void* data, CUdeviceptr ptr) {
  uintptr_t base = 0;
  const Region* r = Find(static_cast<uintptr_t>(ptr), &base);
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned int*>(data) = r ? r->type : 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = r ? r->device : -2; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult FakePointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  if (CUresult r = Ready(pointer_needs_context)) return r;
  std::lock_guard<std::mutex> lock(mu);
  uintptr_t base = 0;
  if (Find(static_cast<uintptr_t>(ptr), &base) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Attribute(attr, data, ptr);
}

CUresult FakePointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  if (CUresult r = Ready(pointer_needs_context)) return r;
  std::lock_guard<std::mutex> lock(mu);
  for (unsigned int i = 0; i < n; ++i) {
    if (CUresult r = Attribute(attrs[i], data[i], ptr)) return r;
  }
  return CUDA_SUCCESS;
}

CUresult FakeMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  if (CUresult r = Ready(true)) return r;
  std::lock_guard<std::mutex> lock(mu);
  uintptr_t b = 0;
  const Region* r = Find(static_cast<uintptr_t>(ptr), &b);
  if (r == nullptr || r->type != CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_NOT_FOUND;
  *base = b;
  *size = r->size;
  return CUDA_SUCCESS;
}

CUresult FakeMemAlloc(CUdeviceptr* out, size_t size) {
  if (CUresult r = Ready(true)) return r;
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  int fd = memfd_create("fake-cuda-device-memory", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(mu);
  regions[reinterpret_cast<uintptr_t>(p)] = Region{size, CU_MEMORYTYPE_DEVICE, current, fd, false, fd, 0};
  *out = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

CUresult FakeMemFree(CUdeviceptr ptr) {
  if (CUresult r = Ready(true)) return r;
  std::lock_guard<std::mutex> lock(mu);
  auto it = regions.find(static_cast<uintptr_t>(ptr));
  if (it == regions.end() || it->second.fd < 0) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(it->first), it->second.size);
  close(it->second.fd);
  regions.erase(it);
  return CUDA_SUCCESS;
}

CUresult FakeMemHostAlloc(void** out, size_t size, unsigned int) {
  if (CUresult r = Ready(true)) return r;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(mu);
  regions[reinterpret_cast<uintptr_t>(p)] = Region{size, CU_MEMORYTYPE_HOST, current, -1, false};
  *out = p;
  return CUDA_SUCCESS;
}

CUresult FakeMemFreeHost(void* p) {
  if (CUresult r = Ready(true)) return r;
  std::lock_guard<std::mutex> lock(mu);
  auto it = regions.find(reinterpret_cast<uintptr_t>(p));
  if (it == regions.end() || it->second.type != CU_MEMORYTYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.size);
  regions.erase(it);
  return CUDA_SUCCESS;
}

constexpr size_t kGranularity = 2 << 20;

CUresult FakeGranularity(size_t* g, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags) {
  if (CUresult r = Ready(false)) return r;
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
      prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_FABRIC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *g = kGranularity;
  return CUDA_SUCCESS;
}

std::string FabricPath(const std::string& name) { return "/dev/shm/" + name; }

// A fabric allocation of `size` bytes on `device`: a new /dev/shm file, owned by the handle.
CUresult CreateFabric(CUmemGenericAllocationHandle* h, size_t size, int device) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mu);
    // The clock too: sandboxed runs share /dev/shm and pids, and a run that leaked would block a later one's name.
    name = "fake-cuda-fabric-" + std::to_string(getpid()) + "-" + std::to_string(fabric_serial++) + "-" +
           std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
  }
  const std::string path = FabricPath(name);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    unlink(path.c_str());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *h = reinterpret_cast<uintptr_t>(new Vmm{fd, size, device, CU_MEM_HANDLE_TYPE_FABRIC, name, true});
  return CUDA_SUCCESS;
}

CUresult FakeMemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                       unsigned long long) {
  if (CUresult r = Ready(true)) return r;
  if (size == 0 || size % kGranularity != 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const unsigned long long types = prop->requestedHandleTypes;
  if (types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && types != CU_MEM_HANDLE_TYPE_FABRIC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (types == CU_MEM_HANDLE_TYPE_FABRIC) {
    if (fabric == Fabric::kNone) return CUDA_ERROR_NOT_SUPPORTED;
    if (fabric == Fabric::kNoImex) return CUDA_ERROR_NOT_PERMITTED;
    return CreateFabric(h, size, prop->location.id);
  }
  int fd = memfd_create("fake-cuda-vmm", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *h = reinterpret_cast<uintptr_t>(new Vmm{fd, size, prop->location.id});
  return CUDA_SUCCESS;
}

CUresult FakeMemRelease(CUmemGenericAllocationHandle h) {
  if (CUresult r = Ready(false)) return r;
  Vmm* v = reinterpret_cast<Vmm*>(h);
  close(v->fd);
  if (v->owner) unlink(FabricPath(v->fabric_name).c_str());
  delete v;
  return CUDA_SUCCESS;
}

CUresult FakeAddressReserve(CUdeviceptr* va, size_t size, size_t, CUdeviceptr, unsigned long long) {
  if (CUresult r = Ready(false)) return r;
  void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *va = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

CUresult FakeAddressFree(CUdeviceptr va, size_t size) {
  if (CUresult r = Ready(false)) return r;
  munmap(reinterpret_cast<void*>(va), size);
  return CUDA_SUCCESS;
}

CUresult FakeMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long) {
  if (CUresult r = Ready(false)) return r;
  Vmm* v = reinterpret_cast<Vmm*>(h);
  if (offset + size > v->size) return CUDA_ERROR_INVALID_VALUE;
  void* p = mmap(reinterpret_cast<void*>(va), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, v->fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(mu);
  regions[va] = Region{size, CU_MEMORYTYPE_DEVICE, v->device, -1, false, v->fd, offset};
  return CUDA_SUCCESS;
}

CUresult FakeMemUnmap(CUdeviceptr va, size_t size) {
  if (CUresult r = Ready(false)) return r;
  mmap(reinterpret_cast<void*>(va), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  std::lock_guard<std::mutex> lock(mu);
  regions.erase(va);
  return CUDA_SUCCESS;
}

// The host mapping gets the access of the descriptors (PROT_READ: writes through it fault, as on a GPU).
CUresult FakeMemSetAccess(CUdeviceptr va, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (CUresult r = Ready(false)) return r;
  std::lock_guard<std::mutex> lock(mu);
  if (regions.count(va) == 0 || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {  // one descriptor per device, each a device of this fake
    if (desc[i].location.id < 0 || desc[i].location.id >= devices) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].flags != desc[0].flags || (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
                                           desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  const int prot = desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ : PROT_READ | PROT_WRITE;
  return mprotect(reinterpret_cast<void*>(va), size, prot) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult FakeExport(void* out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type, unsigned long long) {
  if (CUresult r = Ready(false)) return r;
  const Vmm* v = reinterpret_cast<Vmm*>(h);
  if ((v->handle_types & type) == 0) return CUDA_ERROR_INVALID_VALUE;  // not requested at cuMemCreate
  if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
    FabricBytes b{};
    memcpy(b.magic, "FAKEFAB", 8);
    b.size = v->size;
    b.device = v->device;
    snprintf(b.name, sizeof(b.name), "%s", v->fabric_name.c_str());
    memcpy(out, &b, sizeof(b));
    return CUDA_SUCCESS;
  }
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(out) = fd;
  return CUDA_SUCCESS;
}

// A fabric handle FakeExport made, in any process: CUDA_ERROR_NOT_SUPPORTED where fabric handles are off,
// CUDA_ERROR_INVALID_VALUE for bytes that are not such a handle or whose allocation is released.
CUresult ImportFabric(CUmemGenericAllocationHandle* h, const void* os_handle) {
  if (fabric == Fabric::kNone) return CUDA_ERROR_NOT_SUPPORTED;
  if (fabric == Fabric::kNoImex) return CUDA_ERROR_NOT_PERMITTED;
  if (os_handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FabricBytes b;
  memcpy(&b, os_handle, sizeof(b));
  if (memcmp(b.magic, "FAKEFAB", 8) != 0 || memchr(b.name, '\0', sizeof(b.name)) == nullptr ||
      strchr(b.name, '/') != nullptr || strncmp(b.name, "fake-cuda-fabric-", 17) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = open(FabricPath(b.name).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != b.size) {
    close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  *h = reinterpret_cast<uintptr_t>(
      new Vmm{fd, static_cast<size_t>(b.size), current < 0 ? 0 : current, CU_MEM_HANDLE_TYPE_FABRIC, b.name, false});
  return CUDA_SUCCESS;
}

CUresult FakeImport(CUmemGenericAllocationHandle* h, void* os_handle, CUmemAllocationHandleType type) {
  if (CUresult r = Ready(false)) return r;
  if (type == CU_MEM_HANDLE_TYPE_FABRIC) return ImportFabric(h, os_handle);
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  struct stat st;
  if (fstat(fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
  int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *h = reinterpret_cast<uintptr_t>(new Vmm{copy, static_cast<size_t>(st.st_size), current < 0 ? 0 : current});
  return CUDA_SUCCESS;
}

CUresult FakeIpcGet(CUipcMemHandle* h, CUdeviceptr ptr) {
  if (CUresult r = Ready(true)) return r;
  std::lock_guard<std::mutex> lock(mu);
  auto it = regions.find(static_cast<uintptr_t>(ptr));
  if (it == regions.end() || it->second.fd < 0) return CUDA_ERROR_INVALID_VALUE;  // not a cuMemAlloc base
  IpcBytes b{{'F', 'A', 'K', 'E', 'I', 'P', 'C', 0}, getpid(), it->second.fd, it->second.size, it->second.device};
  memset(h, 0, sizeof(*h));
  memcpy(h->reserved, &b, sizeof(b));
  return CUDA_SUCCESS;
}

CUresult FakeIpcOpen(CUdeviceptr* out, CUipcMemHandle h, unsigned int) {
  if (CUresult r = Ready(true)) return r;
  IpcBytes b;
  memcpy(&b, h.reserved, sizeof(b));
  if (memcmp(b.magic, "FAKEIPC", 8) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (b.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // CUDA refuses handles of the same process
  const std::string path = "/proc/" + std::to_string(b.pid) + "/fd/" + std::to_string(b.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  void* p = mmap(nullptr, b.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(mu);
  regions[reinterpret_cast<uintptr_t>(p)] = Region{b.size, CU_MEMORYTYPE_DEVICE, current, -1, true};
  *out = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

CUresult FakeIpcClose(CUdeviceptr ptr) {
  if (CUresult r = Ready(true)) return r;
  std::lock_guard<std::mutex> lock(mu);
  auto it = regions.find(static_cast<uintptr_t>(ptr));
  if (it == regions.end() || !it->second.ipc_mapped) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(it->first), it->second.size);
  regions.erase(it);
  return CUDA_SUCCESS;
}

// As CUDA documents it: a dma-buf fd for [dptr, dptr+size) of one device allocation (cuMemAlloc, or a fully
// mapped cuMemMap range), dptr and size aligned to the host page size, flags 0 or
// CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE; CUDA_ERROR_NOT_SUPPORTED where the device has no dma-buf support
// (FAKE_CUDA_NO_DMABUF=1) or for IPC-mapped memory. The fd is a dup of the memfd behind the allocation (a
// memfd, not a dma-buf: its byte 0 is the allocation's, see fake_cuda_last_dmabuf).
CUresult FakeMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,
                                         unsigned long long flags) {
  if (CUresult r = Ready(true)) return r;
  if (handle == nullptr || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & ~static_cast<unsigned long long>(CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (size == 0 || dptr % page != 0 || size % page != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu);
  uintptr_t base = 0;
  const Region* r = Find(static_cast<uintptr_t>(dptr), &base);
  if (r == nullptr || r->type != CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  const size_t mapped = (r->size + page - 1) / page * page;  // allocations occupy whole pages
  if (dptr - base > mapped || size > mapped - (dptr - base)) return CUDA_ERROR_INVALID_VALUE;
  if (no_dmabuf || r->backing < 0) return CUDA_ERROR_NOT_SUPPORTED;
  const int fd = fcntl(r->backing, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(handle) = fd;
  last_dmabuf_ptr = dptr;
  last_dmabuf_size = size;
  return CUDA_SUCCESS;
}

constexpr uintptr_t kStreamMagic = 0x5157;

// A stream: what cuStreamCreate returns, and the two default streams (of whichever context is current).
struct Stream {
  uintptr_t magic = kStreamMagic;
  int device;          // of the context it was created in; -1: a default stream
  unsigned flags = 0;  // as cuStreamCreate got them
  int copies = 0;      // cuMemcpyAsync calls enqueued on it
  int events = 0;      // cuEventRecord calls on it
};

Stream legacy_stream{kStreamMagic, -1};
Stream per_thread_stream{kStreamMagic, -1};
std::set<Stream*> live_streams;  // cuStreamCreate's, not yet destroyed (mu)
unsigned last_event_flags = 0;   // of the last cuEventCreate that succeeded (mu)

// The stream behind handle `s`; null when it is not one (including the null handle and destroyed streams). mu held.
Stream* FindStream(CUstream s) {
  if (s == CU_STREAM_LEGACY) return &legacy_stream;
  if (s == CU_STREAM_PER_THREAD) return &per_thread_stream;
  auto it = live_streams.find(reinterpret_cast<Stream*>(s));
  return it == live_streams.end() ? nullptr : *it;
}

// Work may be enqueued on `s` from this thread: a stream, in the current context. mu held.
CUresult Usable(CUstream s, Stream** out) {
  Stream* st = FindStream(s);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (st->device >= 0 && st->device != current) return CUDA_ERROR_INVALID_CONTEXT;
  *out = st;
  return CUDA_SUCCESS;
}

CUresult FakeStreamCreate(CUstream* s, unsigned int flags) {
  if (CUresult r = Ready(true)) return r;
  if (s == nullptr || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu);
  Stream* st = new Stream{kStreamMagic, current, flags};
  live_streams.insert(st);
  *s = reinterpret_cast<CUstream>(st);
  return CUDA_SUCCESS;
}

CUresult FakeStreamDestroy(CUstream s) {
  if (CUresult r = Ready(false)) return r;
  std::lock_guard<std::mutex> lock(mu);
  auto it = live_streams.find(reinterpret_cast<Stream*>(s));
  if (it == live_streams.end()) return CUDA_ERROR_INVALID_HANDLE;  // null, a default stream, unknown or destroyed
  delete *it;
  live_streams.erase(it);
  return CUDA_SUCCESS;
}

CUresult FakeStreamSynchronize(CUstream s) {
  if (CUresult r = Ready(true)) return r;
  std::lock_guard<std::mutex> lock(mu);
  Stream* st = nullptr;
  return Usable(s, &st);
}

CUresult FakeMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  if (CUresult r = Ready(true)) return r;
  std::lock_guard<std::mutex> lock(mu);
  Stream* st = nullptr;
  if (CUresult r = Usable(s, &st)) return r;
  ++st->copies;
  memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult FakeEventCreate(CUevent* e, unsigned int flags) {
  if (CUresult r = Ready(true)) return r;
  if ((flags & CU_EVENT_DISABLE_TIMING) == 0 || (flags & ~(CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> lock(mu);
  last_event_flags = flags;
  *e = reinterpret_cast<CUevent>(new Event{event_pending});
  return CUDA_SUCCESS;
}

CUresult FakeEventRecord(CUevent, CUstream s) {
  if (CUresult r = Ready(true)) return r;
  std::lock_guard<std::mutex> lock(mu);
  Stream* st = nullptr;
  if (CUresult r = Usable(s, &st)) return r;
  ++st->events;
  return CUDA_SUCCESS;
}

CUresult FakeEventQuery(CUevent e) {
  if (CUresult r = Ready(false)) return r;
  Event* ev = reinterpret_cast<Event*>(e);
  if (ev->pending > 0) {
    --ev->pending;
    return CUDA_ERROR_NOT_READY;
  }
  return CUDA_SUCCESS;
}

CUresult FakeEventSynchronize(CUevent e) {
  if (CUresult r = Ready(false)) return r;
  reinterpret_cast<Event*>(e)->pending = 0;
  return CUDA_SUCCESS;
}

CUresult FakeEventDestroy(CUevent e) {
  if (CUresult r = Ready(false)) return r;
  delete reinterpret_cast<Event*>(e);
  return CUDA_SUCCESS;
}

struct Entry {
  const char* name;
  int version;  // the ABI the platform must ask for
  void* fn;
};

// #name and ## take the bare token: cuda.h's renaming macros (cuMemAlloc -> cuMemAlloc_v2) do not apply.
#define FAKE_ENTRY(name, version, fn) \
  { #name, version, reinterpret_cast<void*>(static_cast<PFN_##name##_v##version>(fn)) }

const Entry kEntries[] = {
    FAKE_ENTRY(cuInit, 2000, FakeInit),
    FAKE_ENTRY(cuDriverGetVersion, 2020, FakeDriverGetVersion),
    FAKE_ENTRY(cuGetErrorName, 6000, FakeGetErrorName),
    FAKE_ENTRY(cuGetErrorString, 6000, FakeGetErrorString),
    FAKE_ENTRY(cuDeviceGetCount, 2000, FakeDeviceGetCount),
    FAKE_ENTRY(cuDeviceGet, 2000, FakeDeviceGet),
    FAKE_ENTRY(cuDeviceGetAttribute, 2000, FakeDeviceGetAttribute),
    FAKE_ENTRY(cuDevicePrimaryCtxRetain, 7000, FakePrimaryCtxRetain),
    FAKE_ENTRY(cuCtxSetCurrent, 4000, FakeCtxSetCurrent),
    FAKE_ENTRY(cuCtxGetCurrent, 4000, FakeCtxGetCurrent),
    FAKE_ENTRY(cuPointerGetAttribute, 4000, FakePointerGetAttribute),
    FAKE_ENTRY(cuPointerGetAttributes, 7000, FakePointerGetAttributes),
    FAKE_ENTRY(cuMemGetAddressRange, 3020, FakeMemGetAddressRange),
    FAKE_ENTRY(cuMemAlloc, 3020, FakeMemAlloc),
    FAKE_ENTRY(cuMemFree, 3020, FakeMemFree),
    FAKE_ENTRY(cuMemHostAlloc, 2020, FakeMemHostAlloc),
    FAKE_ENTRY(cuMemFreeHost, 2000, FakeMemFreeHost),
    FAKE_ENTRY(cuMemGetAllocationGranularity, 10020, FakeGranularity),
    FAKE_ENTRY(cuMemCreate, 10020, FakeMemCreate),
    FAKE_ENTRY(cuMemRelease, 10020, FakeMemRelease),
    FAKE_ENTRY(cuMemAddressReserve, 10020, FakeAddressReserve),
    FAKE_ENTRY(cuMemAddressFree, 10020, FakeAddressFree),
    FAKE_ENTRY(cuMemMap, 10020, FakeMemMap),
    FAKE_ENTRY(cuMemUnmap, 10020, FakeMemUnmap),
    FAKE_ENTRY(cuMemSetAccess, 10020, FakeMemSetAccess),
    FAKE_ENTRY(cuMemExportToShareableHandle, 10020, FakeExport),
    FAKE_ENTRY(cuMemImportFromShareableHandle, 10020, FakeImport),
    FAKE_ENTRY(cuIpcGetMemHandle, 4010, FakeIpcGet),
    FAKE_ENTRY(cuIpcOpenMemHandle, 11000, FakeIpcOpen),
    FAKE_ENTRY(cuIpcCloseMemHandle, 4010, FakeIpcClose),
    FAKE_ENTRY(cuMemcpyAsync, 4000, FakeMemcpyAsync),
    FAKE_ENTRY(cuStreamCreate, 2000, FakeStreamCreate),
    FAKE_ENTRY(cuStreamDestroy, 4000, FakeStreamDestroy),
    FAKE_ENTRY(cuStreamSynchronize, 2000, FakeStreamSynchronize),
    FAKE_ENTRY(cuEventCreate, 2000, FakeEventCreate),
    FAKE_ENTRY(cuEventRecord, 2000, FakeEventRecord),
    FAKE_ENTRY(cuEventQuery, 2000, FakeEventQuery),
    FAKE_ENTRY(cuEventSynchronize, 2000, FakeEventSynchronize),
    FAKE_ENTRY(cuEventDestroy, 4000, FakeEventDestroy),
    FAKE_ENTRY(cuMemGetHandleForAddressRange, 11070, FakeMemGetHandleForAddressRange),
};

CUresult Lookup(const char* symbol, void** pfn, int version, CUdriverProcAddressQueryResult* found) {
  const char* absent = getenv("FAKE_CUDA_MISSING");
  for (const Entry& e : kEntries) {
    if (strcmp(e.name, symbol) != 0) continue;
    if ((absent != nullptr && strcmp(absent, symbol) == 0) || version != e.version) break;
    *pfn = e.fn;
    if (found != nullptr) *found = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  *pfn = nullptr;
  if (found != nullptr) *found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return found != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace

// Test hook (not a CUDA entry point): how many copies and event records were enqueued on stream `s` so far.
// CUDA_ERROR_INVALID_HANDLE when `s` is not a stream of this driver.
extern "C" __attribute__((visibility("default"))) CUresult fake_cuda_stream_ops(CUstream s, int* copies,
                                                                                int* events) {
  std::lock_guard<std::mutex> lock(mu);
  Stream* st = FindStream(s);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *copies = st->copies;
  *events = st->events;
  return CUDA_SUCCESS;
}

// Test hook (not a CUDA entry point): the flags stream `s` was created with. CUDA_ERROR_INVALID_HANDLE when `s` is
// not a live stream cuStreamCreate made.
extern "C" __attribute__((visibility("default"))) CUresult fake_cuda_stream_flags(CUstream s, unsigned* flags) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = live_streams.find(reinterpret_cast<Stream*>(s));
  if (it == live_streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  *flags = (*it)->flags;
  return CUDA_SUCCESS;
}

// Test hook (not a CUDA entry point): streams cuStreamCreate made that are not destroyed yet.
extern "C" __attribute__((visibility("default"))) int fake_cuda_live_streams() {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<int>(live_streams.size());
}

// Test hook (not a CUDA entry point): the flags of the last event cuEventCreate made (0 before any).
extern "C" __attribute__((visibility("default"))) unsigned fake_cuda_last_event_flags() {
  std::lock_guard<std::mutex> lock(mu);
  return last_event_flags;
}

// Test hook (not a CUDA entry point): how many times device `device`'s primary context was retained so far.
extern "C" __attribute__((visibility("default"))) int fake_cuda_primary_retains(int device) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = primary_retains.find(device);
  return it == primary_retains.end() ? 0 : it->second;
}

// Test hook (not a CUDA entry point): the range of the last successful cuMemGetHandleForAddressRange, and where
// its first byte lies in the memfd the returned fd duplicates (the fake's fd is that memfd, not a dma-buf that
// starts at the range). CUDA_ERROR_NOT_FOUND before any.
extern "C" __attribute__((visibility("default"))) CUresult fake_cuda_last_dmabuf(CUdeviceptr* ptr, size_t* size,
                                                                                 size_t* backing_offset) {
  std::lock_guard<std::mutex> lock(mu);
  if (last_dmabuf_size == 0) return CUDA_ERROR_NOT_FOUND;
  uintptr_t base = 0;
  const Region* r = Find(static_cast<uintptr_t>(last_dmabuf_ptr), &base);
  *ptr = last_dmabuf_ptr;
  *size = last_dmabuf_size;
  *backing_offset = r != nullptr ? r->backing_offset + (last_dmabuf_ptr - base) : 0;
  return CUDA_SUCCESS;
}

#ifdef FAKE_CUDA_V1_ONLY
#undef cuGetProcAddress  // cuda.h maps it to cuGetProcAddress_v2; this is the 11.3 ABI
extern "C" __attribute__((visibility("default"))) CUresult cuGetProcAddress(const char* symbol, void** pfn,
                                                                            int version, cuuint64_t) {
  return Lookup(symbol, pfn, version, nullptr);
}
#else
extern "C" __attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char* symbol, void** pfn,
                                                                               int version, cuuint64_t,
                                                                               CUdriverProcAddressQueryResult* found) {
  return Lookup(symbol, pfn, version, found);
}
#endif
