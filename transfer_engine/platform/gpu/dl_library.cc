#include "transfer_engine/platform/gpu/dl_library.h"

#include <dlfcn.h>

namespace mooncake::te::gpu {

StatusOr<DlLibrary> DlLibrary::Open(const std::vector<std::string>& sonames, const std::string& pattern) {
  std::string first_error;
  for (const auto& name : sonames) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) {
      DlLibrary lib;
      lib.handle_ = h;
      lib.soname_ = name;
      return lib;
    }
    const char* err = dlerror();
    if (first_error.empty()) first_error = err != nullptr ? err : name + ": cannot be loaded";
  }
  return Status(ErrorCode::kDeviceNotFound, pattern + ": not found (" + first_error + ")");
}

void* DlLibrary::Find(std::initializer_list<const char*> symbols) const {
  for (const char* s : symbols) {
    if (void* p = dlsym(handle_, s)) return p;
  }
  return nullptr;
}

}  // namespace mooncake::te::gpu
