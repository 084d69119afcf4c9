// GpuPlatform on a fake Runtime: host memory stands in for device memory (memfd mappings, so IPC handles work
// between two processes: this binary re-executes itself as the importing child).
#include "transfer_engine/platform/gpu/gpu_platform.h"
#include "transfer_engine/platform/testing/run_self.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace mooncake::te::gpu {
namespace {

struct FakeOptions {
  int devices = 2;
  bool knows_pointers = true;  // false: PointerKind always nullopt (as ACL without aclrtPointerGetAttributes)
  bool ipc = true;
  int pending_queries = 0;     // QueryEvent answers "not yet" this many times per event
  std::string load_error;      // non-empty: Load fails with it
};

class FakeRuntime final : public Runtime {
 public:
  explicit FakeRuntime(FakeOptions o) : o_(std::move(o)) {}

  StatusOr<RuntimeInfo> Load() override {
    if (!o_.load_error.empty()) return Status(ErrorCode::kDeviceNotFound, o_.load_error);
    return RuntimeInfo{o_.devices, "fake runtime"};
  }
  Status SetDevice(int device) override {
    if (device < 0 || device >= o_.devices) return Status(ErrorCode::kDeviceNotFound, "fake: bad device");
    current_ = device;
    return Status::Ok();
  }
  std::optional<MemoryKind> PointerKind(const void* ptr) override {
    if (!o_.knows_pointers) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    const Region* r = Find(reinterpret_cast<uintptr_t>(ptr), nullptr);
    if (r == nullptr) return std::nullopt;
    return r->device < 0 ? MemoryKind{MemoryType::kHost, -1} : MemoryKind{MemoryType::kRocm, r->device};
  }
  StatusOr<void*> Malloc(size_t length) override {
    if (current_ < 0) return Status(ErrorCode::kContext, "fake: no current device");
    int fd = memfd_create("fake-gpu", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(length)) != 0) return Status(ErrorCode::kMemory, "fake: memfd");
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    std::lock_guard<std::mutex> lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(p)] = Region{length, current_, fd};
    return p;
  }
  Status Free(void* ptr) override { return Unmap(ptr, true); }
  StatusOr<void*> HostMalloc(size_t length) override {
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::lock_guard<std::mutex> lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(p)] = Region{length, -1, -1};
    return p;
  }
  Status HostFree(void* ptr) override { return Unmap(ptr, false); }
  bool has_ipc() const override { return o_.ipc; }
  StatusOr<std::pair<void*, size_t>> AddressRange(const void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    uintptr_t base = 0;
    const Region* r = Find(reinterpret_cast<uintptr_t>(ptr), &base);
    if (r == nullptr || r->device < 0) return Status(ErrorCode::kInvalidArgument, "fake: not device memory");
    return std::make_pair(reinterpret_cast<void*>(base), r->size);
  }
  StatusOr<std::string> IpcGetHandle(void* base) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
    if (it == regions_.end() || it->second.fd < 0) return Status(ErrorCode::kInvalidArgument, "fake: no fd");
    return std::to_string(getpid()) + "/" + std::to_string(it->second.fd) + "/" + std::to_string(it->second.size);
  }
  StatusOr<void*> IpcOpen(const std::string& handle) override {
    int pid = 0, fd = 0;
    size_t size = 0;
    if (sscanf(handle.c_str(), "%d/%d/%zu", &pid, &fd, &size) != 3) {
      return Status(ErrorCode::kInvalidArgument, "fake: bad handle");
    }
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    int local = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (local < 0) return Status(ErrorCode::kInvalidArgument, "fake: cannot open " + path);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
    close(local);
    ++opens_;
    std::lock_guard<std::mutex> lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(p)] = Region{size, current_, -1, true};
    return p;
  }
  Status IpcClose(void* base) override {
    ++closes_;
    return Unmap(base, true);
  }
  // Device d's n-th stream is 0x100 + d + 0x1000 * n (the first one made is the platform's own).
  StatusOr<void*> CreateStream() override {
    void* s = reinterpret_cast<void*>(static_cast<uintptr_t>(0x100 + current_ + 0x1000 * made_[current_]++));
    live_streams_.insert(s);
    return s;
  }
  Status DestroyStream(void* s) override {
    if (live_streams_.erase(s) == 0) return Status(ErrorCode::kInvalidArgument, "fake: no such stream");
    destroyed_on_device_ = current_;
    return Status::Ok();
  }
  Status MemcpyAsync(void* dst, const void* src, size_t length, bool dst_device, bool src_device,
                     void* stream) override {
    last_direction_ = std::string(src_device ? "D" : "H") + "2" + (dst_device ? "D" : "H");
    last_copy_stream_ = stream;
    memmove(dst, src, length);
    return Status::Ok();
  }
  StatusOr<void*> RecordEvent(void* stream) override {
    last_event_stream_ = stream;
    return static_cast<void*>(new int(o_.pending_queries));
  }
  StatusOr<bool> QueryEvent(void* e) override {
    int* left = static_cast<int*>(e);
    if (*left > 0) {
      --*left;
      return false;
    }
    return true;
  }
  Status SynchronizeEvent(void* e) override {
    *static_cast<int*>(e) = 0;
    return Status::Ok();
  }
  void DestroyEvent(void* e) override {
    delete static_cast<int*>(e);
    ++destroyed_events_;
  }

  std::string last_direction_;
  void* last_copy_stream_ = nullptr;
  void* last_event_stream_ = nullptr;
  int opens_ = 0, closes_ = 0, destroyed_events_ = 0;
  std::set<void*> live_streams_;
  std::map<int, int> made_;  // streams made per device
  int destroyed_on_device_ = -1;

 private:
  struct Region {
    size_t size;
    int device;  // -1: host
    int fd;
    bool imported = false;
  };
  const Region* Find(uintptr_t p, uintptr_t* base) const {
    auto it = regions_.upper_bound(p);
    if (it == regions_.begin()) return nullptr;
    --it;
    if (p - it->first >= it->second.size) return nullptr;
    if (base != nullptr) *base = it->first;
    return &it->second;
  }
  Status Unmap(void* p, bool device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(p));
    if (it == regions_.end() || (it->second.device >= 0) != device) {
      return Status(ErrorCode::kInvalidArgument, "fake: bad free");
    }
    munmap(p, it->second.size);
    if (it->second.fd >= 0) close(it->second.fd);
    regions_.erase(it);
    return Status::Ok();
  }

  FakeOptions o_;
  std::mutex mu_;
  std::map<uintptr_t, Region> regions_;
  static thread_local int current_;
};
thread_local int FakeRuntime::current_ = -1;

