// The host emulation's ROCm form (MakeHostEmulationPlatformOf(kRocm); MC_PLATFORM_EMULATION_DEVICE=rocm for the
// registered instance) and its fabric handles (named files under /dev/shm standing in for CUDA fabric handles).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "transfer_engine/platform/host_emulation/emulation_handle.h"
#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/platform/testing/proc_maps.h"

namespace mooncake::te {
namespace {

using host_emulation::EmulationFabricHandle;

TEST(EmulatedRocmTest, PresentsRocmMemoryAndRefusesCudaHandles) {
  auto rocm = MakeHostEmulationPlatformOf(MemoryType::kRocm, 2);
  auto cuda = MakeHostEmulationPlatformOf(MemoryType::kCuda, 2);
  ASSERT_NE(rocm, nullptr);
  EXPECT_EQ(MakeHostEmulationPlatformOf(MemoryType::kNpu), nullptr);
  EXPECT_EQ(rocm->device_type(), MemoryType::kRocm);
  EXPECT_NE(rocm->Probe().reason.find("rocm"), std::string::npos) << rocm->Probe().reason;
  auto dev = rocm->Allocate(8192, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE(rocm->Classify(*dev).has_value());
  EXPECT_EQ(rocm->Classify(*dev)->ToString(), "rocm:1");
  auto handle = rocm->ExportIpc(static_cast<char*>(*dev) + 4096, 4096);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  auto mapped = rocm->ImportIpc(*handle, getpid(), 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  memset(*mapped, 0x3c, 16);
  EXPECT_EQ(static_cast<unsigned char*>(*dev)[4096], 0x3c);
  EXPECT_EQ(rocm->Classify(*mapped)->ToString(), "rocm:1");
  EXPECT_TRUE(rocm->CloseIpc(*mapped, 4096).ok());
  // A CUDA emulation refuses the ROCm memfd (its name says rocm).
  auto wrong = cuda->ImportIpc(*handle, getpid(), 4096);
  EXPECT_FALSE(wrong.ok());
  EXPECT_TRUE(rocm->Free(*dev, 8192, AllocationKind::kDevice).ok());
}

TEST(EmulatedFabricTest, ExportsImportsAndOutlivesTheOwnersFree) {
  auto p = MakeHostEmulationPlatformOf(MemoryType::kCuda, 2);
  constexpr size_t kLen = 3 * 4096;
  auto fab = p->Allocate(kLen, AllocationKind::kFabric, 1);
  ASSERT_TRUE(fab.ok()) << fab.status().ToString();
  EXPECT_EQ(p->Classify(*fab)->ToString(), "cuda:1");
  EXPECT_EQ(p->ExportIpc(*fab, kLen).status().code(), ErrorCode::kInvalidArgument) << "fabric memory: ExportFabric";
  auto handle = p->ExportFabric(static_cast<char*>(*fab) + 100, 5000);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  auto decoded = EmulationFabricHandle::Decode(*handle);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->offset, 100u);
  EXPECT_EQ(decoded->device, 1);
  const std::string path = std::string(host_emulation::kFabricDir) + "/" + decoded->name;
  EXPECT_EQ(access(path.c_str(), F_OK), 0);

  auto mapped = p->ImportFabric(*handle, 5000);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  memcpy(*mapped, "fabric", 6);
  EXPECT_EQ(memcmp(static_cast<char*>(*fab) + 100, "fabric", 6), 0);
  EXPECT_EQ(p->CloseIpc(*mapped, 5000).code(), ErrorCode::kInvalidArgument) << "a fabric import is not an IPC one";
  EXPECT_EQ(p->ImportFabric(*handle, 5001).status().code(), ErrorCode::kInvalidArgument) << "past the handle";
  // A ROCm emulation does not take a CUDA fabric handle.
  EXPECT_EQ(MakeHostEmulationPlatformOf(MemoryType::kRocm)->ImportFabric(*handle, 10).status().code(),
            ErrorCode::kInvalidArgument);

  ASSERT_TRUE(p->Free(*fab, kLen, AllocationKind::kFabric).ok());
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "Free unlinks the file";
  EXPECT_EQ(memcmp(*mapped, "fabric", 6), 0) << "an import made before the Free keeps the memory";
  EXPECT_EQ(p->ImportFabric(*handle, 10).status().code(), ErrorCode::kNotFound) << "no import after the Free";
  EXPECT_TRUE(p->CloseFabric(*mapped, 5000).ok());
  EXPECT_EQ(p->CloseFabric(*mapped, 5000).code(), ErrorCode::kInvalidArgument);
}

using testing::MapsPermissions;

TEST(EmulatedFabricTest, AReadOnlyImportCannotBeWrittenButReads) {
  auto p = MakeHostEmulationPlatformOf(MemoryType::kCuda, 2);
  constexpr size_t kLen = 2 * 4096;
  auto fab = p->Allocate(kLen, AllocationKind::kFabric, 0);
  ASSERT_TRUE(fab.ok()) << fab.status().ToString();
  memcpy(*fab, "epochs", 6);
  auto handle = p->ExportFabric(*fab, kLen);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  auto ro = p->ImportFabric(*handle, kLen, FabricAccess::kReadOnly);
  auto rw = p->ImportFabric(*handle, kLen, FabricAccess::kReadWrite);
  ASSERT_TRUE(ro.ok() && rw.ok()) << ro.status().ToString() << rw.status().ToString();
  EXPECT_EQ(MapsPermissions(*ro), "r--s");
  EXPECT_EQ(MapsPermissions(*rw), "rw-s");
  char got[6] = {};
  auto read = p->CopyAsync(got, *ro, sizeof(got), -1);
  ASSERT_TRUE(read.ok() && (*read)->Wait().ok());
  EXPECT_EQ(memcmp(got, "epochs", 6), 0);
  auto write = p->CopyAsync(*ro, "forged", 6, -1);
  ASSERT_TRUE(write.ok());
  EXPECT_EQ((*write)->Wait().code(), ErrorCode::kInvalidArgument) << "a device write into a read-only import";
  EXPECT_EQ(memcmp(*fab, "epochs", 6), 0);
  // A plain store through it faults (in a child, so the test survives it).
  pid_t child = fork();
  if (child == 0) {
    static_cast<volatile char*>(*ro)[0] = 'x';
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
  EXPECT_EQ(static_cast<char*>(*fab)[0], 'e');
  EXPECT_TRUE(p->CloseFabric(*ro, kLen).ok());
  EXPECT_TRUE(p->CloseFabric(*rw, kLen).ok());
  EXPECT_TRUE(p->Free(*fab, kLen, AllocationKind::kFabric).ok());
}

TEST(EmulatedFabricTest, AProcessThatExitsWithoutFreeingLeavesNoFabricFile) {
  // The parent holds a fabric file while a forked child allocates its own and exits normally without Free: the
  // child's file is gone, the parent's (inherited in the child's memory) is kept.
  auto p = MakeHostEmulationPlatformOf(MemoryType::kCuda, 1);
  auto mine = p->Allocate(4096, AllocationKind::kFabric, 0);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  auto name_of = [&](void* ptr) {
    auto h = p->ExportFabric(ptr, 4096);
    return h.ok() ? std::string(host_emulation::kFabricDir) + "/" + EmulationFabricHandle::Decode(*h)->name : "";
  };
  const std::string parent_file = name_of(*mine);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  if (child == 0) {
    auto theirs = p->Allocate(4096, AllocationKind::kFabric, 0);
    std::string file = theirs.ok() ? name_of(*theirs) : "";
    (void)!write(fds[1], file.data(), file.size());
    close(fds[1]);
    exit(theirs.ok() ? 0 : 1);  // normal exit: static destructors run, no Free
  }
  close(fds[1]);
  char buf[512] = {};
  ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_GT(n, 0);
  EXPECT_NE(access(buf, F_OK), 0) << buf << " was left behind";
  EXPECT_EQ(access(parent_file.c_str(), F_OK), 0) << "the child removed its parent's file";
  EXPECT_TRUE(p->Free(*mine, 4096, AllocationKind::kFabric).ok());
  EXPECT_NE(access(parent_file.c_str(), F_OK), 0);
}

TEST(EmulatedFabricTest, ExportsOnlyFabricAllocations) {
  auto p = MakeHostEmulationPlatformOf(MemoryType::kCuda, 1);
  auto dev = p->Allocate(4096, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  EXPECT_EQ(p->ExportFabric(*dev, 4096).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(p->Free(*dev, 4096, AllocationKind::kDevice).ok());
  // The cpu platform (the Platform defaults) says why it has none.
  auto cpu = PlatformRegistry::Get().Find("cpu");
  ASSERT_NE(cpu, nullptr);
  auto none = cpu->ExportFabric(nullptr, 1);
  EXPECT_EQ(none.status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(none.status().message().rfind("fabric handles unsupported: ", 0), 0u) << none.status().message();
}

TEST(EmulatedFabricTest, HandlesFromDescriptorsAreCheckedBeforeAnyFileIsOpened) {
  auto p = MakeHostEmulationPlatformOf(MemoryType::kCuda, 1);
  for (const char* bad : {"", "mc-host-emulation-fabric:v1:cuda:mc-emu-fabric-../../etc/passwd:0:1:0",
                          "mc-host-emulation-fabric:v1:cuda:/etc/passwd:0:1:0",
                          "mc-host-emulation-fabric:v1:cuda:other-name:0:1:0",
                          "mc-host-emulation-fabric:v1:npu:mc-emu-fabric-1:0:1:0",
                          "mc-host-emulation-fabric:v1:cuda:mc-emu-fabric-1:0:0:0",
                          "mc-host-emulation-fabric:v1:cuda:mc-emu-fabric-1:18446744073709551615:2:0",
                          "mc-host-emulation-fabric:v1:cuda:mc-emu-fabric-1:0:1",
                          "mc-host-emulation-ipc:v1:1:2:3:0:1:0"}) {
    EXPECT_EQ(p->ImportFabric(bad, 1).status().code(), ErrorCode::kInvalidArgument) << bad;
  }
  // A well-formed name that does not exist: the memory is gone.
  EXPECT_EQ(p->ImportFabric("mc-host-emulation-fabric:v1:cuda:mc-emu-fabric-0-0-none:0:1:0", 1).status().code(),
            ErrorCode::kNotFound);
}

}  // namespace
}  // namespace mooncake::te
