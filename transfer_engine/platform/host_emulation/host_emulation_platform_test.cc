#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transfer_engine/platform/host_emulation/emulation_handle.h"
#include "transfer_engine/platform/testing/stalling_page.h"

extern char** environ;

namespace mooncake::te {
namespace {

using host_emulation::EmulationHandle;

struct ChildResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

std::string ChildPath() {
  const std::string rel = "transfer_engine/platform/host_emulation/ipc_child";
  if (access(rel.c_str(), X_OK) == 0) return rel;  // Bazel runs tests in the runfiles tree
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "mooncake_monorepo") + "/" + rel;
}

ChildResult RunChild(const std::vector<std::string>& args) {
  int pipefd[2];
  EXPECT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 2);
  std::string path = ChildPath();
  std::vector<char*> argv{path.data()};
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, path.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipefd[1]);
  ChildResult result;
  if (rc != 0) {
    close(pipefd[0]);
    result.out = "posix_spawn " + path + ": " + strerror(rc);
    return result;
  }
  char buf[512];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) result.out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

TEST(HostEmulationTest, IsNamedAsAnEmulationOfCuda) {
  auto p = MakeHostEmulationPlatform(3);
  EXPECT_EQ(p->name(), "host_emulation");
  EXPECT_EQ(p->device_type(), MemoryType::kCuda);
  PlatformProbe probe = p->Probe();
  EXPECT_TRUE(probe.usable);
  EXPECT_EQ(probe.device_count, 3);
  EXPECT_NE(probe.reason.find("EMULATION"), std::string::npos) << probe.reason;
}

