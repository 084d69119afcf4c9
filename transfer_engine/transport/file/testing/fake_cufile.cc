// A FAKE libcufile for tests (never shipped): the cuFile calls the file transport uses, over pread/pwrite on the
// registered descriptor. It only works where "device" memory is host-addressable, i.e. with the host emulation
// platform (MC_PLATFORM_EMULATION=1), which is what the GDS tests run on. FAKE_CUFILE_OPEN_FAILS=1 makes
// cuFileDriverOpen fail as on a host without nvidia-fs. Like cuFile, it refuses a descriptor opened without
// O_DIRECT and a second handle for one descriptor. Counters for the tests: fake_cufile_counters().
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <set>

#include <cufile.h>

namespace {
struct FakeHandle {
  int fd;         // the fake's buffered open of the file
  int registered;  // the caller's O_DIRECT descriptor
};
std::atomic<long> g_reads{0}, g_writes{0}, g_handles{0}, g_buffers{0}, g_opens{0}, g_unregistered_io{0};
std::mutex g_mu;
std::set<int> g_fds;                       // descriptors with a handle (cuFile refuses a second one)
std::map<uintptr_t, size_t> g_registered;  // cuFileBufRegister'ed ranges

// I/O into a pointer that is not the base of a registered range takes cuFile's slow path: counted.
void CountBase(const void* base) {
  std::lock_guard lock(g_mu);
  if (!g_registered.count(reinterpret_cast<uintptr_t>(base))) ++g_unregistered_io;
}
CUfileError_t Ok() { return CUfileError_t{CU_FILE_SUCCESS, CUDA_SUCCESS}; }
}  // namespace

extern "C" {

__attribute__((visibility("default"))) void fake_cufile_counters(long* out) {
  out[0] = g_reads.load();
  out[1] = g_writes.load();
  out[2] = g_handles.load();  // registered now
  out[3] = g_buffers.load();  // registered now
  out[4] = g_opens.load();    // driver opens minus closes
  out[5] = g_unregistered_io.load();
}

__attribute__((visibility("default"))) CUfileError_t cuFileDriverOpen(void) {
  const char* fail = getenv("FAKE_CUFILE_OPEN_FAILS");
  if (fail && fail[0] == '1') return CUfileError_t{CU_FILE_DRIVER_NOT_INITIALIZED, CUDA_SUCCESS};
  ++g_opens;
  return Ok();
}

__attribute__((visibility("default"))) CUfileError_t cuFileDriverClose_v2(void) {
  --g_opens;
  return Ok();
}

__attribute__((visibility("default"))) CUfileError_t cuFileHandleRegister(CUfileHandle_t* fh, CUfileDescr_t* descr) {
  if (!fh || !descr || descr->type != CU_FILE_HANDLE_TYPE_OPAQUE_FD || descr->handle.fd < 0) {
    return CUfileError_t{CU_FILE_INVALID_VALUE, CUDA_SUCCESS};
  }
  // cuFile serves any offset and length on an O_DIRECT descriptor (it bounces unaligned pieces itself); the fake
  // does the same by moving the bytes through a second, buffered open of the same file.
  int flags = fcntl(descr->handle.fd, F_GETFL);
  if (flags < 0 || !(flags & O_DIRECT)) return CUfileError_t{CU_FILE_INVALID_FILE_OPEN_FLAG, CUDA_SUCCESS};
  {
    std::lock_guard lock(g_mu);
    if (!g_fds.insert(descr->handle.fd).second) return CUfileError_t{CU_FILE_HANDLE_ALREADY_REGISTERED, CUDA_SUCCESS};
  }
  char proc[64];
  snprintf(proc, sizeof(proc), "/proc/self/fd/%d", descr->handle.fd);
  int fd = open(proc, O_RDWR | O_CLOEXEC);
  if (fd < 0) fd = open(proc, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::lock_guard lock(g_mu);
    g_fds.erase(descr->handle.fd);
    return CUfileError_t{CU_FILE_INVALID_FILE_TYPE, CUDA_SUCCESS};
  }
  *fh = new FakeHandle{fd, descr->handle.fd};
  ++g_handles;
  return Ok();
}

__attribute__((visibility("default"))) void cuFileHandleDeregister(CUfileHandle_t fh) {
  auto* h = static_cast<FakeHandle*>(fh);
  {
    std::lock_guard lock(g_mu);
    g_fds.erase(h->registered);
  }
  close(h->fd);
  delete h;
  --g_handles;
}

__attribute__((visibility("default"))) CUfileError_t cuFileBufRegister(const void* base, size_t length, int) {
  std::lock_guard lock(g_mu);
  g_registered[reinterpret_cast<uintptr_t>(base)] = length;
  ++g_buffers;
  return Ok();
}

__attribute__((visibility("default"))) CUfileError_t cuFileBufDeregister(const void* base) {
  std::lock_guard lock(g_mu);
  if (g_registered.erase(reinterpret_cast<uintptr_t>(base))) --g_buffers;
  return Ok();
}

__attribute__((visibility("default"))) ssize_t cuFileRead(CUfileHandle_t fh, void* buf, size_t size, off_t file_offset,
                                                          off_t buf_offset) {
  ++g_reads;
  CountBase(buf);
  ssize_t n = pread(static_cast<FakeHandle*>(fh)->fd, static_cast<char*>(buf) + buf_offset, size, file_offset);
  return n;  // -1 with errno, as cuFile reports system errors
}

__attribute__((visibility("default"))) ssize_t cuFileWrite(CUfileHandle_t fh, const void* buf, size_t size,
                                                           off_t file_offset, off_t buf_offset) {
  ++g_writes;
  CountBase(buf);
  return pwrite(static_cast<FakeHandle*>(fh)->fd, static_cast<const char*>(buf) + buf_offset, size, file_offset);
}

}  // extern "C"
