// nvlink on the real cuda platform (not the host emulation) over the FAKE CUDA driver of
// //transfer_engine/platform/cuda/testing with fabric handles on (FAKE_CUDA_FABRIC=1 from the BUILD env), and
// the NVLink domain read from the FAKE NVML of testing/ (MC_NVLINK_NVML_LIBRARY; no MC_NVLINK_DOMAIN): two
// engines of this process move device bytes through one fabric mapping (cuMemCreate(FABRIC), export, import,
// map: the platform's code; the fake's memory is a /dev/shm file). The binary runs itself again with
// LD_LIBRARY_PATH naming a folder where libcuda.so.1 is the fake, so the plugin's probe and the linked-in cuda
// platform load it as they would load the real driver.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/cuda/cuda_platform.h"
#include "transfer_engine/platform/testing/proc_maps.h"
#include "transfer_engine/platform/testing/runfile.h"
#include "transfer_engine/transport/device_ipc/testing/engine_pair.h"
#include "transfer_engine/transport/nvlink/nvlink_transport.h"

namespace mooncake::te::nvlink {
namespace {

std::string FakeDriver() { return te::testing::FakeCudaDriver(); }

// Before main: unless done already, a folder with libcuda.so.1 -> the fake driver, and this binary again (same
// arguments) with LD_LIBRARY_PATH set to it. Exits 1 saying why where that cannot be done.
const bool kReexecuted = [] {
  if (getenv("NVLINK_CUDA_TEST_LIBCUDA") != nullptr) return true;
  const char* tmp = getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/libcuda-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr || symlink(FakeDriver().c_str(), (dir + "/libcuda.so.1").c_str()) != 0) {
    perror("nvlink_cuda_test: the fake libcuda.so.1");
    _exit(1);
  }
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t at = 0; at < cmdline.size();) {
    const size_t end = cmdline.find('\0', at);
    args.push_back(cmdline.substr(at, end - at));
    at = end == std::string::npos ? cmdline.size() : end + 1;
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  setenv("LD_LIBRARY_PATH", dir.c_str(), 1);
  setenv("NVLINK_CUDA_TEST_LIBCUDA", dir.c_str(), 1);
  execv("/proc/self/exe", argv.data());
  perror("nvlink_cuda_test: execv");
  _exit(1);
}();

class NvlinkOnCudaTest : public device_ipc::testing::EnginePairTest {
 protected:
  NvlinkOnCudaTest() : EnginePairTest({"nvlink", MemoryType::kCuda, AllocationKind::kFabric, "nvlink"}) {}
};

TEST_F(NvlinkOnCudaTest, MovesDeviceMemoryThroughOneFabricMapping) {
  ASSERT_EQ(getenv("MC_NVLINK_DOMAIN"), nullptr);
  ASSERT_EQ(dev_->name(), "cuda");
  CheckMovesThroughOneMapping();  // nvlink carried every byte: both engines found one domain in NVML
}

TEST_F(NvlinkOnCudaTest, TheDomainComesFromNvmlUnlessSet) {
  for (const std::string& option : {std::string(""), std::string("set-domain")}) {
    device_ipc::testing::LocalContext local(&PlatformRegistry::Get());
    NvlinkTransport t;
    ASSERT_TRUE(t.Configure(TransportOptions("nvlink", {{"nvlink.domain", option}})).ok());
    ASSERT_TRUE(t.Start(local.ctx).ok());
    nlohmann::json desc = nlohmann::json::object();
    t.Describe(desc);
    EXPECT_EQ(desc.value(kDomainField, ""), option.empty() ? "00112233-4455-6677-8899-aabbccddeeff:7" : option)
        << desc.dump();
    t.Stop();
  }
  // NVML says the GPU is in no fabric: inert, with NVML's reason.
  setenv("FAKE_NVML_FABRIC_STATE", "0", 1);
  device_ipc::testing::LocalContext local(&PlatformRegistry::Get());
  NvlinkTransport t;
  ASSERT_TRUE(t.Configure(TransportOptions("nvlink", {})).ok());
  ASSERT_TRUE(t.Start(local.ctx).ok());
  unsetenv("FAKE_NVML_FABRIC_STATE");
  auto r = t.RegisterRegion(device_ipc::testing::RegionOf(local_, kLen, MemoryKind{MemoryType::kCuda, 0}));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->declined);
  EXPECT_NE(r->why_declined.find("no NVLink domain: NVML gives none (GPU 0000:3b:00.0 is in no NVLink fabric"),
            std::string::npos)
      << r->why_declined;
  t.Stop();
}

// GPUs of different NVLink domains (NVML gives device 1 another clique): inert, naming both.
TEST_F(NvlinkOnCudaTest, GpusOfDifferentDomainsAreRefused) {
  setenv("FAKE_NVML_CLIQUES", "7,9", 1);
  device_ipc::testing::LocalContext local(&PlatformRegistry::Get());
  NvlinkTransport t;
  ASSERT_TRUE(t.Configure(TransportOptions("nvlink", {})).ok());
  ASSERT_TRUE(t.Start(local.ctx).ok());
  unsetenv("FAKE_NVML_CLIQUES");
  auto r = t.RegisterRegion(device_ipc::testing::RegionOf(local_, kLen, MemoryKind{MemoryType::kCuda, 0}));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->declined);
  EXPECT_NE(r->why_declined.find("different NVLink domains (GPU 0000:3b:00.0: '00112233-4455-6677-8899-aabbccddeeff:7'"
                                 ", GPU 0000:3c:00.0: '00112233-4455-6677-8899-aabbccddeeff:9')"),
            std::string::npos)
      << r->why_declined;
  t.Stop();
}

// The permissions of the mappings of /dev/shm/fake-cuda-fabric-* files of `bytes` bytes (/proc/self/maps).
std::vector<std::string> FabricMappings(size_t bytes) {
  std::vector<std::string> out;
  for (const auto& m : te::testing::ProcSelfMaps()) {
    if (m.path.find("/dev/shm/fake-cuda-fabric-") != std::string::npos && m.hi - m.lo == bytes) out.push_back(m.perms);
  }
  return out;
}

// The fake's fabric files of this process (one per live allocation).
size_t FabricFiles() {
  size_t n = 0;
  const std::string prefix = "fake-cuda-fabric-" + std::to_string(getpid()) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    n += e.path().filename().string().rfind(prefix, 0) == 0;
  }
  return n;
}

TEST_F(NvlinkOnCudaTest, APeersEpochTableIsMappedReadOnly) {
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 4096).ok());
  const size_t table = 2 << 20;  // kEpochTableBytes in the fake's 2 MiB granularity
  std::vector<std::string> modes = FabricMappings(table);
  EXPECT_EQ(std::count(modes.begin(), modes.end(), "rw-s"), 2) << "a's and b's own tables";
  EXPECT_EQ(std::count(modes.begin(), modes.end(), "r--s"), 1) << "a's import of b's (cuMemSetAccess PROT_READ)";
}

TEST_F(NvlinkOnCudaTest, AClosedEngineHasReleasedItsManagedBuffers) {
  const size_t before = FabricFiles();
  for (size_t length : {size_t{1} << 20, size_t{5} << 20}) {
    auto p = a_->AllocateManaged(length);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
  }
  EXPECT_EQ(FabricFiles(), before + 2);
  a_.reset();  // closed without free_managed_buffer
  EXPECT_EQ(FabricFiles(), before - 1) << "its two managed buffers and its epoch table are released";
}

}  // namespace
}  // namespace mooncake::te::nvlink
