// The plugin loader against real .so files (testing/): copies of the toy plugins in two temporary folders named by
// MC_PLUGIN_DIR, loaded once for the whole process. Every state and reason is checked, and that none of it is
// fatal: the process goes on, and the registries hold exactly the plugins that were accepted.

#include "transfer_engine/plugin/loader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transfer_engine/platform/platform.h"
#include "transfer_engine/plugin/build_id.h"
#include "transfer_engine/plugin/plugin_abi.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te {
namespace {

constexpr char kToyDir[] = "transfer_engine/plugin/testing/";

std::string TempDir(const std::string& tag) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = std::string(base != nullptr ? base : "/tmp") + "/" + tag + "XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  EXPECT_NE(mkdtemp(buf.data()), nullptr);
  return buf.data();
}

void Copy(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  ASSERT_TRUE(in) << "missing test plugin " << from;
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
  ASSERT_TRUE(out.good()) << to;
}

struct Folders {
  std::string first;   // every toy plugin
  std::string second;  // a second copy of the good toy, a symlink to the first copy, files that are not plugins
};

const Folders& LoadedFolders() {
  static const Folders folders = [] {
    Folders f{TempDir("plugins_a"), TempDir("plugins_b")};
    for (const char* name : {"libmc_transport_toy.so", "libmc_platform_toyplat.so", "libmc_transport_toy_badabi.so",
                             "libmc_transport_toy_badbuild.so", "libmc_transport_toy_badkind.so",
                             "libmc_transport_toy_smallstruct.so", "libmc_transport_toy_novendor.so",
                             "libmc_transport_toy_noentry.so", "libmc_transport_toy_builtin.so",
                             "libmc_transport_toy_noted.so"}) {
      Copy(std::string(kToyDir) + name, f.first + "/" + name);
    }
    Copy(std::string(kToyDir) + "libmc_transport_toy.so", f.second + "/libmc_transport_toy.so");
    EXPECT_EQ(symlink((f.first + "/libmc_platform_toyplat.so").c_str(),
                      (f.second + "/libmc_platform_toyplat_link.so").c_str()),
              0);
    std::ofstream(f.second + "/libmc_notes.txt") << "not a plugin";
    std::ofstream(f.second + "/other.so") << "not a plugin either";
    std::string dirs = f.first + ":" + f.second + "::" + f.second + "/does_not_exist";
    setenv("MC_PLUGIN_DIR", dirs.c_str(), 1);
    unsetenv("MC_TOY_DEVICE");
    // Many threads at once: one of them loads, the others wait for it.
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) threads.emplace_back(LoadPlugins);
    for (auto& t : threads) t.join();
    return f;
  }();
  return folders;
}

/// The states of plugins loaded from `path`.
std::vector<PluginInfo> FromPath(const std::string& path) {
  std::vector<PluginInfo> out;
  for (const PluginInfo& p : PluginStates()) {
    if (p.origin == path) out.push_back(p);
  }
  return out;
}

PluginInfo One(const std::string& path) {
  auto found = FromPath(path);
  EXPECT_EQ(found.size(), 1u) << path;
  return found.empty() ? PluginInfo{} : found[0];
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PluginLoaderTest, BuildIdIsAShortHashOfTheSdkHeaders) {
  EXPECT_TRUE(std::regex_match(std::string(MC_PLUGIN_BUILD_ID), std::regex("[0-9a-f]{16}"))) << MC_PLUGIN_BUILD_ID;
  std::ifstream in("transfer_engine/plugin/build_id_inputs.txt");
  ASSERT_TRUE(in);
  std::vector<std::string> files;
  std::string hash, path;
  while (in >> hash >> path) {
    EXPECT_TRUE(std::regex_match(hash, std::regex("[0-9a-f]{64}"))) << hash;
    files.push_back(path);
  }
  EXPECT_TRUE(std::is_sorted(files.begin(), files.end()));
  for (const char* must : {"transfer_engine/api/status.h", "transfer_engine/common/config.h",
                           "transfer_engine/core/memory_registry.h", "transfer_engine/transport/transport.h",
                           "transfer_engine/platform/platform.h", "transfer_engine/plugin/plugin_abi.h",
                           "transfer_engine/plugin/plugin.h"}) {
    EXPECT_NE(std::find(files.begin(), files.end(), must), files.end()) << must;
  }
  for (const std::string& f : files) {
    EXPECT_EQ(f.find("build_id.h"), std::string::npos);
    EXPECT_TRUE(std::regex_match(f, std::regex("transfer_engine/(api|common|core|transport|platform|plugin)/.*\\.h")))
        << f;
  }
}

