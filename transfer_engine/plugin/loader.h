#ifndef MOONCAKE_TRANSFER_ENGINE_PLUGIN_LOADER_H_
#define MOONCAKE_TRANSFER_ENGINE_PLUGIN_LOADER_H_

// Finds, checks and registers the plugin .so files of this installation, and reports the state of every
// transport and platform plugin (loaded from a .so or linked in).

#include <string>
#include <vector>

namespace mooncake::te {

/// What became of one plugin.
enum class PluginState {
  kLoaded,          ///< registered and usable on this host
  kUnusable,        ///< registered, but its probe says it cannot run here (no device, vendor library missing)
  kLibraryMissing,  ///< dlopen failed (a library it NEEDs is missing, or the file is not loadable): the loader's text
  kRefused,         ///< not registered: another ABI version or build id, unknown kind, or its name is taken
  kError,           ///< not registered: no entry point, a malformed entry, or its platform could not be created
};

/// "loaded", "unusable", "library_missing", "refused", "error".
const char* PluginStateName(PluginState state);

struct PluginInfo {
  std::string name;                    ///< the plugin's name (from its entry point, else from its file name)
  std::string kind;                    ///< "transport", "platform" or (refused, unknown kind) "unknown"
  std::string origin;                  ///< "builtin" (linked in) or the .so path it was loaded from
  std::vector<std::string> protocols;  ///< transports: the protocol strings served; empty for platforms
  PluginState state = PluginState::kError;
  /// Why it is not kLoaded (the probe's reason, dlerror text, the refusal); for a loaded plugin, its probe's
  /// summary when it gives one (efa: "FI_HMEM ..."), else empty.
  std::string reason;
};

/// Loads plugins once per process (later calls return at once; thread-safe). Scans, in this order,
///   (a) every folder of MC_PLUGIN_DIR (colon-separated), then
///   (b) `_plugins/` beside the binary or shared object that contains this loader (in the wheel,
///       mooncake/_plugins/ beside _native*.so),
/// for files named libmc_*.so (each real file once). Each is dlopen'ed (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE:
/// never unloaded) and its entry point mc_plugin_v1 (plugin_abi.h) checked: ABI version, struct size, build id
/// (MC_PLUGIN_BUILD_ID, the hash of the SDK headers), kind, and that no plugin of that name is registered yet
/// (linked-in plugins and earlier folders win). Then its probe runs, and transports are registered in
/// TransportRegistry (usable or not: the registered probe returns the recorded verdict; origin = the path) and
/// platforms in PlatformRegistry. Nothing here is fatal: a plugin that cannot be used is recorded with its reason
/// and logged (WARNING for a broken plugin, DEBUG for one that merely has no device).
void LoadPlugins();

/// Every plugin seen (calls LoadPlugins first): the linked-in ("builtin") transports and platforms, with the
/// verdict of their probe as of this call, then every libmc_*.so file scanned, in scan order. Thread-safe.
std::vector<PluginInfo> PluginStates();

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_PLUGIN_LOADER_H_
