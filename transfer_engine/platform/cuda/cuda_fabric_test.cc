// The cuda platform's fabric handles (AllocationKind::kFabric, ExportFabric / ImportFabric / CloseFabric) on the
// FAKE driver of testing/fake_driver.cc with FAKE_CUDA_FABRIC=1: cuMemCreate(FABRIC), the 64-byte
// CUmemFabricHandle, its import in another process (this binary run again), map, access, unmap and release are
// the real platform code; the fake's fabric memory is a /dev/shm file its handle names. Without the knob, and
// with FAKE_CUDA_FABRIC=no-imex, the refusals keep the driver's reason.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transfer_engine/platform/cuda/cuda_platform.h"
#include "transfer_engine/platform/testing/run_self.h"
#include "transfer_engine/platform/testing/proc_maps.h"
#include "transfer_engine/platform/testing/runfile.h"

extern char** environ;

namespace mooncake::te {
namespace {

std::string FakeDriver() { return testing::FakeCudaDriver(); }

unsigned char Pattern(int seed, size_t i) { return static_cast<unsigned char>(seed + i * 13); }

// --- the child: imports MC_FABRIC_HANDLE (MC_FABRIC_LENGTH bytes), checks it holds pattern MC_FABRIC_EXPECT
// (when set), writes pattern MC_FABRIC_WRITE, closes; prints "<kind> ok" or the error (exit 3) -----------------

int ChildMain() {
  const std::string handle = getenv("MC_FABRIC_HANDLE");
  const size_t length = strtoull(getenv("MC_FABRIC_LENGTH"), nullptr, 10);
  const char* expect = getenv("MC_FABRIC_EXPECT");
  const int write = atoi(getenv("MC_FABRIC_WRITE"));
  auto p = MakeCudaPlatform({FakeDriver()});
  StatusOr<void*> mapped = p->ImportFabric(handle, length);
  if (!mapped.ok()) {
    printf("%s\n", mapped.status().ToString().c_str());
    return 3;
  }
  std::vector<unsigned char> bytes(length);
  auto read = p->CopyAsync(bytes.data(), *mapped, length, -1);
  if (!read.ok() || !(*read)->Wait().ok()) {
    printf("read failed\n");
    return 4;
  }
  if (expect != nullptr) {
    for (size_t i = 0; i < length; ++i) {
      if (bytes[i] != Pattern(atoi(expect), i)) {
        printf("byte %zu is %02x\n", i, bytes[i]);
        return 4;
      }
    }
  }
  for (size_t i = 0; i < length; ++i) bytes[i] = Pattern(write, i);
  auto written = p->CopyAsync(*mapped, bytes.data(), length, -1);
  if (!written.ok() || !(*written)->Wait().ok()) {
    printf("write failed\n");
    return 4;
  }
  std::optional<MemoryKind> kind = p->Classify(*mapped);
  Status closed = p->CloseFabric(*mapped, length);
  Status again = p->CloseFabric(*mapped, length);
  if (!closed.ok() || again.ok()) {
    printf("close: %s / %s\n", closed.ToString().c_str(), again.ToString().c_str());
    return 4;
  }
  printf("%s ok\n", kind ? kind->ToString().c_str() : "unclassified");
  return 0;
}

const bool kIsChild = [] {
  if (getenv("MC_FABRIC_HANDLE") == nullptr) return false;
  const int rc = ChildMain();
  fflush(stdout);
  _exit(rc);
}();

using testing::ChildResult;

ChildResult Import(const std::string& handle, size_t length, int expect, int write) {
  std::vector<std::string> vars = {"MC_FABRIC_HANDLE=" + handle, "MC_FABRIC_LENGTH=" + std::to_string(length),
                                   "MC_FABRIC_WRITE=" + std::to_string(write)};
  if (expect >= 0) vars.push_back("MC_FABRIC_EXPECT=" + std::to_string(expect));
  return testing::RunSelf(vars);
}

// Sets fake-driver knobs for one test (each platform's Init reads them at cuInit); restores them after.
class FakeEnv {
 public:
  FakeEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~FakeEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(CudaFabricTest, ExportHereImportInAnotherProcessBothWays) {
  FakeEnv env("FAKE_CUDA_FABRIC", "1");
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable) << p->Probe().reason;
  const size_t size = 3 * 4096 + 5;
  auto fabric = p->Allocate(size, AllocationKind::kFabric, 1);
  ASSERT_TRUE(fabric.ok()) << fabric.status().ToString();
  ASSERT_EQ(p->Classify(*fabric)->ToString(), "cuda:1");
  auto* base = static_cast<unsigned char*>(*fabric);
  const size_t offset = 4096 + 1, length = 6000;
  std::vector<unsigned char> bytes(size, 0xee);
  for (size_t i = 0; i < length; ++i) bytes[offset + i] = Pattern(17, i);
  auto put = p->CopyAsync(base, bytes.data(), size, -1);
  ASSERT_TRUE(put.ok() && (*put)->Wait().ok());

