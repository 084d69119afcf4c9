#ifndef MOONCAKE_TRANSFER_ENGINE_PLUGIN_PLUGIN_H_
#define MOONCAKE_TRANSFER_ENGINE_PLUGIN_PLUGIN_H_

// How a transport or platform makes itself known: one line per plugin, in one of its sources, at namespace
// scope:
//
//   MC_TRANSPORT_PLUGIN("rdma", RdmaTransport, {"rdma"}, "", ProbeRdma);
//   MC_PLATFORM_PLUGIN("cuda", CudaPlatform, nullptr);
//
// Built normally (the alwayslink library of mc_plugin, bazel/plugin.bzl) the line registers the plugin at static
// initialisation: TransportRegistry::Get().Register(TransportPlugin{...}) / PlatformRegistry::Get().Register.
// Built with -DMC_PLUGIN_SHARED_OBJECT (the libmc_<kind>_<name>.so of mc_plugin) it instead defines the exported
// entry point `extern "C" const McPluginV1* mc_plugin_v1(uint32_t, const char*)` (plugin_abi.h), which the
// engine's loader (plugin/loader.h) finds with dlsym; nothing else of the .so is visible.
//
// Arguments:
//   name       the transport's / platform's name (a string literal); a transport also answers to it as a protocol.
//   Type       the class: default-constructible, derived from Transport / Platform.
//   protocols  (transports) a braced list of the Mooncake protocol strings served, e.g. {"rdma"} or {"nvlink",
//              "nvlink_intra"}; {} means {name}.
//   exclusive_env (transports) an environment variable that, when true, makes this the only transport the engine
//              installs ("MC_FORCE_TCP"); "" for none.
//   probe_fn   nullptr (always usable; a platform is then asked with Platform::Probe), or a plain function
//              `TransportProbe Probe()` (transports) / `PlatformProbe Probe()` (platforms) saying whether the
//              plugin can run on this host and why not. It must be cheap and must not throw.
//
// A plugin built as a .so links its own copy of the core code it uses: every piece of process state (memory
// registry, platforms, host services) must come from the TransportContext given to Start, never from a singleton
// such as TransportRegistry::Get() or PlatformRegistry::Get(), which would be the .so's private, empty copy.

#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "transfer_engine/platform/platform.h"
#include "transfer_engine/plugin/plugin_abi.h"
#include "transfer_engine/transport/transport.h"

#ifdef MC_PLUGIN_SHARED_OBJECT
#include "transfer_engine/plugin/build_id.h"
#endif

namespace mooncake::te::plugin_internal {

using TransportProbeFn = TransportProbe (*)();
using PlatformProbeFn = PlatformProbe (*)();

/// The arguments after `Type` of MC_TRANSPORT_PLUGIN.
struct TransportSpec {
  std::vector<std::string> protocols;
  const char* exclusive_env = nullptr;
  TransportProbeFn probe = nullptr;
};

/// Copies `text` into why[0..n), truncated, NUL-terminated (nothing when n == 0).
inline void WriteReason(const std::string& text, char* why, size_t n) {
  if (why == nullptr || n == 0) return;
  size_t len = text.size() < n - 1 ? text.size() : n - 1;
  std::memcpy(why, text.data(), len);
  why[len] = '\0';
}

/// Runs a probe function without letting an exception cross the C boundary.
template <typename Probe, typename Fn>
Probe CallProbe(Fn fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    Probe p;
    p.usable = false;
    p.reason = std::string("probe threw: ") + e.what();
    return p;
  } catch (...) {
    Probe p;
    p.usable = false;
    p.reason = "probe threw a non-standard exception";
    return p;
  }
}

/// A new Type as a pointer to its Base, type-erased for the C ABI; null when construction throws.
template <typename Type, typename Base>
void* CreateErased() noexcept {
  try {
    return static_cast<void*>(static_cast<Base*>(new Type()));
  } catch (...) {
    return nullptr;
  }
}

