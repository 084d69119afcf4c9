#include "transfer_engine/transport/file/gds.h"

#include <dlfcn.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <cufile.h>

#include <string>

namespace mooncake::te::file {

// The cuFile calls this transport uses, as cufile.h declares them.
struct Gds::Api {
  decltype(&::cuFileDriverOpen) driver_open = nullptr;
  CUfileError_t (*driver_close)() = nullptr;  // cufile.h maps cuFileDriverClose to cuFileDriverClose_v2
  decltype(&::cuFileHandleRegister) handle_register = nullptr;
  decltype(&::cuFileHandleDeregister) handle_deregister = nullptr;
  decltype(&::cuFileBufRegister) buf_register = nullptr;
  decltype(&::cuFileBufDeregister) buf_deregister = nullptr;
  decltype(&::cuFileRead) read = nullptr;
  decltype(&::cuFileWrite) write = nullptr;
};

namespace {

std::string ErrorText(const CUfileError_t& e) {
  std::string s = "cuFile error " + std::to_string(static_cast<int>(e.err));
  if (e.err == CU_FILE_CUDA_DRIVER_ERROR) s += " (CUDA driver error " + std::to_string(static_cast<int>(e.cu_err)) + ")";
  return s;
}

template <typename F>
bool Resolve(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

}  // namespace

StatusOr<std::unique_ptr<Gds>> Gds::Open(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    return Status(ErrorCode::kNotImplemented, std::string(e ? e : (library + " does not load")));
  }
  std::unique_ptr<Gds> g(new Gds());
  g->library_ = lib;
  g->api_ = std::make_unique<Api>();
  Api& a = *g->api_;
  const char* missing = nullptr;
  if (!Resolve(lib, "cuFileDriverOpen", a.driver_open)) missing = "cuFileDriverOpen";
  if (!missing && !Resolve(lib, "cuFileDriverClose_v2", a.driver_close) &&
      !Resolve(lib, "cuFileDriverClose", a.driver_close)) {
    missing = "cuFileDriverClose_v2";
  }
  if (!missing && !Resolve(lib, "cuFileHandleRegister", a.handle_register)) missing = "cuFileHandleRegister";
  if (!missing && !Resolve(lib, "cuFileHandleDeregister", a.handle_deregister)) missing = "cuFileHandleDeregister";
  if (!missing && !Resolve(lib, "cuFileBufRegister", a.buf_register)) missing = "cuFileBufRegister";
  if (!missing && !Resolve(lib, "cuFileBufDeregister", a.buf_deregister)) missing = "cuFileBufDeregister";
  if (!missing && !Resolve(lib, "cuFileRead", a.read)) missing = "cuFileRead";
  if (!missing && !Resolve(lib, "cuFileWrite", a.write)) missing = "cuFileWrite";
  if (missing) {
    g->api_.reset();  // nothing to close
    return Status(ErrorCode::kNotImplemented, library + " has no " + missing);
  }
  CUfileError_t st = a.driver_open();
  if (st.err != CU_FILE_SUCCESS) {
    g->api_.reset();
    return Status(ErrorCode::kNotImplemented, "cuFileDriverOpen failed: " + ErrorText(st));
  }
  g->description_ = "cuFile via " + library;
  return g;
}

Gds::~Gds() {
  if (api_) api_->driver_close();
  // library_ stays loaded: cuFile may keep threads and the handles' release functions point into it.
}

Status Gds::RegisterBuffer(void* device_ptr, size_t length) {
  CUfileError_t st = api_->buf_register(device_ptr, length, 0);
  if (st.err != CU_FILE_SUCCESS) return Status(ErrorCode::kNotImplemented, "cuFileBufRegister: " + ErrorText(st));
  return Status::Ok();
}

void Gds::DeregisterBuffer(void* device_ptr) { api_->buf_deregister(device_ptr); }

namespace {

// A file's cuFile handle and the O_DIRECT descriptor it was made on when the OpenFile has none of its own.
struct FileHandle {
  CUfileHandle_t handle = nullptr;
  int own_fd = -1;
};

}  // namespace

Status Gds::Transfer(OpenFile& file, bool write, void* base, size_t base_offset, size_t length, uint64_t offset) {
  std::string why;
  auto* api = api_.get();
  void* attached = file.Attachment(
      [&]() -> void* {
        int fd = file.direct_fd(), own = -1;
        if (!file.direct()) {  // opened through the page cache: GDS needs O_DIRECT
          own = open(file.path().c_str(), (file.read_only() ? O_RDONLY : O_RDWR) | O_DIRECT | O_CLOEXEC);
          if (own < 0) {
            why = "GDS needs O_DIRECT, which '" + file.path() + "' refuses: " + ErrnoText(errno);
            return nullptr;
          }
          fd = own;
        }
        CUfileDescr_t descr{};
        descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
        descr.handle.fd = fd;
        CUfileHandle_t handle = nullptr;
        CUfileError_t st = api->handle_register(&handle, &descr);
        if (st.err != CU_FILE_SUCCESS) {
          why = "cuFileHandleRegister of '" + file.path() + "': " + ErrorText(st);
          if (own >= 0) close(own);
          return nullptr;
        }
        return new FileHandle{handle, own};
      },
      [api](void* p) {
        auto* h = static_cast<FileHandle*>(p);
        api->handle_deregister(h->handle);
        if (h->own_fd >= 0) close(h->own_fd);
        delete h;
      });
  if (!attached) return Status(ErrorCode::kContext, why.empty() ? "no cuFile handle for '" + file.path() + "'" : why);
  CUfileHandle_t handle = static_cast<FileHandle*>(attached)->handle;
  size_t done = 0;
  while (done < length) {
    const auto at = static_cast<off_t>(offset + done);
    const auto in_buf = static_cast<off_t>(base_offset + done);
    ssize_t n = write ? api->write(handle, base, length - done, at, in_buf) : api->read(handle, base, length - done, at, in_buf);
    if (n < 0) {
      return Status(ErrorCode::kContext, std::string(write ? "cuFileWrite" : "cuFileRead") + " of '" + file.path() +
                                             "' failed: " + (n == -1 ? ErrnoText(errno) : "error " + std::to_string(n)));
    }
    if (n == 0) {
      return Status(ErrorCode::kRemoteRejected, std::string(write ? "cuFileWrite" : "cuFileRead") + " of '" +
                                                    file.path() + "' moved nothing at " + std::to_string(at) +
                                                    (write ? "" : ": end of file"));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace mooncake::te::file