  auto handle = p->ExportFabric(base + offset, length);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  EXPECT_EQ(handle->rfind("mc-cuda-ipc:v1:fabric:" + std::to_string(getpid()) + ":1:4097:6000:", 0), 0u) << *handle;

  // The child reads what this process wrote and writes its own bytes, which this process then reads.
  ChildResult r = Import(*handle, length, 17, 71);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "cuda:1 ok\n");
  auto get = p->CopyAsync(bytes.data(), base, size, -1);
  ASSERT_TRUE(get.ok() && (*get)->Wait().ok());
  for (size_t i = 0; i < length; ++i) ASSERT_EQ(bytes[offset + i], Pattern(71, i)) << i;
  EXPECT_EQ(bytes[offset - 1], 0xee);
  EXPECT_EQ(bytes[offset + length], 0xee);

  // A shorter import of the same handle; a longer one is refused with the reason.
  EXPECT_EQ(Import(*handle, 100, 71, 71).exit_code, 0);
  ChildResult too_long = Import(*handle, length + 1, -1, 1);
  EXPECT_EQ(too_long.exit_code, 3) << too_long.out;
  EXPECT_NE(too_long.out.find("cannot import 6001 bytes"), std::string::npos) << too_long.out;

  // Imported in this process too: the same bytes through a second mapping, closed once.
  auto here = p->ImportFabric(*handle, length);
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  EXPECT_NE(*here, static_cast<void*>(base + offset));
  EXPECT_EQ(*static_cast<unsigned char*>(*here), Pattern(71, 0));
  EXPECT_TRUE(p->CloseFabric(*here, length).ok());
  EXPECT_EQ(p->CloseFabric(*here, length).code(), ErrorCode::kInvalidArgument);

