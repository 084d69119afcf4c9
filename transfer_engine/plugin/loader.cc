#include "transfer_engine/plugin/loader.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "transfer_engine/common/log.h"
#include "transfer_engine/platform/platform.h"
#include "transfer_engine/plugin/build_id.h"
#include "transfer_engine/plugin/plugin_abi.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te {
namespace {

constexpr char kPluginDirEnv[] = "MC_PLUGIN_DIR";
constexpr char kPackageDirName[] = "_plugins";
constexpr char kFilePrefix[] = "libmc_";
constexpr char kFileSuffix[] = ".so";
constexpr size_t kReasonBytes = 1024;

/// Written only inside the call_once of LoadPlugins; read only after it.
struct LoaderState {
  std::once_flag once;
  std::vector<PluginInfo> scanned;        // every libmc_*.so, in scan order
  std::set<std::string> platform_names;  // platforms this loader registered (the others are built in)
};

LoaderState& State() {
  static LoaderState* state = new LoaderState();  // never destroyed: may be read from static destructors
  return *state;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> SplitPath(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(':', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

/// `_plugins/` beside the file (executable or shared object) this function was linked into; "" if unknown.
std::string PackagePluginDir() {
  Dl_info info{};
  std::string file;
  if (dladdr(reinterpret_cast<void*>(&PackagePluginDir), &info) != 0 && info.dli_fname != nullptr) {
    file = info.dli_fname;
  }
  // For the main executable glibc reports argv[0], which may be a bare name: use the kernel's path instead.
  if (file.find('/') == std::string::npos) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return "";
    file.assign(buf, static_cast<size_t>(n));
  }
  return file.substr(0, file.rfind('/') + 1) + kPackageDirName;
}

/// (kind, name) from libmc_<kind>_<name>.so; kind "unknown" and name = the middle part when it does not parse.
void NamesFromFile(const std::string& file, PluginInfo* info) {
  std::string stem = file.substr(sizeof(kFilePrefix) - 1, file.size() - (sizeof(kFilePrefix) - 1) -
                                                               (sizeof(kFileSuffix) - 1));
  for (const char* kind : {"transport", "platform"}) {
    std::string prefix = std::string(kind) + "_";
    if (stem.compare(0, prefix.size(), prefix) == 0 && stem.size() > prefix.size()) {
      info->kind = kind;
      info->name = stem.substr(prefix.size());
      return;
    }
  }
  info->kind = "unknown";
  info->name = stem;
}

/// The libmc_*.so files of `dir`, sorted; missing or unreadable folders yield none (logged when `explicit_dir`).
std::vector<std::string> PluginFiles(const std::string& dir, bool explicit_dir) {
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (explicit_dir) {
      MC_LOG(kWarning) << kPluginDirEnv << ": cannot read plugin folder '" << dir << "': " << std::strerror(errno);
    }
    return files;
  }
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > sizeof(kFilePrefix) - 1 + sizeof(kFileSuffix) - 1 && name.rfind(kFilePrefix, 0) == 0 &&
        EndsWith(name, kFileSuffix)) {
      files.push_back(name);
    }
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

bool NameTaken(const PluginInfo& info, std::string* owner) {
  if (info.kind == "transport") {
    for (const TransportPlugin& p : TransportRegistry::Get().All()) {
      if (p.name == info.name) {
        *owner = p.origin;
        return true;
      }
    }
    return false;
  }
  if (PlatformRegistry::Get().Find(info.name) != nullptr) {
    *owner = State().platform_names.count(info.name) ? "an earlier plugin file" : "builtin";
    return true;
  }
  return false;
}

void RegisterTransport(const McPluginV1& v1, bool usable, const std::string& reason, PluginInfo* info) {
  TransportPlugin plugin;
  plugin.name = info->name;
  plugin.protocols = info->protocols;
  plugin.exclusive_env = v1.exclusive_env != nullptr ? v1.exclusive_env : "";
  TransportProbe verdict{usable, reason};
  plugin.probe = [verdict] { return verdict; };
  void* (*create)() = v1.create;
  plugin.create = [create] { return std::unique_ptr<Transport>(static_cast<Transport*>(create())); };
  plugin.origin = info->origin;
  Status st = TransportRegistry::Get().Register(std::move(plugin));
  if (!st.ok()) {
    info->state = PluginState::kRefused;
    info->reason = st.message();
    return;
  }
  info->state = usable ? PluginState::kLoaded : PluginState::kUnusable;
  info->reason = reason;
}

/// A plugin whose probe function says it cannot run here is never created (its state and reason are recorded,
/// nothing is registered); one without a probe function is created and asked with Platform::Probe, and
/// registered with that verdict.
void RegisterPlatform(const McPluginV1& v1, bool usable, std::string reason, PluginInfo* info) {
  if (v1.probe != nullptr && !usable) {
    info->state = PluginState::kUnusable;
    info->reason = reason.empty() ? "its probe says it cannot run here (no reason given)" : reason;
    return;
  }
  void* object = v1.create();
  if (object == nullptr) {
    info->state = PluginState::kError;
    info->reason = "its create() returned no platform";
    return;
  }
  std::shared_ptr<Platform> platform(static_cast<Platform*>(object));
  if (platform->name() != info->name) {
    info->state = PluginState::kError;
    info->reason = "the entry point says '" + info->name + "' but the platform calls itself '" + platform->name() + "'";
    return;
  }
  if (v1.probe == nullptr) {
    PlatformProbe probe = platform->Probe();
    usable = probe.usable;
    reason = probe.reason;  // a usable platform's summary is kept too
  }
  if (!usable && reason.empty()) reason = "its probe says it cannot run here (no reason given)";
  PlatformRegistry::Get().Register(platform);
  State().platform_names.insert(info->name);
  info->state = usable ? PluginState::kLoaded : PluginState::kUnusable;
  info->reason = reason;
}

/// Loads, checks and registers one plugin file; the outcome, never an exception.
PluginInfo LoadOne(const std::string& path, const std::string& file) {
  PluginInfo info;
  info.origin = path;
  NamesFromFile(file, &info);
  auto refuse = [&](PluginState state, std::string reason) {
    info.state = state;
    info.reason = std::move(reason);
    return info;
  };

  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* err = dlerror();
    return refuse(PluginState::kLibraryMissing, err != nullptr ? err : "dlopen failed");
  }
  // The handle is never closed: the plugin's objects (vtables, registered functions) must outlive every use.
  dlerror();
  void* symbol = dlsym(handle, MC_PLUGIN_ENTRY_POINT);
  if (symbol == nullptr) {
    return refuse(PluginState::kError, std::string("no entry point ") + MC_PLUGIN_ENTRY_POINT +
                                           " (not a Mooncake plugin, or built without MC_PLUGIN_SHARED_OBJECT)");
  }
  auto entry = reinterpret_cast<McPluginEntryV1>(symbol);
  const McPluginV1* v1 = entry(MC_PLUGIN_ABI_VERSION, MC_PLUGIN_BUILD_ID);
  if (v1 == nullptr) {
    return refuse(PluginState::kRefused, std::string("the plugin declined this engine (ABI version ") +
                                             std::to_string(MC_PLUGIN_ABI_VERSION) + ", build id " +
                                             MC_PLUGIN_BUILD_ID + ")");
  }
  if (v1->abi_version != MC_PLUGIN_ABI_VERSION) {
    return refuse(PluginState::kRefused, "plugin ABI version " + std::to_string(v1->abi_version) +
                                             ", this engine loads version " + std::to_string(MC_PLUGIN_ABI_VERSION));
  }
  if (v1->struct_size < sizeof(McPluginV1)) {
    return refuse(PluginState::kRefused, "its entry describes " + std::to_string(v1->struct_size) +
                                             " bytes; ABI version " + std::to_string(MC_PLUGIN_ABI_VERSION) +
                                             " needs " + std::to_string(sizeof(McPluginV1)));
  }
  if (v1->name != nullptr && v1->name[0] != '\0') info.name = v1->name;
  if (v1->kind == kMcPluginTransport) {
    info.kind = "transport";
    for (const char* const* p = v1->protocols; p != nullptr && *p != nullptr; ++p) info.protocols.push_back(*p);
    if (info.protocols.empty()) info.protocols.push_back(info.name);
  } else if (v1->kind == kMcPluginPlatform) {
    info.kind = "platform";
  } else {
    info.kind = "unknown";
  }
  const char* build_id = v1->build_id != nullptr ? v1->build_id : "(none)";
  if (std::strcmp(build_id, MC_PLUGIN_BUILD_ID) != 0) {
    return refuse(PluginState::kRefused, std::string("built from other SDK headers: build id ") + build_id +
                                             ", this engine's is " + MC_PLUGIN_BUILD_ID +
                                             " (install the plugin of this engine's build)");
  }
  if (info.kind == "unknown") {
    return refuse(PluginState::kRefused, "unknown plugin kind " + std::to_string(v1->kind));
  }
  if (v1->name == nullptr || v1->name[0] == '\0' || v1->create == nullptr) {
    return refuse(PluginState::kError, "its entry has no name or no create function");
  }
  std::string owner;
  if (NameTaken(info, &owner)) {
    return refuse(PluginState::kRefused,
                  "a " + info.kind + " named '" + info.name + "' is already registered (" + owner + ")");
  }

  bool usable = true;
  std::string reason;
  if (v1->probe != nullptr) {
    char why[kReasonBytes] = {0};
    usable = v1->probe(why, sizeof(why));
    why[sizeof(why) - 1] = '\0';
    reason = why;  // kept for usable plugins too: a summary ("FI_HMEM ...") that plugins() shows
    if (!usable && reason.empty()) reason = "its probe says it cannot run here (no reason given)";
  }
  if (info.kind == "transport") {
    RegisterTransport(*v1, usable, reason, &info);
  } else {
    RegisterPlatform(*v1, usable, reason, &info);
  }
  return info;
}

void LoadAll() {
  LoaderState& state = State();
  std::vector<std::pair<std::string, bool>> dirs;  // (folder, named explicitly)
  if (const char* env = getenv(kPluginDirEnv)) {
    for (const std::string& d : SplitPath(env)) dirs.emplace_back(d, true);
  }
  std::string package_dir = PackagePluginDir();
  if (!package_dir.empty()) dirs.emplace_back(package_dir, false);

  std::set<std::string> seen;  // real paths
  for (const auto& [dir, explicit_dir] : dirs) {
    for (const std::string& file : PluginFiles(dir, explicit_dir)) {
      std::string path = dir + "/" + file;
      char real[PATH_MAX];
      std::string key = realpath(path.c_str(), real) != nullptr ? std::string(real) : path;
      if (!seen.insert(key).second) continue;
      PluginInfo info;
      try {
        info = LoadOne(path, file);
      } catch (const std::exception& e) {
        info.origin = path;
        NamesFromFile(file, &info);
        info.state = PluginState::kError;
        info.reason = std::string("loading failed: ") + e.what();
      }
      if (info.state == PluginState::kLoaded || info.state == PluginState::kUnusable) {
        MC_LOG(kDebug) << "plugin " << info.kind << " '" << info.name << "' from " << path << ": "
                       << PluginStateName(info.state) << (info.reason.empty() ? "" : " (" + info.reason + ")");
      } else {
        MC_LOG(kWarning) << "plugin " << path << " not used: " << PluginStateName(info.state) << ": " << info.reason;
      }
      state.scanned.push_back(std::move(info));
    }
  }
}

}  // namespace