TEST(PluginLoaderTest, GoodTransportLoadsAndSaysItHasNoDevice) {
  const Folders& f = LoadedFolders();
  const std::string path = f.first + "/libmc_transport_toy.so";
  PluginInfo info = One(path);
  EXPECT_EQ(info.name, "toy");
  EXPECT_EQ(info.kind, "transport");
  EXPECT_EQ(info.state, PluginState::kUnusable);
  EXPECT_STREQ(PluginStateName(info.state), "unusable");
  EXPECT_EQ(info.reason, "no toy device");
  EXPECT_EQ(info.protocols, (std::vector<std::string>{"toy", "toy_alias"}));

  // Registered anyway, with the recorded verdict, and its objects work across the .so boundary.
  const TransportPlugin* plugin = TransportRegistry::Get().FindByProtocol("toy_alias");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->name, "toy");
  EXPECT_EQ(plugin->origin, path);
  EXPECT_EQ(plugin->exclusive_env, "MC_TOY_ONLY");
  ASSERT_TRUE(plugin->probe);
  TransportProbe probe = plugin->probe();
  EXPECT_FALSE(probe.usable);
  EXPECT_EQ(probe.reason, "no toy device");
  std::unique_ptr<Transport> t = plugin->create();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name(), "toy");
  EXPECT_EQ(t->capabilities().priority, -100);
  EXPECT_TRUE(t->Start(TransportContext{}).ok());
  nlohmann::json descriptor = nlohmann::json::object();
  t->Describe(descriptor);
  EXPECT_EQ(descriptor["toy"]["toy"], true);
  EXPECT_FALSE(t->CanReach(SegmentDescriptor{}));
  t->Stop();
}

TEST(PluginLoaderTest, GoodPlatformLoads) {
  const Folders& f = LoadedFolders();
  PluginInfo info = One(f.first + "/libmc_platform_toyplat.so");
  EXPECT_EQ(info.name, "toyplat");
  EXPECT_EQ(info.kind, "platform");
  EXPECT_EQ(info.state, PluginState::kLoaded);
  EXPECT_STREQ(PluginStateName(info.state), "loaded");
  EXPECT_EQ(info.reason, "1 toy device");  // a usable platform's probe summary is kept
  EXPECT_TRUE(info.protocols.empty());
  std::shared_ptr<Platform> p = PlatformRegistry::Get().Find("toyplat");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->device_type(), MemoryType::kCxl);
  EXPECT_TRUE(p->Probe().usable);
  EXPECT_EQ(p->Allocate(64, AllocationKind::kDevice, 0).status().code(), ErrorCode::kNotImplemented);
}

TEST(PluginLoaderTest, UsableTransportKeepsItsProbeSummary) {
  const Folders& f = LoadedFolders();
  PluginInfo info = One(f.first + "/libmc_transport_toy_noted.so");
  EXPECT_EQ(info.state, PluginState::kLoaded);
  EXPECT_EQ(info.reason, "FI_HMEM: toy device memory via dma-buf");
}

TEST(PluginLoaderTest, UsableBuiltinsKeepTheirProbeSummary) {
  LoadedFolders();
  bool cpu = false;
  for (const PluginInfo& p : PluginStates()) {
    if (p.origin == "builtin" && p.kind == "platform" && p.name == "cpu") {
      cpu = true;
      EXPECT_EQ(p.state, PluginState::kLoaded);
      EXPECT_EQ(p.reason, PlatformRegistry::Get().Find("cpu")->Probe().reason);
      EXPECT_FALSE(p.reason.empty());
    }
  }
  EXPECT_TRUE(cpu);
}

TEST(PluginLoaderTest, WrongAbiVersionIsRefused) {
  const Folders& f = LoadedFolders();
  PluginInfo info = One(f.first + "/libmc_transport_toy_badabi.so");
  EXPECT_EQ(info.state, PluginState::kRefused);
  EXPECT_STREQ(PluginStateName(info.state), "refused");
  EXPECT_EQ(info.reason, "plugin ABI version 2, this engine loads version 1");
  EXPECT_EQ(info.name, "toy_badabi");  // from the file name: nothing else of a foreign ABI is read
  EXPECT_EQ(TransportRegistry::Get().FindByProtocol("toy_badabi"), nullptr);
}

TEST(PluginLoaderTest, OtherBuildIsRefused) {
  const Folders& f = LoadedFolders();
  PluginInfo info = One(f.first + "/libmc_transport_toy_badbuild.so");
  EXPECT_EQ(info.state, PluginState::kRefused);
  EXPECT_EQ(info.reason, std::string("built from other SDK headers: build id 0000000000000000, this engine's is ") +
                             MC_PLUGIN_BUILD_ID + " (install the plugin of this engine's build)");
  EXPECT_EQ(TransportRegistry::Get().FindByProtocol("toy_badbuild"), nullptr);
}