struct Made {
  std::shared_ptr<GpuPlatform> platform;
  FakeRuntime* runtime;
};

Made Make(FakeOptions o = {}) {
  auto rt = std::make_unique<FakeRuntime>(std::move(o));
  FakeRuntime* raw = rt.get();
  return {std::make_shared<GpuPlatform>("fakegpu", MemoryType::kRocm, std::move(rt)), raw};
}

// --- the child process ----------------------------------------------------------------------------------------

int ChildMain() {
  const std::string handle = getenv("MC_TEST_HANDLE");
  const int pid = atoi(getenv("MC_TEST_PID"));
  const size_t length = strtoull(getenv("MC_TEST_LENGTH"), nullptr, 10);
  Made m = Make();
  auto mapped = m.platform->ImportIpc(handle, pid, length);
  if (!mapped.ok()) {
    fprintf(stderr, "%s\n", mapped.status().ToString().c_str());
    return 3;
  }
  auto again = m.platform->ImportIpc(handle, pid, length);
  if (!again.ok() || *again != *mapped || m.runtime->opens_ != 1) return 4;  // one mapping, counted twice
  std::vector<unsigned char> src(length);
  for (size_t i = 0; i < length; ++i) src[i] = static_cast<unsigned char>(i * 5 + 3);
  auto copy = m.platform->CopyAsync(*mapped, src.data(), length, -1);
  if (!copy.ok() || !(*copy)->Wait().ok() || m.runtime->last_direction_ != "H2D") return 5;
  std::optional<MemoryKind> kind = m.platform->Classify(*mapped);
  if (!m.platform->CloseIpc(*mapped, length).ok() || m.runtime->closes_ != 0) return 6;
  if (!m.platform->CloseIpc(*mapped, length).ok() || m.runtime->closes_ != 1) return 6;
  printf("%s\n", kind ? kind->ToString().c_str() : "unclassified");
  return 0;
}

