// The cuda platform: its verdict without a driver (this machine), and everything else against the FAKE driver
// of testing/fake_driver.cc, which checks the platform's discipline (cuInit first, a current context, copies on
// real streams of that context) the way the real driver would. Cross-process IPC runs this binary again as the importing child.
#include "transfer_engine/platform/cuda/cuda_platform.h"
#include "transfer_engine/platform/testing/run_self.h"
#include "transfer_engine/platform/testing/runfile.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace mooncake::te {
namespace {

std::string FakeDriver() { return testing::FakeCudaDriver(); }
std::string FakeDriverV1() { return testing::FakeCudaDriver(/*v1=*/true); }

// --- the child process: imports MC_TEST_HANDLE of MC_TEST_PID, writes a pattern, closes ---------------------

int ChildMain() {
  const std::string handle = getenv("MC_TEST_HANDLE");
  const int pid = atoi(getenv("MC_TEST_PID"));
  const size_t length = strtoull(getenv("MC_TEST_LENGTH"), nullptr, 10);
  const int pattern = atoi(getenv("MC_TEST_PATTERN"));
  auto p = MakeCudaPlatform({FakeDriver()});
  StatusOr<void*> mapped = p->ImportIpc(handle, pid, length);
  if (!mapped.ok()) {
    fprintf(stderr, "%s\n", mapped.status().ToString().c_str());
    return 3;
  }
  StatusOr<void*> again = p->ImportIpc(handle, pid, length);  // the same mapping, counted twice
  if (!again.ok() || *again != *mapped) {
    fprintf(stderr, "second import: %s\n", again.ok() ? "another address" : again.status().ToString().c_str());
    return 4;
  }
  std::optional<MemoryKind> kind = p->Classify(*mapped);
  std::vector<unsigned char> src(length);
  for (size_t i = 0; i < length; ++i) src[i] = static_cast<unsigned char>(pattern + i * 7);
  auto copy = p->CopyAsync(*mapped, src.data(), length, -1);
  if (!copy.ok() || !(*copy)->Wait().ok()) {
    fprintf(stderr, "copy failed\n");
    return 4;
  }
  Status c1 = p->CloseIpc(*mapped, length), c2 = p->CloseIpc(*mapped, length), c3 = p->CloseIpc(*mapped, length);
  if (!c1.ok() || !c2.ok() || c3.ok()) {
    fprintf(stderr, "close: %s / %s / %s\n", c1.ToString().c_str(), c2.ToString().c_str(), c3.ToString().c_str());
    return 4;
  }
  printf("%s\n", kind ? kind->ToString().c_str() : "unclassified");
  return 0;
}

// --- the importer child process: for each line "<handle> <pid> <length>" on stdin, imports it (keeping every
// import) and answers "ok <first byte, 2 hex digits>" or "error <status>" on stdout ---------------------------

int ImporterMain() {
  auto p = MakeCudaPlatform({FakeDriver()});
  char line[1024];
  while (fgets(line, sizeof(line), stdin) != nullptr) {
    std::istringstream in(line);
    std::string handle;
    int pid = 0;
    size_t length = 0;
    in >> handle >> pid >> length;
    StatusOr<void*> mapped = p->ImportIpc(handle, pid, length);
    if (mapped.ok()) {
      printf("ok %02x\n", *static_cast<unsigned char*>(*mapped));
    } else {
      printf("error %s\n", mapped.status().ToString().c_str());
    }
    fflush(stdout);
  }
  return 0;
}

const bool kIsChild = [] {
  if (getenv("MC_TEST_IMPORTER") != nullptr) {
    const int rc = ImporterMain();
    fflush(stdout);
    _exit(rc);
  }
  if (getenv("MC_TEST_HANDLE") == nullptr) return false;
  const int rc = ChildMain();
  fflush(stdout);
  _exit(rc);
}();

using testing::ChildResult;

ChildResult RunChild(const std::string& handle, int pid, size_t length, int pattern) {
  return testing::RunSelf({"MC_TEST_HANDLE=" + handle, "MC_TEST_PID=" + std::to_string(pid),
                           "MC_TEST_LENGTH=" + std::to_string(length), "MC_TEST_PATTERN=" + std::to_string(pattern)});
}

// A running ImporterMain child.
class Importer {
 public:
  Importer() {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.push_back("MC_TEST_IMPORTER=1");
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    int to_child[2], from_child[2];
    EXPECT_EQ(pipe2(to_child, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(from_child, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    EXPECT_EQ(posix_spawn(&pid_, self, &actions, nullptr, argv, envp.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
  }
  ~Importer() {
    fclose(in_);  // EOF: the child exits
    fclose(out_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  // The child's answer to importing `handle`.
  std::string Import(const std::string& handle, int pid, size_t length) {
    fprintf(in_, "%s %d %zu\n", handle.c_str(), pid, length);
    fflush(in_);
    char line[1024] = {0};
    if (fgets(line, sizeof(line), out_) == nullptr) return "(no answer)";
    std::string answer(line);
    if (!answer.empty() && answer.back() == '\n') answer.pop_back();
    return answer;
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

// Field `index` of a ':'-separated handle, or the handle with that field replaced by `value`.
std::string HandleField(const std::string& handle, size_t index) {
  std::vector<std::string> f;
  std::stringstream in(handle);
  for (std::string part; std::getline(in, part, ':');) f.push_back(part);
  return index < f.size() ? f[index] : "";
}
std::string WithHandleField(const std::string& handle, size_t index, const std::string& value) {
  std::vector<std::string> f;
  std::stringstream in(handle);
  for (std::string part; std::getline(in, part, ':');) f.push_back(part);
  if (index < f.size()) f[index] = value;
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) out += (i ? ":" : "") + f[i];
  return out;
}

// Sets fake-driver knobs for one test; restores them after.
class FakeEnv {
 public:
  FakeEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto& [k, v] : vars) {
      names_.push_back(k);
      setenv(k, v, 1);
    }
  }
  ~FakeEnv() {
    for (const char* k : names_) unsetenv(k);
  }

 private:
  std::vector<const char*> names_;
};

// --- without a driver ----------------------------------------------------------------------------------------

TEST(CudaPlatformTest, WithoutADriverSaysExactlyWhy) {
  void* real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto p = MakeCudaPlatform();
  EXPECT_EQ(p->name(), "cuda");
  EXPECT_EQ(p->device_type(), MemoryType::kCuda);
  PlatformProbe probe = p->Probe();
  if (real != nullptr) {  // a machine with a driver: nothing to check here
    GTEST_SKIP() << "libcuda.so.1 is installed: " << probe.reason;
  }
  EXPECT_FALSE(probe.usable);
  EXPECT_EQ(probe.reason, "libcuda.so.1: cannot open shared object file: No such file or directory");
  EXPECT_EQ(probe.device_count, 0);
  int x = 0;
  EXPECT_FALSE(p->Classify(&x).has_value());
  auto a = p->Allocate(4096, AllocationKind::kDevice, 0);
  EXPECT_EQ(a.status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_NE(a.status().message().find("libcuda.so.1: cannot open shared object file"), std::string::npos);
  EXPECT_EQ(p->Free(&x, 4, AllocationKind::kDevice).code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->ExportIpc(&x, 4).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->ImportIpc("x", 1, 4).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->CloseIpc(&x, 4).code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->CopyAsync(&x, &x, 4, 0).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->Probe().reason, probe.reason);  // the same verdict again
}

TEST(CudaPlatformTest, IsRegisteredWhenLinkedIn) {
  auto p = PlatformRegistry::Get().Find("cuda");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->device_type(), MemoryType::kCuda);
  if (!p->Probe().usable) {
    EXPECT_EQ(PlatformRegistry::Get().ForType(MemoryType::kCuda), nullptr);
  }
}

TEST(CudaPlatformTest, FirstSonameErrorIsReported) {
  auto p = MakeCudaPlatform({"libmc-no-such-driver.so.1", "libmc-no-such-driver.so"});
  EXPECT_EQ(p->Probe().reason, "libmc-no-such-driver.so.1: cannot open shared object file: No such file or directory");
}

// --- the fake driver ------------------------------------------------------------------------------------------

TEST(CudaPlatformTest, ProbesTheFakeDriver) {
  auto p = MakeCudaPlatform({"libmc-no-such-driver.so.1", FakeDriver()});
  PlatformProbe probe = p->Probe();
  ASSERT_TRUE(probe.usable) << probe.reason;
  EXPECT_EQ(probe.device_count, 2);
  EXPECT_EQ(probe.reason, "CUDA driver 12.9 (" + FakeDriver() + "), 2 device(s)");
}

TEST(CudaPlatformTest, FallsBackToCuGetProcAddressV1) {
  auto p = MakeCudaPlatform({FakeDriverV1()});
  PlatformProbe probe = p->Probe();
  ASSERT_TRUE(probe.usable) << probe.reason;
  auto a = p->Allocate(64, AllocationKind::kDevice, 1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(p->Classify(*a)->ToString(), "cuda:1");
  EXPECT_TRUE(p->Free(*a, 64, AllocationKind::kDevice).ok());
}

TEST(CudaPlatformTest, UnusableVerdictsNameTheCause) {
  {
    FakeEnv env({{"FAKE_CUDA_INIT_RESULT", "100"}});
    EXPECT_EQ(MakeCudaPlatform({FakeDriver()})->Probe().reason,
              "cuInit failed: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected");
  }
  {
    FakeEnv env({{"FAKE_CUDA_DEVICES", "0"}});
    EXPECT_EQ(MakeCudaPlatform({FakeDriver()})->Probe().reason,
              "no CUDA device (CUDA driver 12.9 (" + FakeDriver() + "))");
  }
  {
    FakeEnv env({{"FAKE_CUDA_MISSING", "cuMemCreate"}});
    PlatformProbe probe = MakeCudaPlatform({FakeDriver()})->Probe();
    EXPECT_FALSE(probe.usable);
    EXPECT_EQ(probe.reason, FakeDriver() + " lacks an entry point the platform needs: cuMemCreate (ABI 10020): "
                                           "the driver has no such symbol");
  }
}

TEST(CudaPlatformTest, AllocateClassifyFree) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  auto dev = p->Allocate(1000, AllocationKind::kDevice, 1);
  auto host = p->Allocate(1000, AllocationKind::kPinnedHost, -1);
  auto vmm = p->Allocate(1000, AllocationKind::kShareable, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  ASSERT_TRUE(vmm.ok()) << vmm.status().ToString();
  EXPECT_EQ(p->Classify(static_cast<char*>(*dev) + 999)->ToString(), "cuda:1");
  EXPECT_EQ(p->Classify(*host)->ToString(), "host");
  EXPECT_EQ(p->Classify(static_cast<char*>(*vmm) + 500)->ToString(), "cuda:0");
  int on_stack = 0;
  EXPECT_FALSE(p->Classify(&on_stack).has_value());
  EXPECT_FALSE(p->Classify(nullptr).has_value());

  EXPECT_EQ(p->Allocate(0, AllocationKind::kDevice, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->Allocate(8, AllocationKind::kDevice, 2).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->Allocate(8, AllocationKind::kShareable, -1).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->Free(*dev, 999, AllocationKind::kDevice).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->Free(*dev, 1000, AllocationKind::kPinnedHost).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->Free(&on_stack, 4, AllocationKind::kDevice).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(p->Free(*dev, 1000, AllocationKind::kDevice).ok());
  EXPECT_TRUE(p->Free(*host, 1000, AllocationKind::kPinnedHost).ok());
  EXPECT_TRUE(p->Free(*vmm, 1000, AllocationKind::kShareable).ok());
  EXPECT_EQ(p->Free(*vmm, 1000, AllocationKind::kShareable).code(), ErrorCode::kInvalidArgument);
}

TEST(CudaPlatformTest, CopyAsyncCompletesThroughAnEvent) {
  FakeEnv env({{"FAKE_CUDA_EVENT_PENDING", "2"}});
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  auto dev = p->Allocate(4096, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  std::vector<unsigned char> src(4096), back(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 13);
  auto h2d = p->CopyAsync(*dev, src.data(), src.size(), -1);  // the device of the device side
  ASSERT_TRUE(h2d.ok()) << h2d.status().ToString();
  EXPECT_FALSE((*h2d)->Done());  // the fake's event answers NOT_READY twice
  EXPECT_FALSE((*h2d)->Done());
  EXPECT_TRUE((*h2d)->Done());
  EXPECT_TRUE((*h2d)->Wait().ok());
  auto d2h = p->CopyAsync(back.data(), *dev, back.size(), 0);
  ASSERT_TRUE(d2h.ok());
  EXPECT_TRUE((*d2h)->Wait().ok());
  EXPECT_TRUE((*d2h)->Done());
  EXPECT_EQ(back, src);
  EXPECT_EQ(p->CopyAsync(nullptr, src.data(), 1, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->CopyAsync(back.data(), src.data(), 1, 5).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_TRUE(p->Free(*dev, 4096, AllocationKind::kDevice).ok());
}

// The fake driver as an application (torch, say) uses it besides the platform: its own streams.
class FakeApp {
 public:
  FakeApp() {
    lib_ = dlopen(FakeDriver().c_str(), RTLD_NOW | RTLD_LOCAL);  // the platform's copy: one driver state
    auto proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib_, "cuGetProcAddress_v2"));
    ops_ = reinterpret_cast<StreamOps>(dlsym(lib_, "fake_cuda_stream_ops"));
    retains_ = reinterpret_cast<Retains>(dlsym(lib_, "fake_cuda_primary_retains"));
    stream_flags_ = reinterpret_cast<StreamFlags>(dlsym(lib_, "fake_cuda_stream_flags"));
    live_streams_ = reinterpret_cast<Count>(dlsym(lib_, "fake_cuda_live_streams"));
    event_flags_ = reinterpret_cast<EventFlags>(dlsym(lib_, "fake_cuda_last_event_flags"));
    auto get = [&](const char* name, int version) {
      void* fn = nullptr;
      CUdriverProcAddressQueryResult found;
      EXPECT_EQ(proc(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found), CUDA_SUCCESS) << name;
      return fn;
    };
    device_get_ = reinterpret_cast<PFN_cuDeviceGet_v2000>(get("cuDeviceGet", 2000));
    retain_ = reinterpret_cast<PFN_cuDevicePrimaryCtxRetain_v7000>(get("cuDevicePrimaryCtxRetain", 7000));
    set_current_ = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(get("cuCtxSetCurrent", 4000));
    get_current_ = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get("cuCtxGetCurrent", 4000));
    stream_create_ = reinterpret_cast<PFN_cuStreamCreate_v2000>(get("cuStreamCreate", 2000));
  }

  // A new stream in `device`'s primary context (left current on this thread).
  CUstream StreamOn(int device) {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUstream s = nullptr;
    EXPECT_EQ(device_get_(&dev, device), CUDA_SUCCESS);
    EXPECT_EQ(retain_(&ctx, dev), CUDA_SUCCESS);
    EXPECT_EQ(set_current_(ctx), CUDA_SUCCESS);
    EXPECT_EQ(stream_create_(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    return s;
  }

  // The calling thread's current context (null: none).
  CUcontext Current() {
    CUcontext ctx = reinterpret_cast<CUcontext>(-1);
    EXPECT_EQ(get_current_(&ctx), CUDA_SUCCESS);
    return ctx;
  }

  // Makes `device`'s primary context current on this thread; -1: none.
  void MakeCurrent(int device) {
    CUcontext ctx = nullptr;
    if (device >= 0) {
      CUdevice dev = 0;
      EXPECT_EQ(device_get_(&dev, device), CUDA_SUCCESS);
      EXPECT_EQ(retain_(&ctx, dev), CUDA_SUCCESS);
    }
    EXPECT_EQ(set_current_(ctx), CUDA_SUCCESS);
  }

  // How many times `device`'s primary context was retained, by anyone, so far.
  int PrimaryRetains(int device) { return retains_(device); }

  // The flags `s` was created with; -1 when it is no live stream of cuStreamCreate's.
  long long Flags(CUstream s) {
    unsigned flags = 0;
    return stream_flags_(s, &flags) == CUDA_SUCCESS ? static_cast<long long>(flags) : -1;
  }
  int LiveStreams() { return live_streams_(); }
  unsigned LastEventFlags() { return event_flags_(); }

  // {copies, event records} the fake saw on `s`.
  std::pair<int, int> Ops(CUstream s) {
    int copies = -1, events = -1;
    EXPECT_EQ(ops_(s, &copies, &events), CUDA_SUCCESS);
    return {copies, events};
  }

 private:
  using StreamOps = CUresult (*)(CUstream, int*, int*);
  using Retains = int (*)(int);
  using StreamFlags = CUresult (*)(CUstream, unsigned*);
  using Count = int (*)();
  using EventFlags = unsigned (*)();
  StreamFlags stream_flags_ = nullptr;
  Count live_streams_ = nullptr;
  EventFlags event_flags_ = nullptr;
  void* lib_ = nullptr;
  StreamOps ops_ = nullptr;
  Retains retains_ = nullptr;
  PFN_cuDeviceGet_v2000 device_get_ = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain_ = nullptr;
  PFN_cuCtxSetCurrent_v4000 set_current_ = nullptr;
  PFN_cuCtxGetCurrent_v4000 get_current_ = nullptr;
  PFN_cuStreamCreate_v2000 stream_create_ = nullptr;
};

TEST(CudaPlatformTest, CopyAsyncIsEnqueuedOnTheCallersStream) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  FakeApp app;
  auto dev = p->Allocate(4096, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  CUstream s1 = app.StreamOn(1), s0 = app.StreamOn(0);
  std::vector<unsigned char> src(4096, 0x3c), back(4096, 0);

  auto h2d = p->CopyAsync(*dev, src.data(), src.size(), 1, s1);
  ASSERT_TRUE(h2d.ok()) << h2d.status().ToString();
  EXPECT_EQ(app.Ops(s1), std::make_pair(1, 1));  // the copy and the completion's event, both on s1
  EXPECT_TRUE((*h2d)->Wait().ok());
  auto own = p->CopyAsync(back.data(), *dev, back.size(), 1);  // no stream: the platform's, not s1
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_TRUE((*own)->Wait().ok());
  EXPECT_EQ(app.Ops(s1), std::make_pair(1, 1));
  EXPECT_EQ(back, src);

  // -1 finds the device of the device side (1) and enters its context before using s1.
  ASSERT_TRUE(p->CopyAsync(back.data(), *dev, 16, -1, s1).ok());
  EXPECT_EQ(app.Ops(s1), std::make_pair(2, 2));
  // The legacy default stream (torch's default stream, whose handle is 0) is named CU_STREAM_LEGACY.
  const auto legacy_before = app.Ops(CU_STREAM_LEGACY);
  auto on_legacy = p->CopyAsync(back.data(), *dev, 16, 1, CU_STREAM_LEGACY);
  ASSERT_TRUE(on_legacy.ok()) << on_legacy.status().ToString();
  EXPECT_EQ(app.Ops(CU_STREAM_LEGACY), std::make_pair(legacy_before.first + 1, legacy_before.second + 1));

  // A stream of another device's context, and a handle that is no stream: the driver's error, nothing copied.
  auto wrong_context = p->CopyAsync(back.data(), *dev, 16, 1, s0);
  EXPECT_EQ(wrong_context.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(wrong_context.status().message().find("CUDA_ERROR_INVALID_CONTEXT"), std::string::npos)
      << wrong_context.status().ToString();
  EXPECT_EQ(app.Ops(s0), std::make_pair(0, 0));
  uintptr_t not_a_stream[4] = {};
  auto bogus = p->CopyAsync(back.data(), *dev, 16, 1, reinterpret_cast<CUstream>(not_a_stream));
  EXPECT_NE(bogus.status().message().find("CUDA_ERROR_INVALID_HANDLE"), std::string::npos)
      << bogus.status().ToString();
  EXPECT_TRUE(p->Free(*dev, 4096, AllocationKind::kDevice).ok());
}

TEST(CudaPlatformTest, CopyCompletionsSleepInsteadOfSpinning) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  FakeApp app;
  std::vector<unsigned char> a(64, 1), b(64, 0);
  auto copy = p->CopyAsync(b.data(), a.data(), a.size(), 0);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  // cuEventSynchronize blocks the waiting thread only with CU_EVENT_BLOCKING_SYNC (else it spins a core).
  EXPECT_EQ(app.LastEventFlags(), static_cast<unsigned>(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING));
  EXPECT_TRUE((*copy)->Wait().ok());
  EXPECT_EQ(a, b);
}

TEST(CudaPlatformTest, CreateStreamMakesNonBlockingStreamsThatCopiesRunOn) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  FakeApp app;
  app.MakeCurrent(-1);
  const int live = app.LiveStreams();
  auto dev = p->Allocate(4096, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto s1 = p->CreateStream(1), s2 = p->CreateStream(1);
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  EXPECT_NE(*s1, *s2);
  EXPECT_EQ(app.Current(), nullptr);  // the caller's (no) context is left as it was
  EXPECT_EQ(app.LiveStreams(), live + 2);
  EXPECT_EQ(app.Flags(static_cast<CUstream>(*s1)), CU_STREAM_NON_BLOCKING);

  std::vector<unsigned char> src(4096, 0x5a), back(4096, 0);
  auto h2d = p->CopyAsync(*dev, src.data(), src.size(), 1, *s1);
  ASSERT_TRUE(h2d.ok()) << h2d.status().ToString();
  auto d2h = p->CopyAsync(back.data(), *dev, back.size(), 1, *s2);
  ASSERT_TRUE(d2h.ok()) << d2h.status().ToString();
  EXPECT_EQ(app.Ops(static_cast<CUstream>(*s1)), std::make_pair(1, 1));
  EXPECT_EQ(app.Ops(static_cast<CUstream>(*s2)), std::make_pair(1, 1));
  EXPECT_TRUE((*h2d)->Wait().ok());
  EXPECT_TRUE((*d2h)->Wait().ok());
  EXPECT_EQ(back, src);

  EXPECT_TRUE(p->DestroyStream(*s1).ok());
  EXPECT_EQ(app.LiveStreams(), live + 1);
  EXPECT_EQ(app.Flags(static_cast<CUstream>(*s1)), -1);
  // Twice, a handle the platform did not make, a default stream: refused, nothing released.
  EXPECT_EQ(p->DestroyStream(*s1).code(), ErrorCode::kInvalidArgument);
  uintptr_t not_a_stream[4] = {};
  EXPECT_EQ(p->DestroyStream(not_a_stream).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->DestroyStream(CU_STREAM_LEGACY).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(app.LiveStreams(), live + 1);
  EXPECT_TRUE(p->DestroyStream(*s2).ok());
  EXPECT_EQ(app.LiveStreams(), live);
  EXPECT_EQ(app.Current(), nullptr);

  EXPECT_EQ(p->CreateStream(2).status().code(), ErrorCode::kDeviceNotFound);  // the fake has 2 devices
  EXPECT_EQ(p->CreateStream(-1).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(app.LiveStreams(), live);
  EXPECT_TRUE(p->Free(*dev, 4096, AllocationKind::kDevice).ok());
}

TEST(CudaPlatformTest, StreamsNeedAUsableDriver) {
  auto p = MakeCudaPlatform({"libmc-no-such-cuda.so"});
  EXPECT_EQ(p->CreateStream(0).status().code(), ErrorCode::kDeviceNotFound);
  int not_a_stream = 0;
  EXPECT_EQ(p->DestroyStream(&not_a_stream).code(), ErrorCode::kDeviceNotFound);
}

TEST(CudaPlatformTest, CallsLeaveTheCallersContextAsTheyFoundIt) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  FakeApp app;
  std::thread([&] {
    std::vector<unsigned char> src(4096, 0x5a), back(4096, 0);
    // No context current: none is left current.
    ASSERT_EQ(app.Current(), nullptr);
    auto dev = p->Allocate(4096, AllocationKind::kDevice, 1);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    EXPECT_EQ(app.Current(), nullptr);
    auto h2d = p->CopyAsync(*dev, src.data(), src.size(), -1);
    ASSERT_TRUE(h2d.ok()) << h2d.status().ToString();
    EXPECT_EQ(app.Current(), nullptr);
    EXPECT_TRUE((*h2d)->Wait().ok());
    EXPECT_EQ(app.Current(), nullptr);

    // The caller's own context (device 0's) stays current across calls that work on device 1.
    app.MakeCurrent(0);
    const CUcontext mine = app.Current();
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(p->Classify(*dev)->ToString(), "cuda:1");
    EXPECT_EQ(app.Current(), mine);
    auto vmm = p->Allocate(1000, AllocationKind::kShareable, 1);
    ASSERT_TRUE(vmm.ok()) << vmm.status().ToString();
    EXPECT_EQ(app.Current(), mine);
    auto host = p->Allocate(1000, AllocationKind::kPinnedHost, 1);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    EXPECT_EQ(app.Current(), mine);
    auto d2h = p->CopyAsync(back.data(), *dev, back.size(), 1);
    ASSERT_TRUE(d2h.ok()) << d2h.status().ToString();
    EXPECT_EQ(app.Current(), mine);
    EXPECT_TRUE((*d2h)->Done());
    EXPECT_EQ(app.Current(), mine);
    d2h->reset();
    EXPECT_EQ(app.Current(), mine);
    EXPECT_EQ(back, src);
    EXPECT_TRUE(p->ExportIpc(*dev, 4096).ok());
    EXPECT_TRUE(p->ExportIpc(*vmm, 1000).ok());
    EXPECT_EQ(app.Current(), mine);
    EXPECT_TRUE(p->Free(*dev, 4096, AllocationKind::kDevice).ok());
    EXPECT_TRUE(p->Free(*vmm, 1000, AllocationKind::kShareable).ok());
    EXPECT_TRUE(p->Free(*host, 1000, AllocationKind::kPinnedHost).ok());
    EXPECT_EQ(app.Current(), mine);
    app.MakeCurrent(-1);
  }).join();
}

TEST(CudaPlatformTest, ClassifyOnAThreadWithoutAContextCreatesNone) {
  auto owner = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(owner->Probe().usable);
  auto dev = owner->Allocate(4096, AllocationKind::kDevice, 1);
  auto host = owner->Allocate(4096, AllocationKind::kPinnedHost, 0);
  ASSERT_TRUE(dev.ok() && host.ok());
  FakeApp app;
  auto classify_on_a_bare_thread = [&](const std::shared_ptr<Platform>& p, const char* want_dev,
                                       const char* want_host) {
    std::thread([&] {
      ASSERT_EQ(app.Current(), nullptr);
      const int before0 = app.PrimaryRetains(0), before1 = app.PrimaryRetains(1);
      std::optional<MemoryKind> d = p->Classify(*dev), h = p->Classify(*host);
      EXPECT_EQ(d ? d->ToString() : "nullopt", want_dev);
      EXPECT_EQ(h ? h->ToString() : "nullopt", want_host);
      int on_stack = 0;
      EXPECT_FALSE(p->Classify(&on_stack).has_value());
      EXPECT_EQ(app.Current(), nullptr);
      EXPECT_EQ(app.PrimaryRetains(0), before0);
      EXPECT_EQ(app.PrimaryRetains(1), before1);
    }).join();
  };
  auto fresh = MakeCudaPlatform({FakeDriver()});  // has retained no context yet
  ASSERT_TRUE(fresh->Probe().usable);
  classify_on_a_bare_thread(fresh, "cuda:1", "host");
  {
    // A driver that wants a context for pointer attributes: nullopt, still none created.
    FakeEnv env({{"FAKE_CUDA_POINTER_NEEDS_CONTEXT", "1"}});
    auto strict = MakeCudaPlatform({FakeDriver()});
    ASSERT_TRUE(strict->Probe().usable);
    classify_on_a_bare_thread(strict, "nullopt", "nullopt");
  }
  ASSERT_TRUE(MakeCudaPlatform({FakeDriver()})->Probe().usable);  // cuInit again: the knob's default
  EXPECT_TRUE(owner->Free(*dev, 4096, AllocationKind::kDevice).ok());
  EXPECT_TRUE(owner->Free(*host, 4096, AllocationKind::kPinnedHost).ok());
}

class CudaIpcTest : public ::testing::TestWithParam<AllocationKind> {};

TEST_P(CudaIpcTest, ExportHereImportInAChildProcess) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  const size_t size = 3 * 4096 + 11;
  auto dev = p->Allocate(size, GetParam(), 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto* base = static_cast<unsigned char*>(*dev);
  memset(base, 0xee, size);  // the fake's device memory is host-visible
  const size_t offset = 4096 + 3, length = 5000;
  auto handle = p->ExportIpc(base + offset, length);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  EXPECT_EQ(handle->rfind(GetParam() == AllocationKind::kShareable ? "mc-cuda-ipc:v1:fd:" : "mc-cuda-ipc:v1:legacy:",
                          0),
            0u)
      << *handle;

  ChildResult r = RunChild(*handle, getpid(), length, 29);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "cuda:1\n");
  for (size_t i = 0; i < length; ++i) ASSERT_EQ(base[offset + i], static_cast<unsigned char>(29 + i * 7)) << i;
  EXPECT_EQ(base[offset - 1], 0xee);
  EXPECT_EQ(base[offset + length], 0xee);

  // The handle's own process cannot import it; bad handles and lengths are refused with reasons.
  auto self = p->ImportIpc(*handle, getpid(), length);
  EXPECT_EQ(self.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(self.status().message().find("exported by this process"), std::string::npos) << self.status().ToString();
  ChildResult too_long = RunChild(*handle, getpid(), length + 1, 1);
  EXPECT_EQ(too_long.exit_code, 3) << too_long.out;
  EXPECT_NE(too_long.out.find("cannot import 5001 bytes"), std::string::npos) << too_long.out;
  ChildResult wrong_pid = RunChild(*handle, 1, length, 1);
  EXPECT_EQ(wrong_pid.exit_code, 3) << wrong_pid.out;
  ChildResult garbage = RunChild("mc-cuda-ipc:v1:fd:1:2", getpid(), length, 1);
  EXPECT_EQ(garbage.exit_code, 3) << garbage.out;
  EXPECT_NE(garbage.out.find("not a cuda IPC handle"), std::string::npos) << garbage.out;

  // A legacy handle whose range the real allocation does not hold is refused after mapping.
  if (GetParam() == AllocationKind::kDevice) {
    const std::string past = WithHandleField(*handle, 5, std::to_string(size - 100));  // offset
    ChildResult outside = RunChild(past, getpid(), length, 1);
    EXPECT_EQ(outside.exit_code, 3) << outside.out;
    EXPECT_NE(outside.out.find("runs past its allocation of " + std::to_string(size) + " bytes"), std::string::npos)
        << outside.out;
  }

  EXPECT_EQ(p->ExportIpc(base, size + 1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->ExportIpc(base, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(p->Free(*dev, size, GetParam()).ok());
}

INSTANTIATE_TEST_SUITE_P(Kinds, CudaIpcTest, ::testing::Values(AllocationKind::kDevice, AllocationKind::kShareable),
                         [](const auto& info) { return info.param == AllocationKind::kDevice ? "Legacy" : "PosixFd"; });

TEST(CudaPlatformTest, AReusedFdNumberNamesTheNewAllocation) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  const size_t size = 4096;
  auto first = p->Allocate(size, AllocationKind::kShareable, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  memset(*first, 0x11, size);
  auto h1 = p->ExportIpc(*first, size);
  ASSERT_TRUE(h1.ok()) << h1.status().ToString();
  Importer child;
  EXPECT_EQ(child.Import(*h1, getpid(), size), "ok 11");  // kept mapped in the child

  ASSERT_TRUE(p->Free(*first, size, AllocationKind::kShareable).ok());
  auto second = p->Allocate(size, AllocationKind::kShareable, 0);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  memset(*second, 0x22, size);
  auto h2 = p->ExportIpc(*second, size);
  ASSERT_TRUE(h2.ok()) << h2.status().ToString();
  ASSERT_EQ(HandleField(*h1, 7), HandleField(*h2, 7)) << "the exported fd number is not reused: " << *h1 << " / "
                                                      << *h2;
  EXPECT_NE(HandleField(*h1, 9), HandleField(*h2, 9)) << *h1 << " / " << *h2;
  EXPECT_EQ(child.Import(*h2, getpid(), size), "ok 22");
  EXPECT_TRUE(p->Free(*second, size, AllocationKind::kShareable).ok());
}

TEST(CudaPlatformTest, ExportRefusesHostMemory) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  auto host = p->Allocate(4096, AllocationKind::kPinnedHost, 0);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(p->ExportIpc(*host, 4096).status().code(), ErrorCode::kNotImplemented);
  int on_stack = 0;
  auto plain = p->ExportIpc(&on_stack, sizeof(on_stack));
  EXPECT_EQ(plain.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(plain.status().message().find("not CUDA device memory"), std::string::npos);
  EXPECT_TRUE(p->Free(*host, 4096, AllocationKind::kPinnedHost).ok());
}

// The fake driver's devices report CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 0 (as a GPU without an
// NVSwitch fabric does): fabric memory is refused with the reason, and nothing else is taken for a fabric handle.
TEST(CudaPlatformTest, FabricHandlesAreRefusedWhereTheDeviceHasNone) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  auto fabric = p->Allocate(4096, AllocationKind::kFabric, 0);
  EXPECT_EQ(fabric.status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(fabric.status().message().rfind("fabric handles unsupported: ", 0), 0u) << fabric.status().message();
  EXPECT_NE(fabric.status().message().find("HANDLE_TYPE_FABRIC_SUPPORTED = 0"), std::string::npos);
  auto vmm = p->Allocate(4096, AllocationKind::kShareable, 0);
  ASSERT_TRUE(vmm.ok());
  EXPECT_EQ(p->ExportFabric(*vmm, 4096).status().code(), ErrorCode::kInvalidArgument) << "not fabric memory";
  auto ipc = p->ExportIpc(*vmm, 4096);
  ASSERT_TRUE(ipc.ok());
  EXPECT_EQ(p->ImportFabric(*ipc, 4096).status().code(), ErrorCode::kInvalidArgument) << "an IPC handle";
  EXPECT_EQ(p->ImportFabric("mc-cuda-ipc:v1:fabric:1:0:0:1:2", 1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(p->Free(*vmm, 4096, AllocationKind::kShareable).ok());
}

}  // namespace
}  // namespace mooncake::te