  // Ranges outside the allocation and non-fabric memory do not export; fabric memory is not an IPC handle.
  EXPECT_EQ(p->ExportFabric(base, size + 1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->ExportIpc(base, 4096).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->ImportIpc(*handle, getpid(), length).status().code(), ErrorCode::kInvalidArgument);

  ASSERT_TRUE(p->Free(*fabric, size, AllocationKind::kFabric).ok());
  // Freed: the handle no longer names memory; the import fails with the driver's reason.
  ChildResult stale = Import(*handle, length, -1, 1);
  EXPECT_EQ(stale.exit_code, 3) << stale.out;
  EXPECT_NE(stale.out.find("cuMemImportFromShareableHandle(FABRIC) failed: CUDA_ERROR_INVALID_VALUE"),
            std::string::npos)
      << stale.out;
}

using testing::MapsPermissions;

// FabricAccess::kReadOnly sets CU_MEM_ACCESS_FLAGS_PROT_READ (the fake maps it PROT_READ): reads work, a write
// faults; a read-write import of the same allocation is a mapping of its own.
TEST(CudaFabricTest, AReadOnlyImportCannotBeWritten) {
  FakeEnv env("FAKE_CUDA_FABRIC", "1");
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  constexpr size_t kLen = 4096;
  auto fabric = p->Allocate(kLen, AllocationKind::kFabric, 0);
  ASSERT_TRUE(fabric.ok()) << fabric.status().ToString();
  auto put = p->CopyAsync(*fabric, "epochs", 6, -1);
  ASSERT_TRUE(put.ok() && (*put)->Wait().ok());
  auto handle = p->ExportFabric(*fabric, kLen);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  auto ro = p->ImportFabric(*handle, kLen, FabricAccess::kReadOnly);
  auto rw = p->ImportFabric(*handle, kLen);
  ASSERT_TRUE(ro.ok() && rw.ok()) << ro.status().ToString() << rw.status().ToString();
  EXPECT_NE(*ro, *rw);
  EXPECT_EQ(MapsPermissions(*ro).substr(0, 3), "r--");
  EXPECT_EQ(MapsPermissions(*rw).substr(0, 3), "rw-");
  char got[6] = {};
  auto read = p->CopyAsync(got, *ro, sizeof(got), -1);
  ASSERT_TRUE(read.ok() && (*read)->Wait().ok());
  EXPECT_EQ(memcmp(got, "epochs", 6), 0);
  pid_t child = fork();
  if (child == 0) {
    static_cast<volatile char*>(*ro)[0] = 'x';
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
  EXPECT_EQ(static_cast<char*>(*rw)[0], 'e');
  EXPECT_TRUE(p->CloseFabric(*ro, kLen).ok());
  EXPECT_TRUE(p->CloseFabric(*rw, kLen).ok());
  EXPECT_TRUE(p->Free(*fabric, kLen, AllocationKind::kFabric).ok());
}

TEST(CudaFabricTest, AForgedHandleIsRefused) {
  FakeEnv env("FAKE_CUDA_FABRIC", "1");
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  const std::string zeros(128, '0');
  auto forged = p->ImportFabric("mc-cuda-ipc:v1:fabric:1:0:0:4096:2097152:" + zeros, 4096);
  EXPECT_EQ(forged.status().code(), ErrorCode::kInvalidArgument) << forged.status().ToString();
  EXPECT_NE(forged.status().message().find("CUDA_ERROR_INVALID_VALUE"), std::string::npos)
      << forged.status().ToString();
}

// A device that says fabric handles are supported but has no IMEX channel: cuMemCreate(FABRIC) answers
// CUDA_ERROR_NOT_PERMITTED, and the platform keeps it as the reason.
TEST(CudaFabricTest, NoImexChannelKeepsTheDriversReason) {
  FakeEnv env("FAKE_CUDA_FABRIC", "no-imex");
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  auto fabric = p->Allocate(4096, AllocationKind::kFabric, 0);
  ASSERT_EQ(fabric.status().code(), ErrorCode::kNotImplemented) << fabric.status().ToString();
  EXPECT_EQ(fabric.status().message().rfind("fabric handles unsupported: cuda: cuMemCreate(2097152) failed: "
                                            "CUDA_ERROR_NOT_PERMITTED",
                                            0),
            0u)
      << fabric.status().message();
  const std::string zeros(128, '0');
  auto import = p->ImportFabric("mc-cuda-ipc:v1:fabric:1:0:0:4096:2097152:" + zeros, 4096);
  EXPECT_EQ(import.status().code(), ErrorCode::kNotImplemented) << import.status().ToString();
  EXPECT_NE(import.status().message().find("fabric handles unsupported: "), std::string::npos);
}

// Without the knob (a GPU without an NVSwitch fabric) the device attribute refuses before any cuMemCreate.
TEST(CudaFabricTest, WithoutFabricSupportTheAttributeIsTheReason) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  auto fabric = p->Allocate(4096, AllocationKind::kFabric, 0);
  EXPECT_EQ(fabric.status().code(), ErrorCode::kNotImplemented);
  EXPECT_NE(fabric.status().message().find("HANDLE_TYPE_FABRIC_SUPPORTED = 0"), std::string::npos)
      << fabric.status().message();
}

}  // namespace
}  // namespace mooncake::te