const char* PluginStateName(PluginState state) {
  switch (state) {
    case PluginState::kLoaded:
      return "loaded";
    case PluginState::kUnusable:
      return "unusable";
    case PluginState::kLibraryMissing:
      return "library_missing";
    case PluginState::kRefused:
      return "refused";
    case PluginState::kError:
      return "error";
  }
  return "error";
}

void LoadPlugins() { std::call_once(State().once, LoadAll); }

std::vector<PluginInfo> PluginStates() {
  LoadPlugins();
  const LoaderState& state = State();
  std::vector<PluginInfo> out;
  for (const TransportPlugin& p : TransportRegistry::Get().All()) {
    if (p.origin != "builtin") continue;
    PluginInfo info{p.name, "transport", p.origin, p.protocols, PluginState::kLoaded, ""};
    TransportProbe probe;
    try {
      if (p.probe) probe = p.probe();
    } catch (const std::exception& e) {
      probe = TransportProbe{false, std::string("probe threw: ") + e.what()};
    }
    info.reason = probe.reason;
    if (!probe.usable) {
      info.state = PluginState::kUnusable;
      info.reason = probe.reason.empty() ? "its probe says it cannot run here (no reason given)" : probe.reason;
    }
    out.push_back(std::move(info));
  }
  for (const std::shared_ptr<Platform>& p : PlatformRegistry::Get().All()) {
    std::string name = p->name();
    if (state.platform_names.count(name)) continue;
    PluginInfo info{name, "platform", "builtin", {}, PluginState::kLoaded, ""};
    PlatformProbe probe = p->Probe();
    info.reason = probe.reason;
    if (!probe.usable) {
      info.state = PluginState::kUnusable;
      info.reason = probe.reason.empty() ? "its probe says it cannot run here (no reason given)" : probe.reason;
    }
    out.push_back(std::move(info));
  }
  out.insert(out.end(), state.scanned.begin(), state.scanned.end());
  return out;
}

}  // namespace mooncake::te