TEST(PluginLoaderTest, TooSmallEntryAndUnknownKindAreRefused) {
  const Folders& f = LoadedFolders();
  PluginInfo small = One(f.first + "/libmc_transport_toy_smallstruct.so");
  EXPECT_EQ(small.state, PluginState::kRefused);
  EXPECT_EQ(small.reason, "its entry describes 8 bytes; ABI version 1 needs " + std::to_string(sizeof(McPluginV1)));
  PluginInfo kind = One(f.first + "/libmc_transport_toy_badkind.so");
  EXPECT_EQ(kind.state, PluginState::kRefused);
  EXPECT_EQ(kind.kind, "unknown");
  EXPECT_EQ(kind.reason, "unknown plugin kind 7");
  EXPECT_EQ(TransportRegistry::Get().FindByProtocol("toy_badkind"), nullptr);
}

TEST(PluginLoaderTest, MissingLibraryIsReportedWithTheLoadersMessage) {
  const Folders& f = LoadedFolders();
  const std::string path = f.first + "/libmc_transport_toy_novendor.so";
  PluginInfo info = One(path);
  EXPECT_EQ(info.state, PluginState::kLibraryMissing);
  EXPECT_STREQ(PluginStateName(info.state), "library_missing");
  EXPECT_EQ(info.name, "toy_novendor");
  EXPECT_EQ(info.kind, "transport");
  EXPECT_TRUE(Contains(info.reason, "libmc_missing_vendor.so.1: cannot open shared object file")) << info.reason;
  EXPECT_EQ(TransportRegistry::Get().FindByProtocol("toy_novendor"), nullptr);
}

TEST(PluginLoaderTest, FileWithoutEntryPointIsAnError) {
  const Folders& f = LoadedFolders();
  PluginInfo info = One(f.first + "/libmc_transport_toy_noentry.so");
  EXPECT_EQ(info.state, PluginState::kError);
  EXPECT_STREQ(PluginStateName(info.state), "error");
  EXPECT_TRUE(Contains(info.reason, "no entry point mc_plugin_v1")) << info.reason;
}

TEST(PluginLoaderTest, LinkedInPluginWinsOverAFileOfTheSameName) {
  const Folders& f = LoadedFolders();
  PluginInfo info = One(f.first + "/libmc_transport_toy_builtin.so");
  EXPECT_EQ(info.state, PluginState::kRefused);
  EXPECT_EQ(info.reason, "a transport named 'toy_builtin' is already registered (builtin)");
  const TransportPlugin* plugin = TransportRegistry::Get().FindByProtocol("toy_builtin");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->origin, "builtin");
}

TEST(PluginLoaderTest, EarlierFolderWinsAndEachFileIsLoadedOnce) {
  const Folders& f = LoadedFolders();
  PluginInfo copy = One(f.second + "/libmc_transport_toy.so");
  EXPECT_EQ(copy.state, PluginState::kRefused);
  EXPECT_EQ(copy.reason, "a transport named 'toy' is already registered (" + f.first + "/libmc_transport_toy.so)");
  // The symlink to a file already loaded is skipped; files not named libmc_*.so are not plugins.
  EXPECT_TRUE(FromPath(f.second + "/libmc_platform_toyplat_link.so").empty());
  EXPECT_TRUE(FromPath(f.second + "/libmc_notes.txt").empty());
  EXPECT_TRUE(FromPath(f.second + "/other.so").empty());
}

TEST(PluginLoaderTest, BuiltinsAreListedWithTheirProbe) {
  LoadedFolders();
  bool cpu = false, toy_builtin = false;
  for (const PluginInfo& p : PluginStates()) {
    if (p.origin != "builtin") continue;
    if (p.kind == "platform" && p.name == "cpu") {
      cpu = true;
      EXPECT_EQ(p.state, PluginState::kLoaded) << p.reason;
    }
    if (p.kind == "transport" && p.name == "toy_builtin") {
      toy_builtin = true;
      EXPECT_EQ(p.state, PluginState::kLoaded);
      EXPECT_EQ(p.protocols, std::vector<std::string>{"toy_builtin"});
    }
  }
  EXPECT_TRUE(cpu);
  EXPECT_TRUE(toy_builtin);
}

TEST(PluginLoaderTest, LoadingIsIdempotentAndRegistersOnlyWhatWasAccepted) {
  const Folders& f = LoadedFolders();
  size_t before = PluginStates().size();
  LoadPlugins();
  LoadPlugins();
  EXPECT_EQ(PluginStates().size(), before);
  // builtin toy_builtin + the first folder's toy and toy_noted; nothing refused, missing or broken got in.
  std::vector<std::string> names = TransportRegistry::Get().Names();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"toy", "toy_builtin", "toy_noted"}));
  // 10 files in the first folder, 1 accepted-or-refused copy in the second (the symlink skipped).
  size_t scanned = 0;
  for (const PluginInfo& p : PluginStates()) scanned += p.origin != "builtin";
  EXPECT_EQ(scanned, 11u);
  (void)f;
}

}  // namespace
}  // namespace mooncake::te
