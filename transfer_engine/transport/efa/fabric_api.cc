#include "transfer_engine/transport/efa/fabric_api.h"

#include <dlfcn.h>

#include <mutex>

namespace mooncake::te::efa {

uint32_t FabricApi::RequestVersion() const {
  uint32_t have = version();
  uint32_t want = FI_VERSION(1, 18);
  return have < want ? have : want;
}

std::string FabricApi::Error(const char* what, int rc) const {
  int err = rc < 0 ? -rc : rc;
  return std::string(what) + ": " + strerror(err) + " (" + std::to_string(rc) + ")";
}

namespace {

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out, std::string* why) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    *why = std::string("libfabric.so.1 has no ") + name;
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

}  // namespace

StatusOr<const FabricApi*> LoadFabricApi() {
  static std::once_flag once;
  static FabricApi api;
  static std::string why;
  std::call_once(once, [] {
    // RTLD_LOCAL: libfabric's symbols stay private (another copy in the process, e.g. aws-ofi-nccl's, is the
    // same soname and is reused by the loader).
    void* lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (lib == nullptr) {
      const char* e = dlerror();
      why = e != nullptr ? e : "dlopen(libfabric.so.1) failed";
      return;
    }
    FabricApi a{};
    if (Resolve(lib, "fi_version", &a.version, &why) && Resolve(lib, "fi_getinfo", &a.getinfo, &why) &&
        Resolve(lib, "fi_freeinfo", &a.freeinfo, &why) && Resolve(lib, "fi_dupinfo", &a.dupinfo, &why) &&
        Resolve(lib, "fi_fabric", &a.fabric, &why) && Resolve(lib, "fi_strerror", &a.strerror, &why)) {
      api = a;
    }
  });
  if (!why.empty()) return Status(ErrorCode::kNotImplemented, why);
  return &api;
}

}  // namespace mooncake::te::efa