template <typename Type>
TransportPlugin MakeTransportPlugin(const char* name, const TransportSpec& spec) {
  static_assert(std::is_base_of_v<Transport, Type>, "MC_TRANSPORT_PLUGIN: Type must derive from Transport");
  TransportPlugin plugin;
  plugin.name = name;
  plugin.protocols = spec.protocols;
  plugin.exclusive_env = spec.exclusive_env != nullptr ? spec.exclusive_env : "";
  if (TransportProbeFn fn = spec.probe) {
    plugin.probe = [fn] { return CallProbe<TransportProbe>(fn); };
  }
  plugin.create = [] { return std::unique_ptr<Transport>(new Type()); };
  return plugin;
}

/// Registers a linked-in platform plugin. Its probe_fn is not consulted: a registered platform answers for
/// itself through Platform::Probe (and must be safe to call when unusable).
struct PlatformRegistrar {
  explicit PlatformRegistrar(std::shared_ptr<Platform> platform) {
    PlatformRegistry::Get().Register(std::move(platform));
  }
};

/// The McPluginV1 a .so returns, with the storage its pointers point into. Built once, never destroyed.
class EntryStorage {
 public:
  EntryStorage(const char* name, uint32_t kind, const std::vector<std::string>& protocols, const char* exclusive_env,
               const char* build_id, bool (*probe)(char*, size_t), void* (*create)())
      : name_(name), env_(exclusive_env != nullptr ? exclusive_env : ""), protocols_(protocols) {
    if (kind == kMcPluginTransport && protocols_.empty()) protocols_.push_back(name_);
    for (const auto& p : protocols_) protocol_ptrs_.push_back(p.c_str());
    protocol_ptrs_.push_back(nullptr);
    v1_.abi_version = MC_PLUGIN_ABI_VERSION;
    v1_.struct_size = sizeof(McPluginV1);
    v1_.build_id = build_id;
    v1_.name = name_.c_str();
    v1_.kind = kind;
    v1_.protocols = kind == kMcPluginTransport ? protocol_ptrs_.data() : nullptr;
    v1_.exclusive_env = env_.c_str();
    v1_.probe = probe;
    v1_.create = create;
  }
  const McPluginV1* get() const { return &v1_; }

 private:
  std::string name_;
  std::string env_;
  std::vector<std::string> protocols_;
  std::vector<const char*> protocol_ptrs_;
  McPluginV1 v1_{};
};

/// The C-ABI probe of a .so: runs `fn` (never throws) and reports its verdict.
template <typename Probe, typename Fn>
bool ProbeForAbi(Fn fn, char* why, size_t n) noexcept {
  if (fn == nullptr) {
    WriteReason("", why, n);
    return true;
  }
  try {
    Probe p = CallProbe<Probe>(fn);
    WriteReason(p.reason, why, n);  // a usable plugin's summary too ("FI_HMEM ..."), shown by plugins()
    return p.usable;
  } catch (...) {  // allocation failure while copying the reason
    WriteReason("probe failed", why, n);
    return false;
  }
}

}  // namespace mooncake::te::plugin_internal

#define MC_PLUGIN_VISIBLE_ __attribute__((visibility("default")))

#ifndef MC_PLUGIN_SHARED_OBJECT

// Linked in: a static registrar (one per source file; a second use in the same file does not compile).
#define MC_TRANSPORT_PLUGIN(name, Type, ...)                                                                \
  namespace {                                                                                              \
  const ::mooncake::te::TransportRegistrar mc_plugin_registrar_(                                           \
      ::mooncake::te::plugin_internal::MakeTransportPlugin<Type>(                                          \
          name, ::mooncake::te::plugin_internal::TransportSpec{__VA_ARGS__}));                             \
  }                                                                                                        \
  static_assert(true, "")

