#include "transfer_engine/transport/device_ipc/probe.h"

#include <dlfcn.h>

#include <cstdlib>

namespace mooncake::te::device_ipc {

bool EmulationPresents(const std::string& type) {
  const char* on = getenv("MC_PLATFORM_EMULATION");
  if (on == nullptr || std::string(on) != "1") return false;
  const char* v = getenv("MC_PLATFORM_EMULATION_DEVICE");
  const std::string presented = v == nullptr || *v == '\0' ? "cuda" : v;
  return presented == type;
}

TransportProbe ProbeRuntime(const std::string& emulation_type, const std::string& emulated_reason,
                            const std::vector<std::string>& sonames, const std::string& runtime,
                            const std::string& missing) {
  TransportProbe p;
  if (EmulationPresents(emulation_type)) {
    p.reason = emulated_reason;
    return p;
  }
  std::string first_error;
  for (const std::string& soname : sonames) {
    void* h = dlopen(soname.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (h != nullptr) {
      dlclose(h);
      p.reason = runtime + " found (" + soname + ")";
      return p;
    }
    const char* err = dlerror();
    if (first_error.empty()) first_error = err ? err : soname + " not found";
  }
  p.usable = false;
  p.reason = missing + ": " + first_error + " (MC_PLATFORM_EMULATION=1" +
             (emulation_type == "cuda" ? "" : " with MC_PLATFORM_EMULATION_DEVICE=" + emulation_type) +
             " enables the test emulation)";
  return p;
}

}  // namespace mooncake::te::device_ipc
