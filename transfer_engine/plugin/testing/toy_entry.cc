// A hand-written entry point with one field wrong, chosen at compile time, so the loader's refusals can be
// tested on real files: TOY_ABI (abi_version), TOY_SMALL_STRUCT (struct_size 8), TOY_WRONG_BUILD_ID,
// TOY_KIND (kind). TOY_NAME is the plugin's name (a bare token). Its create() makes nothing.
#include <stddef.h>
#include <stdint.h>

#include "transfer_engine/plugin/build_id.h"
#include "transfer_engine/plugin/plugin_abi.h"

#ifndef TOY_ABI
#define TOY_ABI MC_PLUGIN_ABI_VERSION
#endif
#ifndef TOY_KIND
#define TOY_KIND kMcPluginTransport
#endif
#ifdef TOY_WRONG_BUILD_ID
#define TOY_BUILD_ID "0000000000000000"
#else
#define TOY_BUILD_ID MC_PLUGIN_BUILD_ID
#endif
#ifdef TOY_SMALL_STRUCT
#define TOY_STRUCT_SIZE 8u
#else
#define TOY_STRUCT_SIZE static_cast<uint32_t>(sizeof(McPluginV1))
#endif
#define TOY_STR2(x) #x
#define TOY_STR(x) TOY_STR2(x)

namespace {

const char* const kProtocols[] = {TOY_STR(TOY_NAME), nullptr};

void* CreateNothing() { return nullptr; }

}  // namespace

extern "C" __attribute__((visibility("default"))) const McPluginV1* mc_plugin_v1(uint32_t, const char*) {
  static const McPluginV1 entry = {
      TOY_ABI, TOY_STRUCT_SIZE, TOY_BUILD_ID, TOY_STR(TOY_NAME), TOY_KIND, kProtocols, nullptr, nullptr,
      &CreateNothing,
  };
  return &entry;
}