const bool kIsChild = [] {
  if (getenv("MC_TEST_HANDLE") == nullptr) return false;
  const int rc = ChildMain();
  fflush(stdout);
  _exit(rc);
}();

std::pair<int, std::string> RunChild(const std::string& handle, int pid, size_t length) {
  testing::ChildResult r = testing::RunSelf({"MC_TEST_HANDLE=" + handle, "MC_TEST_PID=" + std::to_string(pid),
                                             "MC_TEST_LENGTH=" + std::to_string(length)});
  return {r.exit_code, r.out};
}

// --- tests ----------------------------------------------------------------------------------------------------

TEST(GpuPlatformTest, ProbeReportsTheRuntimesVerdict) {
  EXPECT_EQ(Make({.load_error = "libfake.so.*: not found (x)"}).platform->Probe().reason,
            "libfake.so.*: not found (x)");
  PlatformProbe none = Make({.devices = 0}).platform->Probe();
  EXPECT_FALSE(none.usable);
  EXPECT_EQ(none.reason, "no fakegpu device (fake runtime)");
  PlatformProbe ok = Make().platform->Probe();
  EXPECT_TRUE(ok.usable);
  EXPECT_EQ(ok.device_count, 2);
  EXPECT_EQ(ok.reason, "fake runtime, 2 device(s)");
  auto off = Make({.load_error = "gone"}).platform;
  EXPECT_EQ(off->Allocate(1, AllocationKind::kDevice, 0).status().code(), ErrorCode::kDeviceNotFound);
}