#define MC_PLATFORM_PLUGIN(name, Type, probe_fn)                                                           \
  namespace {                                                                                              \
  static_assert(std::is_base_of_v<::mooncake::te::Platform, Type>,                                         \
                "MC_PLATFORM_PLUGIN: Type must derive from Platform");                                     \
  [[maybe_unused]] constexpr ::mooncake::te::plugin_internal::PlatformProbeFn mc_plugin_probe_fn_ = probe_fn; \
  const ::mooncake::te::plugin_internal::PlatformRegistrar mc_plugin_registrar_(std::make_shared<Type>()); \
  }                                                                                                        \
  static_assert(true, "")

#else  // MC_PLUGIN_SHARED_OBJECT

// A loadable .so: the exported entry point, nothing registered at load.
#define MC_TRANSPORT_PLUGIN(name, Type, ...)                                                                \
  namespace {                                                                                              \
  static_assert(std::is_base_of_v<::mooncake::te::Transport, Type>,                                        \
                "MC_TRANSPORT_PLUGIN: Type must derive from Transport");                                   \
  const ::mooncake::te::plugin_internal::TransportSpec& mc_plugin_spec_() {                                \
    static const ::mooncake::te::plugin_internal::TransportSpec spec{__VA_ARGS__};                         \
    return spec;                                                                                           \
  }                                                                                                        \
  bool mc_plugin_probe_(char* why, size_t n) {                                                             \
    return ::mooncake::te::plugin_internal::ProbeForAbi<::mooncake::te::TransportProbe>(                   \
        mc_plugin_spec_().probe, why, n);                                                                  \
  }                                                                                                        \
  }                                                                                                        \
  extern "C" MC_PLUGIN_VISIBLE_ const McPluginV1* mc_plugin_v1(uint32_t /*host_abi*/,                      \
                                                               const char* /*host_build_id*/) {            \
    static const ::mooncake::te::plugin_internal::EntryStorage entry(                                      \
        name, kMcPluginTransport, mc_plugin_spec_().protocols, mc_plugin_spec_().exclusive_env,            \
        MC_PLUGIN_BUILD_ID, mc_plugin_spec_().probe != nullptr ? &mc_plugin_probe_ : nullptr,              \
        &::mooncake::te::plugin_internal::CreateErased<Type, ::mooncake::te::Transport>);                  \
    return entry.get();                                                                                    \
  }                                                                                                        \
  static_assert(true, "")

#define MC_PLATFORM_PLUGIN(name, Type, probe_fn)                                                           \
  namespace {                                                                                              \
  static_assert(std::is_base_of_v<::mooncake::te::Platform, Type>,                                         \
                "MC_PLATFORM_PLUGIN: Type must derive from Platform");                                     \
  constexpr ::mooncake::te::plugin_internal::PlatformProbeFn mc_plugin_probe_fn_ = probe_fn;               \
  bool mc_plugin_probe_(char* why, size_t n) {                                                             \
    return ::mooncake::te::plugin_internal::ProbeForAbi<::mooncake::te::PlatformProbe>(mc_plugin_probe_fn_, \
                                                                                       why, n);            \
  }                                                                                                        \
  }                                                                                                        \
  extern "C" MC_PLUGIN_VISIBLE_ const McPluginV1* mc_plugin_v1(uint32_t /*host_abi*/,                      \
                                                               const char* /*host_build_id*/) {            \
    static const ::mooncake::te::plugin_internal::EntryStorage entry(                                      \
        name, kMcPluginPlatform, {}, nullptr, MC_PLUGIN_BUILD_ID,                                          \
        mc_plugin_probe_fn_ != nullptr ? &mc_plugin_probe_ : nullptr,                                      \
        &::mooncake::te::plugin_internal::CreateErased<Type, ::mooncake::te::Platform>);                   \
    return entry.get();                                                                                    \
  }                                                                                                        \
  static_assert(true, "")

#endif  // MC_PLUGIN_SHARED_OBJECT

#endif  // MOONCAKE_TRANSFER_ENGINE_PLUGIN_PLUGIN_H_