TEST(HostEmulationTest, RegisteredButDisabledUnlessAskedFor) {
  ASSERT_EQ(getenv(kPlatformEmulationEnv), nullptr) << "the test must run without " << kPlatformEmulationEnv;
  EXPECT_FALSE(HostEmulationRequestedByEnv());
  auto& reg = PlatformRegistry::Get();
  auto registered = reg.Find("host_emulation");
  ASSERT_NE(registered, nullptr);  // linked in (alwayslink)...
  PlatformProbe probe = registered->Probe();
  EXPECT_FALSE(probe.usable);  // ...but off
  EXPECT_NE(probe.reason.find("MC_PLATFORM_EMULATION=1"), std::string::npos) << probe.reason;
  EXPECT_EQ(reg.ForType(MemoryType::kCuda), nullptr);
  auto refused = registered->Allocate(4096, AllocationKind::kDevice, 0);
  EXPECT_EQ(refused.status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_NE(refused.status().message().find("EMULATION"), std::string::npos) << refused.status().ToString();
  EXPECT_EQ(registered->ImportIpc("x", getpid(), 1).status().code(), ErrorCode::kDeviceNotFound);
  char buf[8];
  EXPECT_EQ(registered->ExportIpc(buf, 8).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(registered->CopyAsync(buf, buf + 4, 4, 0).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_FALSE(registered->Classify(buf).has_value());

  auto p = MakeHostEmulationPlatform();  // explicit: enabled; replaces the registered one
  reg.Register(p);
  EXPECT_EQ(reg.Find("host_emulation"), p);
  EXPECT_EQ(reg.ForType(MemoryType::kCuda), p);
  auto dev = p->Allocate(4096, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(reg.Classify(static_cast<char*>(*dev) + 100).ToString(), "cuda:1");
  int on_stack = 0;
  EXPECT_EQ(reg.Classify(&on_stack).ToString(), "host");
  EXPECT_TRUE(p->Free(*dev, 4096, AllocationKind::kDevice).ok());
  EXPECT_EQ(reg.Classify(*dev).ToString(), "host");
  reg.Register(registered);  // put the disabled one back

  setenv(kPlatformEmulationEnv, "0", 1);
  EXPECT_FALSE(HostEmulationRequestedByEnv());
  setenv(kPlatformEmulationEnv, "1", 1);
  EXPECT_TRUE(HostEmulationRequestedByEnv());
  unsetenv(kPlatformEmulationEnv);
}

TEST(HostEmulationTest, AllocateClassifyFree) {
  auto p = MakeHostEmulationPlatform(2);
  auto dev = p->Allocate(10000, AllocationKind::kDevice, 0);
  auto share = p->Allocate(5000, AllocationKind::kShareable, 1);
  auto pinned = p->Allocate(3000, AllocationKind::kPinnedHost, -1);
  ASSERT_TRUE(dev.ok() && share.ok() && pinned.ok());
  auto* d = static_cast<unsigned char*>(*dev);
  EXPECT_EQ(d[0], 0);
  EXPECT_EQ(d[9999], 0);  // zero-filled
  memset(d, 0xab, 10000);

  EXPECT_EQ(p->Classify(d)->ToString(), "cuda:0");
  EXPECT_EQ(p->Classify(d + 9999)->ToString(), "cuda:0");
  EXPECT_FALSE(p->Classify(d + 10000).has_value());  // past the length asked for
  EXPECT_EQ(p->Classify(static_cast<char*>(*share) + 4999)->ToString(), "cuda:1");
  EXPECT_EQ(p->Classify(*pinned)->ToString(), "host");
  int on_stack = 0;
  EXPECT_FALSE(p->Classify(&on_stack).has_value());

  EXPECT_EQ(p->Allocate(0, AllocationKind::kDevice, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->Allocate(64, AllocationKind::kDevice, 2).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->Allocate(64, AllocationKind::kDevice, -1).status().code(), ErrorCode::kDeviceNotFound);

  EXPECT_EQ(p->Free(d, 4096, AllocationKind::kDevice).code(), ErrorCode::kInvalidArgument);      // wrong length
  EXPECT_EQ(p->Free(d, 10000, AllocationKind::kShareable).code(), ErrorCode::kInvalidArgument);  // wrong kind
  EXPECT_EQ(p->Free(d + 1, 9999, AllocationKind::kDevice).code(), ErrorCode::kInvalidArgument);  // not the start
  EXPECT_TRUE(p->Free(d, 10000, AllocationKind::kDevice).ok());
  EXPECT_EQ(p->Free(d, 10000, AllocationKind::kDevice).code(), ErrorCode::kInvalidArgument);     // twice
  EXPECT_FALSE(p->Classify(d).has_value());
  EXPECT_TRUE(p->Free(*share, 5000, AllocationKind::kShareable).ok());
  EXPECT_TRUE(p->Free(*pinned, 3000, AllocationKind::kPinnedHost).ok());
}

TEST(HostEmulationTest, ExportInParentImportInChildProcess) {
  auto p = MakeHostEmulationPlatform(2);
  const size_t size = 3 * 4096 + 123;
  auto dev = p->Allocate(size, AllocationKind::kShareable, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto* base = static_cast<unsigned char*>(*dev);
  memset(base, 0xee, size);
  // An unaligned sub-range: the child must map the right pages and land at the right offset.
  const size_t offset = 4096 + 17, length = 5000;
  auto handle = p->ExportIpc(base + offset, length);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();

  ChildResult r = RunChild({*handle, std::to_string(getpid()), std::to_string(length), "41"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "cuda:1\n");
  for (size_t i = 0; i < length; ++i) {
    ASSERT_EQ(base[offset + i], static_cast<unsigned char>(41 + i * 7)) << "byte " << i;
  }
  EXPECT_EQ(base[offset - 1], 0xee);           // nothing before the range
  EXPECT_EQ(base[offset + length], 0xee);      // nor after it
  EXPECT_TRUE(p->Free(*dev, size, AllocationKind::kShareable).ok());
}

TEST(HostEmulationTest, ChildGetsClearErrorsForBadHandles) {
  auto p = MakeHostEmulationPlatform();
  auto dev = p->Allocate(8192, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  auto handle = p->ExportIpc(*dev, 8192);
  ASSERT_TRUE(handle.ok());
  const std::string me = std::to_string(getpid());

  ChildResult garbage = RunChild({"cuda-ipc:deadbeef", me, "8192", "1"});
  EXPECT_EQ(garbage.exit_code, 3) << garbage.out;
  EXPECT_NE(garbage.out.find("not a host-emulation IPC handle"), std::string::npos) << garbage.out;

  ChildResult too_long = RunChild({*handle, me, "8193", "1"});
  EXPECT_EQ(too_long.exit_code, 3) << too_long.out;
  EXPECT_NE(too_long.out.find("cannot import 8193 bytes"), std::string::npos) << too_long.out;

  ChildResult wrong_pid = RunChild({*handle, "1", "8192", "1"});
  EXPECT_EQ(wrong_pid.exit_code, 3) << wrong_pid.out;
  EXPECT_NE(wrong_pid.out.find("exported by process"), std::string::npos) << wrong_pid.out;

  // A forged handle naming one of our fds that is not emulated device memory (a pipe).
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  EmulationHandle forged;
  forged.pid = getpid();
  forged.fd = pipefd[0];
  forged.length = 4096;
  ChildResult not_memfd = RunChild({forged.Encode(), me, "4096", "1"});
  EXPECT_EQ(not_memfd.exit_code, 3) << not_memfd.out;
  EXPECT_NE(not_memfd.out.find("is not the exported memory (it is pipe:"), std::string::npos) << not_memfd.out;
  close(pipefd[0]);
  close(pipefd[1]);

  // After Free the owner's fd is closed (its number may be reused, even by another allocation): the handle
  // names nothing.
  ASSERT_TRUE(p->Free(*dev, 8192, AllocationKind::kDevice).ok());
  auto reuse = p->Allocate(8192, AllocationKind::kDevice, 0);
  ASSERT_TRUE(reuse.ok());
  ChildResult freed = RunChild({*handle, me, "8192", "1"});
  EXPECT_EQ(freed.exit_code, 3) << freed.out;
  EXPECT_NE(freed.out.find("NOT_FOUND"), std::string::npos) << freed.out;
  EXPECT_EQ(static_cast<unsigned char*>(*reuse)[0], 0);  // the new allocation was not written
  ASSERT_TRUE(p->Free(*reuse, 8192, AllocationKind::kDevice).ok());
}

TEST(HostEmulationTest, ImportInSameProcessAndClose) {
  auto owner = MakeHostEmulationPlatform();
  auto importer = MakeHostEmulationPlatform();
  auto dev = owner->Allocate(4096, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  auto handle = owner->ExportIpc(*dev, 4096);
  ASSERT_TRUE(handle.ok());
  auto mapped = importer->ImportIpc(*handle, getpid(), 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_NE(*mapped, *dev);
  memcpy(static_cast<char*>(*mapped) + 10, "mooncake", 8);
  EXPECT_EQ(memcmp(static_cast<char*>(*dev) + 10, "mooncake", 8), 0);
  EXPECT_EQ(importer->Classify(*mapped)->ToString(), "cuda:0");
  EXPECT_EQ(importer->Free(*mapped, 4096, AllocationKind::kDevice).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(importer->CloseIpc(*mapped, 100).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(importer->CloseIpc(*mapped, 4096).ok());
  EXPECT_EQ(importer->CloseIpc(*mapped, 4096).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(owner->CloseIpc(*dev, 4096).code(), ErrorCode::kInvalidArgument);  // an allocation, not an import

  // Exports only of device allocations, and only inside them.
  auto pinned = owner->Allocate(4096, AllocationKind::kPinnedHost, -1);
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(owner->ExportIpc(*pinned, 4096).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(owner->ExportIpc(*dev, 4097).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(owner->ExportIpc(static_cast<char*>(*dev) + 4000, 97).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(owner->ExportIpc(*dev, 0).status().code(), ErrorCode::kInvalidArgument);
  int on_stack = 0;
  EXPECT_EQ(owner->ExportIpc(&on_stack, 4).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(importer->ImportIpc("", getpid(), 1).status().code(), ErrorCode::kInvalidArgument);
}

TEST(HostEmulationTest, AsyncCopyRunsOnAWorkerWithARealCompletion) {
  auto p = MakeHostEmulationPlatform();
  const size_t size = 8 << 20;
  auto dev = p->Allocate(size, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  std::vector<unsigned char> host(size), back(size);
  for (size_t i = 0; i < size; ++i) host[i] = static_cast<unsigned char>(i * 131 + 7);

  std::vector<std::unique_ptr<CopyCompletion>> copies;
  for (int i = 0; i < 8; ++i) {  // in order on the worker: H2D of each chunk, then D2H of the whole
    const size_t chunk = size / 8;
    auto c = p->CopyAsync(static_cast<char*>(*dev) + i * chunk, host.data() + i * chunk, chunk, 0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    copies.push_back(std::move(*c));
  }
  auto d2h = p->CopyAsync(back.data(), *dev, size, -1);
  ASSERT_TRUE(d2h.ok());
  EXPECT_TRUE((*d2h)->Wait().ok());
  EXPECT_TRUE((*d2h)->Done());
  for (auto& c : copies) EXPECT_TRUE(c->Done());  // ran before d2h
  EXPECT_EQ(memcmp(back.data(), host.data(), size), 0);

  // A destination that is not writable: the completion reports it, the process survives.
  void* ro = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  auto bad = p->CopyAsync(ro, host.data(), 4096, 0);
  ASSERT_TRUE(bad.ok());
  Status st = (*bad)->Wait();
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("async copy failed"), std::string::npos) << st.ToString();
  munmap(ro, 4096);

  EXPECT_EQ(p->CopyAsync(nullptr, host.data(), 1, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->CopyAsync(back.data(), host.data(), 1, 7).status().code(), ErrorCode::kDeviceNotFound);
  int stream = 0;
  auto with_stream = p->CopyAsync(back.data(), host.data(), 1, 0, &stream);
  EXPECT_EQ(with_stream.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(with_stream.status().message().find("not a stream of this platform"), std::string::npos)
      << with_stream.status().ToString();
  EXPECT_TRUE(p->Free(*dev, size, AllocationKind::kDevice).ok());
}

TEST(HostEmulationTest, ADroppedCompletionStillRunsInSubmissionOrder) {
  auto p = MakeHostEmulationPlatform();
  const size_t size = 4 << 20;
  auto dev = p->Allocate(size, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  std::vector<unsigned char> host(size, 0x5a), back(size, 0);
  ASSERT_TRUE(p->CopyAsync(*dev, host.data(), size, 0).ok());  // not waited for: the completion is dropped
  auto d2h = p->CopyAsync(back.data(), *dev, size, 0);
  ASSERT_TRUE(d2h.ok());
  EXPECT_TRUE((*d2h)->Wait().ok());
  EXPECT_EQ(back.front(), 0x5a);
  EXPECT_EQ(back.back(), 0x5a);
  EXPECT_TRUE(p->Free(*dev, size, AllocationKind::kDevice).ok());
}

TEST(HostEmulationTest, StreamsRunConcurrentlyAndInOrderEach) {
  testing::StallingPage stall;
  if (!stall.ok()) GTEST_SKIP() << "no userfaultfd here: " << stall.why();
  auto p = MakeHostEmulationPlatform();
  auto a = p->CreateStream(0), b = p->CreateStream(0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(*a, *b);
  std::vector<char> stalled_dst(stall.size(), 0), after_dst(64, 0), other_dst(64, 0), src(64, 'o');

  // On stream a: a copy that reads the stalling page (blocks), then one queued behind it.
  auto stalled = p->CopyAsync(stalled_dst.data(), stall.data(), stall.size(), 0, *a);
  ASSERT_TRUE(stalled.ok()) << stalled.status().ToString();
  auto behind = p->CopyAsync(after_dst.data(), src.data(), src.size(), -1, *a);
  ASSERT_TRUE(behind.ok());
  ASSERT_TRUE(stall.WaitForToucher(10000));
  // On stream b, and on the platform's own: not held back by a's stalled copy.
  auto other = p->CopyAsync(other_dst.data(), src.data(), src.size(), 0, *b);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->Wait().ok());
  EXPECT_EQ(other_dst, src);
  auto own = p->CopyAsync(other_dst.data(), src.data(), src.size(), 0);
  ASSERT_TRUE(own.ok());
  EXPECT_TRUE((*own)->Wait().ok());
  EXPECT_FALSE((*stalled)->Done());
  EXPECT_FALSE((*behind)->Done());  // in order on its stream

  ASSERT_TRUE(stall.Release('s'));
  EXPECT_TRUE((*stalled)->Wait().ok());
  EXPECT_TRUE((*behind)->Wait().ok());
  EXPECT_EQ(stalled_dst, std::vector<char>(stall.size(), 's'));
  EXPECT_EQ(after_dst, src);

  EXPECT_TRUE(p->DestroyStream(*a).ok());
  EXPECT_TRUE(p->DestroyStream(*b).ok());
}

TEST(HostEmulationTest, StreamHandlesAreChecked) {
  auto p = MakeHostEmulationPlatform(2);
  EXPECT_EQ(p->CreateStream(2).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->CreateStream(-1).status().code(), ErrorCode::kDeviceNotFound);
  auto s = p->CreateStream(1);
  ASSERT_TRUE(s.ok());
  std::vector<char> a(16, 'q'), b(16, 0);
  EXPECT_EQ(p->CopyAsync(b.data(), a.data(), a.size(), 0, *s).status().code(), ErrorCode::kInvalidArgument);
  auto right = p->CopyAsync(b.data(), a.data(), a.size(), 1, *s);
  ASSERT_TRUE(right.ok());
  EXPECT_TRUE(p->DestroyStream(*s).ok());  // runs what was queued first
  EXPECT_TRUE((*right)->Done());
  EXPECT_EQ(a, b);
  EXPECT_EQ(p->DestroyStream(*s).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->CopyAsync(b.data(), a.data(), a.size(), 1, *s).status().code(), ErrorCode::kInvalidArgument);
  int not_a_stream = 0;
  EXPECT_EQ(p->DestroyStream(&not_a_stream).code(), ErrorCode::kInvalidArgument);

  auto disabled = PlatformRegistry::Get().Find("host_emulation");  // registered, off without the variable
  ASSERT_NE(disabled, nullptr);
  EXPECT_EQ(disabled->CreateStream(0).status().code(), ErrorCode::kDeviceNotFound);
}

TEST(HostEmulationTest, CompletionOutlivesThePlatform) {
  std::vector<char> a(1 << 20, 'x'), b(1 << 20, 0);
  std::unique_ptr<CopyCompletion> c;
  {
    auto p = MakeHostEmulationPlatform();
    auto r = p->CopyAsync(b.data(), a.data(), a.size(), 0);
    ASSERT_TRUE(r.ok());
    c = std::move(*r);
  }  // the platform's destructor runs the queued copy
  EXPECT_TRUE(c->Done());
  EXPECT_TRUE(c->Wait().ok());
  EXPECT_EQ(b[a.size() - 1], 'x');
}

TEST(EmulationHandleTest, RoundTripAndRejects) {
  EmulationHandle h{1234, 17, 99, 4113, 5000, 1};
  auto back = EmulationHandle::Decode(h.Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->pid, 1234);
  EXPECT_EQ(back->fd, 17);
  EXPECT_EQ(back->serial, 99u);
  EXPECT_EQ(back->offset, 4113u);
  EXPECT_EQ(back->length, 5000u);
  EXPECT_EQ(back->device, 1);
  for (const char* bad : {"", "mc-host-emulation-ipc:v1:", "mc-host-emulation-ipc:v2:1:2:9:3:4:5",
                          "mc-host-emulation-ipc:v1:1:2:9:3:4", "mc-host-emulation-ipc:v1:1:2:9:3:4:5:6",
                          "mc-host-emulation-ipc:v1:0:2:9:3:4:5", "mc-host-emulation-ipc:v1:1:2:9:3:0:5",
                          "mc-host-emulation-ipc:v1:1:-2:9:3:4:5", "mc-host-emulation-ipc:v1:1:2:9:x:4:5",
                          "mc-host-emulation-ipc:v1:1:2:9:18446744073709551615:1:0",
                          "mc-host-emulation-ipc:v1:1:2:9:3:4:99999999999", "mc-host-emulation-ipc:v1:1:2::3:4:5",
                          "mc-host-emulation-ipc:v1:1:2:9:3:4:5 "}) {
    auto r = EmulationHandle::Decode(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(HostEmulationTest, ExportDmabufDuplicatesTheAllocationsMemfdAtTheRangesOffset) {
  auto p = MakeHostEmulationPlatform(2);
  const size_t len = 3 * 4096 + 100;
  auto dev = p->Allocate(len, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  char* base = static_cast<char*>(*dev);
  memcpy(base + 5000, "dmabuf", 6);
  auto d = p->ExportDmabuf(base + 5000, 6);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->offset, 5000u);
  // A real fd of its own: the bytes at `offset` are the range's, and it outlives the allocation's Free.
  char got[6] = {};
  ASSERT_EQ(pread(d->fd, got, sizeof(got), static_cast<off_t>(d->offset)), 6);
  EXPECT_EQ(std::string(got, 6), "dmabuf");
  EXPECT_TRUE(p->Free(*dev, len, AllocationKind::kDevice).ok());
  EXPECT_EQ(fcntl(d->fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(close(d->fd), 0);

  auto again = p->Allocate(8192, AllocationKind::kDevice, 0);
  ASSERT_TRUE(again.ok());
  char* a = static_cast<char*>(*again);
  EXPECT_EQ(p->ExportDmabuf(a + 4096, 8192).status().code(), ErrorCode::kInvalidArgument);  // past the end
  EXPECT_EQ(p->ExportDmabuf(a, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->ExportDmabuf(nullptr, 16).status().code(), ErrorCode::kInvalidArgument);
  int on_stack = 0;
  EXPECT_EQ(p->ExportDmabuf(&on_stack, 4).status().code(), ErrorCode::kInvalidArgument);
  auto pinned = p->Allocate(4096, AllocationKind::kPinnedHost, -1);
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(p->ExportDmabuf(*pinned, 16).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(p->Free(*pinned, 4096, AllocationKind::kPinnedHost).ok());
  EXPECT_TRUE(p->Free(*again, 8192, AllocationKind::kDevice).ok());
}

TEST(HostEmulationTest, LocalityIsAsConfigured) {
  auto p = MakeHostEmulationPlatform(3, {DeviceLocality{1, "0000:3b:00.0"}, DeviceLocality{0, "0000:af:00.0"}});
  auto d0 = p->Locality(0);
  ASSERT_TRUE(d0.ok()) << d0.status().ToString();
  EXPECT_EQ(d0->numa_node, 1);
  EXPECT_EQ(d0->pci_bus_id, "0000:3b:00.0");
  EXPECT_EQ(p->Locality(1)->numa_node, 0);
  auto unknown = p->Locality(2);  // not configured: unknown, not an error
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->numa_node, -1);
  EXPECT_EQ(unknown->pci_bus_id, "");
  EXPECT_EQ(p->Locality(3).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->Locality(-1).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(MakeHostEmulationPlatform(1)->Locality(0)->numa_node, -1);
}

}  // namespace
}  // namespace mooncake::te
