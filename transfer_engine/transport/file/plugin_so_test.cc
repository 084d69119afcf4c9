// The loadable form, opened as the engine's loader opens it: its entry point names the transport and its
// protocols, its probe passes where io_uring works, and the object it creates is the file transport.
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "transfer_engine/plugin/build_id.h"
#include "transfer_engine/plugin/plugin_abi.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::file {
namespace {

std::string SoPath() {
  const char* dir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return std::string(dir ? dir : ".") + "/" + (ws ? ws : "") +
         "/transfer_engine/transport/file/libmc_transport_file.so";
}

TEST(FilePluginSo, EntryPointProbeAndCreate) {
  void* h = dlopen(SoPath().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  ASSERT_NE(h, nullptr) << dlerror();
  auto entry = reinterpret_cast<McPluginEntryV1>(dlsym(h, MC_PLUGIN_ENTRY_POINT));
  ASSERT_NE(entry, nullptr);
  const McPluginV1* p = entry(MC_PLUGIN_ABI_VERSION, MC_PLUGIN_BUILD_ID);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->kind, kMcPluginTransport);
  EXPECT_STREQ(p->name, "file");
  EXPECT_STREQ(p->build_id, MC_PLUGIN_BUILD_ID);
  std::set<std::string> protocols;
  for (const char* const* q = p->protocols; q && *q; ++q) protocols.insert(*q);
  EXPECT_EQ(protocols, (std::set<std::string>{"file", "nvmeof"}));
  ASSERT_NE(p->probe, nullptr);
  char why[256] = "unset";
  EXPECT_TRUE(p->probe(why, sizeof(why))) << why;
  std::unique_ptr<Transport> t(static_cast<Transport*>(p->create()));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name(), "file");
  EXPECT_EQ(t->capabilities().addressing, AddressMode::kOffset);
  EXPECT_TRUE(t->capabilities().Moves(MemoryType::kHost, MemoryType::kFile));
}

}  // namespace
}  // namespace mooncake::te::file
