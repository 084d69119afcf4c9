// Loads a platform plugin .so the way the engine's loader does (dlopen RTLD_NOW | RTLD_LOCAL, the C entry point
// mc_plugin_v1) and checks what it creates:
//   plugin_form_check <plugin.so> <platform name> <expected probe reason substring> [<vendor soname>]
// When <vendor soname> loads on this machine the probe verdict is printed, not checked. Exit 0 = ok.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "transfer_engine/platform/platform.h"
#include "transfer_engine/plugin/build_id.h"
#include "transfer_engine/plugin/plugin_abi.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s <plugin.so> <name> <reason substring> [<vendor soname>]\n", argv[0]);
    return 2;
  }
  void* so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (so == nullptr) {
    fprintf(stderr, "FAIL: dlopen: %s\n", dlerror());
    return 1;
  }
  auto entry = reinterpret_cast<McPluginEntryV1>(dlsym(so, MC_PLUGIN_ENTRY_POINT));
  if (entry == nullptr) {
    fprintf(stderr, "FAIL: no %s\n", MC_PLUGIN_ENTRY_POINT);
    return 1;
  }
  const McPluginV1* p = entry(MC_PLUGIN_ABI_VERSION, MC_PLUGIN_BUILD_ID);
  if (p == nullptr || p->abi_version != MC_PLUGIN_ABI_VERSION || p->kind != kMcPluginPlatform ||
      std::strcmp(p->name, argv[2]) != 0 || std::strcmp(p->build_id, MC_PLUGIN_BUILD_ID) != 0 || p->create == nullptr) {
    fprintf(stderr, "FAIL: unexpected entry (name %s, kind %u)\n", p ? p->name : "null", p ? p->kind : 0);
    return 1;
  }
  std::unique_ptr<mooncake::te::Platform> platform(static_cast<mooncake::te::Platform*>(p->create()));
  if (platform == nullptr || platform->name() != argv[2]) {
    fprintf(stderr, "FAIL: create() gave %s\n", platform ? platform->name().c_str() : "null");
    return 1;
  }
  mooncake::te::PlatformProbe probe = platform->Probe();
  printf("%s: usable=%d devices=%d reason=%s\n", argv[2], probe.usable, probe.device_count, probe.reason.c_str());
  if (argc > 4 && dlopen(argv[4], RTLD_NOW | RTLD_LOCAL) != nullptr) return 0;  // vendor present: not checked
  if (probe.usable || probe.reason.find(argv[3]) == std::string::npos) {
    fprintf(stderr, "FAIL: expected an unusable verdict containing \"%s\"\n", argv[3]);
    return 1;
  }
  int x = 0;
  auto a = platform->Allocate(64, mooncake::te::AllocationKind::kDevice, 0);
  if (a.ok() || platform->Classify(&x).has_value()) {
    fprintf(stderr, "FAIL: an unusable platform allocated or classified\n");
    return 1;
  }
  printf("ok: %s\n", a.status().ToString().c_str());
  return 0;
}
