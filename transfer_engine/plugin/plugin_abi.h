#ifndef MOONCAKE_TRANSFER_ENGINE_PLUGIN_PLUGIN_ABI_H_
#define MOONCAKE_TRANSFER_ENGINE_PLUGIN_PLUGIN_ABI_H_

// The one C entry point a plugin .so exports. Core and plugins come from the same Bazel build: the entry point
// is C, the objects it creates are C++ (Transport / Platform) and are only used when the build ids match
// (MC_PLUGIN_BUILD_ID, plugin/build_id.h: a hash of the SDK headers). Plugin sources do not use this header
// directly: MC_TRANSPORT_PLUGIN / MC_PLATFORM_PLUGIN (plugin/plugin.h) define the entry point.

#include <stddef.h>
#include <stdint.h>

#define MC_PLUGIN_ABI_VERSION 1u
#define MC_PLUGIN_ENTRY_POINT "mc_plugin_v1"

extern "C" {

enum McPluginKind : uint32_t { kMcPluginTransport = 1, kMcPluginPlatform = 2 };

/// Returned (a static object, valid for the life of the process) by the entry point. Fields may only be
/// appended; struct_size tells how many the plugin knows. abi_version and struct_size stay the first two fields
/// in every ABI version, so a loader can read them (and refuse) before trusting anything else.
struct McPluginV1 {
  uint32_t abi_version;        ///< MC_PLUGIN_ABI_VERSION the plugin was built with
  uint32_t struct_size;        ///< sizeof(McPluginV1) as the plugin saw it
  const char* build_id;        ///< MC_PLUGIN_BUILD_ID (plugin/build_id.h) of the plugin's build
  const char* name;            ///< "rdma", "cuda", ...
  uint32_t kind;               ///< McPluginKind
  const char* const* protocols;  ///< transports: null-terminated list of protocol strings served; else null
  const char* exclusive_env;   ///< transports: see TransportPlugin::exclusive_env; may be null
  /// Whether the plugin can run here; writes a one-line reason (NUL-terminated) into why[0..n): on false why
  /// not, on true an optional summary (may be empty).
  /// May be null (always usable; a platform is then asked through Platform::Probe). Never throws.
  bool (*probe)(char* why, size_t n);
  /// A new object: mooncake::te::Transport* (kind transport) or mooncake::te::Platform* (kind platform),
  /// owned by the caller (delete through the base class); null on failure. Never throws.
  void* (*create)();
};

/// host_abi / host_build_id: the loading engine's; a plugin may return null when it cannot serve that host.
typedef const McPluginV1* (*McPluginEntryV1)(uint32_t host_abi, const char* host_build_id);

}  // extern "C"

#endif  // MOONCAKE_TRANSFER_ENGINE_PLUGIN_PLUGIN_ABI_H_