TEST(GpuPlatformTest, AllocateClassifyFree) {
  for (bool knows : {true, false}) {
    Made m = Make({.knows_pointers = knows});
    auto& p = *m.platform;
    auto dev = p.Allocate(1000, AllocationKind::kDevice, 1);
    auto host = p.Allocate(1000, AllocationKind::kPinnedHost, -1);
    ASSERT_TRUE(dev.ok() && host.ok());
    EXPECT_EQ(p.Classify(static_cast<char*>(*dev) + 999)->ToString(), "rocm:1") << knows;
    EXPECT_EQ(p.Classify(*host)->ToString(), "host") << knows;
    int x = 0;
    EXPECT_FALSE(p.Classify(&x).has_value());
    EXPECT_EQ(p.Allocate(8, AllocationKind::kShareable, 0).status().code(), ErrorCode::kNotImplemented);
    EXPECT_EQ(p.Allocate(0, AllocationKind::kDevice, 0).status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(p.Allocate(8, AllocationKind::kDevice, 2).status().code(), ErrorCode::kDeviceNotFound);
    EXPECT_EQ(p.Free(*dev, 999, AllocationKind::kDevice).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(p.Free(*dev, 1000, AllocationKind::kPinnedHost).code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(p.Free(*dev, 1000, AllocationKind::kDevice).ok());
    EXPECT_TRUE(p.Free(*host, 1000, AllocationKind::kPinnedHost).ok());
    EXPECT_EQ(p.Free(*host, 1000, AllocationKind::kPinnedHost).code(), ErrorCode::kInvalidArgument);
  }
}

TEST(GpuPlatformTest, CopyAsyncPassesTheDirectionAndCompletesThroughAnEvent) {
  Made m = Make({.pending_queries = 1});
  auto& p = *m.platform;
  auto dev = p.Allocate(64, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  char host[64] = "mooncake", back[64] = {};
  auto h2d = p.CopyAsync(*dev, host, 64, -1);
  ASSERT_TRUE(h2d.ok());
  EXPECT_EQ(m.runtime->last_direction_, "H2D");
  EXPECT_FALSE((*h2d)->Done());
  EXPECT_TRUE((*h2d)->Done());
  auto d2h = p.CopyAsync(back, *dev, 64, -1);
  ASSERT_TRUE(d2h.ok());
  EXPECT_EQ(m.runtime->last_direction_, "D2H");
  EXPECT_TRUE((*d2h)->Wait().ok());
  EXPECT_STREQ(back, "mooncake");
  h2d->reset();
  d2h->reset();
  EXPECT_EQ(m.runtime->destroyed_events_, 2);
  EXPECT_EQ(p.CopyAsync(nullptr, host, 1, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p.CopyAsync(back, host, 1, 9).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_TRUE(p.Free(*dev, 64, AllocationKind::kDevice).ok());
}

TEST(GpuPlatformTest, CopyAsyncRunsOnTheCallersStreamWhenGivenOne) {
  Made m = Make();
  auto& p = *m.platform;
  auto dev = p.Allocate(64, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok());
  char host[64] = "on the caller's stream", back[64] = {};
  void* const own = reinterpret_cast<void*>(static_cast<uintptr_t>(0x101));  // the fake's stream of device 1
  void* const theirs = reinterpret_cast<void*>(static_cast<uintptr_t>(0xabc0));
  auto h2d = p.CopyAsync(*dev, host, 64, -1, theirs);
  ASSERT_TRUE(h2d.ok()) << h2d.status().ToString();
  EXPECT_EQ(m.runtime->last_copy_stream_, theirs);
  EXPECT_EQ(m.runtime->last_event_stream_, theirs);  // the completion follows the caller's stream
  auto d2h = p.CopyAsync(back, *dev, 64, 1);  // no stream: the platform's own for device 1
  ASSERT_TRUE(d2h.ok());
  EXPECT_EQ(m.runtime->last_copy_stream_, own);
  EXPECT_EQ(m.runtime->last_event_stream_, own);
  EXPECT_TRUE((*h2d)->Wait().ok());
  EXPECT_TRUE((*d2h)->Wait().ok());
  EXPECT_STREQ(back, host);
  EXPECT_EQ(p.CopyAsync(back, host, 1, 9, theirs).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_TRUE(p.Free(*dev, 64, AllocationKind::kDevice).ok());
}

TEST(GpuPlatformTest, CreatedStreamsCarryCopiesAndAreDrainedBeforeDestruction) {
  Made m = Make();
  auto& p = *m.platform;
  auto s = p.CreateStream(1);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto t = p.CreateStream(1);
  ASSERT_TRUE(t.ok());
  EXPECT_NE(*s, *t);
  EXPECT_EQ(m.runtime->live_streams_.size(), 2u);
  char host[16] = "own stream", back[16] = {};
  auto copy = p.CopyAsync(back, host, sizeof(host), 1, *s);
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(m.runtime->last_copy_stream_, *s);
  EXPECT_TRUE((*copy)->Wait().ok());
  EXPECT_STREQ(back, host);

  const int events_before = m.runtime->destroyed_events_;
  ASSERT_TRUE(m.runtime->SetDevice(0).ok());
  EXPECT_TRUE(p.DestroyStream(*s).ok());
  EXPECT_EQ(m.runtime->last_event_stream_, *s);  // an event on it was waited for first
  EXPECT_EQ(m.runtime->destroyed_events_, events_before + 1);
  EXPECT_EQ(m.runtime->destroyed_on_device_, 1);  // with its device current
  EXPECT_EQ(m.runtime->live_streams_.size(), 1u);
  EXPECT_EQ(p.DestroyStream(*s).code(), ErrorCode::kInvalidArgument);  // twice
  int not_a_stream = 0;
  EXPECT_EQ(p.DestroyStream(&not_a_stream).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(m.runtime->live_streams_.size(), 1u);
  EXPECT_TRUE(p.DestroyStream(*t).ok());
  EXPECT_EQ(p.CreateStream(2).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p.CreateStream(-1).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_TRUE(m.runtime->live_streams_.empty());

  Made unusable = Make({.load_error = "no runtime"});
  EXPECT_EQ(unusable.platform->CreateStream(0).status().code(), ErrorCode::kDeviceNotFound);
}

TEST(GpuPlatformTest, ExportHereImportInAChildProcess) {
  Made m = Make();
  auto& p = *m.platform;
  const size_t size = 10000, offset = 1234, length = 4000;
  auto dev = p.Allocate(size, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok());
  auto* base = static_cast<unsigned char*>(*dev);
  memset(base, 0xee, size);
  auto handle = p.ExportIpc(base + offset, length);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  EXPECT_EQ(handle->rfind("mc-fakegpu-ipc:v1:" + std::to_string(getpid()) + ":1:1234:4000:", 0), 0u) << *handle;

  auto [rc, out] = RunChild(*handle, getpid(), length);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "rocm:1\n");
  for (size_t i = 0; i < length; ++i) ASSERT_EQ(base[offset + i], static_cast<unsigned char>(i * 5 + 3)) << i;
  EXPECT_EQ(base[offset - 1], 0xee);
  EXPECT_EQ(base[offset + length], 0xee);

  auto [too_long, why] = RunChild(*handle, getpid(), length + 1);
  EXPECT_EQ(too_long, 3);
  EXPECT_NE(why.find("cannot import 4001 bytes"), std::string::npos) << why;

  // A handle whose length (peer-written text) claims more than the allocation holds is refused after opening.
  std::string lying = *handle;
  const std::string field = ":1234:4000:";
  ASSERT_NE(lying.find(field), std::string::npos);
  lying.replace(lying.find(field), field.size(), ":1234:400000:");
  auto [past_end, said] = RunChild(lying, getpid(), 400000);
  EXPECT_EQ(past_end, 3) << said;
  EXPECT_NE(said.find("of an allocation of 10000 bytes"), std::string::npos) << said;
  auto [garbage, bad] = RunChild("mc-fakegpu-ipc:v1:1:2:3", getpid(), 1);
  EXPECT_EQ(garbage, 3);
  EXPECT_NE(bad.find("not a mc-fakegpu-ipc handle"), std::string::npos) << bad;
  EXPECT_EQ(p.ImportIpc(*handle, getpid(), length).status().code(), ErrorCode::kInvalidArgument);  // own handle
  EXPECT_EQ(p.ImportIpc(*handle, 1, length).status().code(), ErrorCode::kInvalidArgument);         // wrong owner
  EXPECT_EQ(p.ExportIpc(base, size + 1).status().code(), ErrorCode::kInvalidArgument);
  int x = 0;
  EXPECT_EQ(p.ExportIpc(&x, 4).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p.CloseIpc(base, size).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(p.Free(*dev, size, AllocationKind::kDevice).ok());

  Made no_ipc = Make({.ipc = false});
  auto d2 = no_ipc.platform->Allocate(64, AllocationKind::kDevice, 0);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(no_ipc.platform->ExportIpc(*d2, 64).status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(no_ipc.platform->ImportIpc(*handle, getpid(), 1).status().code(), ErrorCode::kNotImplemented);
}

}  // namespace
}  // namespace mooncake::te::gpu
