// The cuda platform's dma-buf export and device locality, against the FAKE driver of testing/fake_driver.cc (its
// cuMemGetHandleForAddressRange checks arguments as CUDA documents them and returns a dup of the memfd behind the
// allocation; fake_cuda_last_dmabuf says which range it was asked for).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/platform/cuda/cuda_platform.h"
#include "transfer_engine/platform/testing/runfile.h"

namespace mooncake::te {
namespace {

std::string FakeDriver() { return testing::FakeCudaDriver(); }

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

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

// The fake driver as the platform loaded it (one driver state) and its last-dma-buf hook.
struct FakeDriverLib {
  using LastDmabuf = CUresult (*)(CUdeviceptr*, size_t*, size_t*);
  FakeDriverLib() {
    lib = dlopen(FakeDriver().c_str(), RTLD_NOW | RTLD_LOCAL);
    last = reinterpret_cast<LastDmabuf>(dlsym(lib, "fake_cuda_last_dmabuf"));
    proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
  }
  ~FakeDriverLib() { dlclose(lib); }
  template <typename Fn>
  Fn Get(const char* name, int version) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found;
    proc(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    return reinterpret_cast<Fn>(fn);
  }
  void* lib = nullptr;
  LastDmabuf last = nullptr;
  PFN_cuGetProcAddress_v12000 proc = nullptr;
};

// Reads `n` bytes at `offset` of `fd`.
std::string ReadAt(int fd, size_t offset, size_t n) {
  std::string out(n, '\0');
  ssize_t got = pread(fd, out.data(), n, static_cast<off_t>(offset));
  return got == static_cast<ssize_t>(n) ? out : "<pread failed>";
}

TEST(CudaDmabufTest, WithoutADriverEverythingSaysUnusable) {
  auto p = MakeCudaPlatform({"libmc-no-such-driver.so.1"});
  int x = 0;
  EXPECT_EQ(p->ExportDmabuf(&x, 4).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->Locality(0).status().code(), ErrorCode::kDeviceNotFound);
}

TEST(CudaDmabufTest, ExportsThePagesHoldingTheRangeWithItsOffset) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  FakeDriverLib fake;
  ASSERT_NE(fake.last, nullptr);
  const size_t len = 3 * kPage + 100;
  auto dev = p->Allocate(len, AllocationKind::kDevice, 1);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  char* base = static_cast<char*>(*dev);
  const size_t at = kPage + 904;
  memcpy(base + at, "dmabuf", 6);

  auto d = p->ExportDmabuf(base + at, 6);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->offset, 904u);
  CUdeviceptr asked = 0;
  size_t asked_size = 0, in_memfd = 0;
  ASSERT_EQ(fake.last(&asked, &asked_size, &in_memfd), CUDA_SUCCESS);
  EXPECT_EQ(asked, reinterpret_cast<uintptr_t>(base) + kPage);  // page-aligned, as CUDA wants
  EXPECT_EQ(asked_size, kPage);
  EXPECT_EQ(ReadAt(d->fd, in_memfd + d->offset, 6), "dmabuf");
  EXPECT_EQ(fcntl(d->fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(close(d->fd), 0);  // the caller's fd

  // A range crossing pages: every page it touches, up to the allocation's last page.
  auto wide = p->ExportDmabuf(base + 100, 3 * kPage);
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  EXPECT_EQ(wide->offset, 100u);
  ASSERT_EQ(fake.last(&asked, &asked_size, &in_memfd), CUDA_SUCCESS);
  EXPECT_EQ(asked, reinterpret_cast<uintptr_t>(base));
  EXPECT_EQ(asked_size, 4 * kPage);
  close(wide->fd);

  // Past the allocation, null, empty: refused before the driver is asked.
  EXPECT_EQ(p->ExportDmabuf(base + kPage, len).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->ExportDmabuf(base, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(p->ExportDmabuf(nullptr, 8).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(p->Free(*dev, len, AllocationKind::kDevice).ok());
}

TEST(CudaDmabufTest, ExportsShareableAllocationsAndRefusesHostMemory) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  FakeDriverLib fake;
  auto vmm = p->Allocate(4096, AllocationKind::kShareable, 0);
  ASSERT_TRUE(vmm.ok()) << vmm.status().ToString();
  char* base = static_cast<char*>(*vmm);
  memcpy(base + 2 * kPage, "vmm", 3);
  auto d = p->ExportDmabuf(base + 2 * kPage, 3);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  CUdeviceptr asked = 0;
  size_t asked_size = 0, in_memfd = 0;
  ASSERT_EQ(fake.last(&asked, &asked_size, &in_memfd), CUDA_SUCCESS);
  EXPECT_EQ(ReadAt(d->fd, in_memfd + d->offset, 3), "vmm");
  close(d->fd);
  EXPECT_TRUE(p->Free(*vmm, 4096, AllocationKind::kShareable).ok());

  auto host = p->Allocate(4096, AllocationKind::kPinnedHost, 0);
  ASSERT_TRUE(host.ok());
  auto refused = p->ExportDmabuf(*host, 64);
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("not CUDA device memory"), std::string::npos);
  EXPECT_TRUE(p->Free(*host, 4096, AllocationKind::kPinnedHost).ok());
  int on_stack = 0;
  EXPECT_EQ(p->ExportDmabuf(&on_stack, 4).status().code(), ErrorCode::kInvalidArgument);
}

TEST(CudaDmabufTest, NoDmabufSupportIsNotImplementedWithTheReason) {
  FakeEnv env({{"FAKE_CUDA_NO_DMABUF", "1"}});
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);
  auto dev = p->Allocate(kPage, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  auto d = p->ExportDmabuf(*dev, 16);
  EXPECT_EQ(d.status().code(), ErrorCode::kNotImplemented);
  EXPECT_NE(d.status().message().find("CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0"), std::string::npos)
      << d.status().ToString();
  EXPECT_TRUE(p->Free(*dev, kPage, AllocationKind::kDevice).ok());
}

TEST(CudaDmabufTest, ADriverWithoutTheEntryPointIsStillUsable) {
  FakeEnv env({{"FAKE_CUDA_MISSING", "cuMemGetHandleForAddressRange"}});
  auto p = MakeCudaPlatform({FakeDriver()});
  PlatformProbe probe = p->Probe();
  ASSERT_TRUE(probe.usable) << probe.reason;  // optional: the rest of the platform works
  auto dev = p->Allocate(kPage, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  auto d = p->ExportDmabuf(*dev, 16);
  EXPECT_EQ(d.status().code(), ErrorCode::kNotImplemented);
  EXPECT_NE(d.status().message().find("has no cuMemGetHandleForAddressRange"), std::string::npos)
      << d.status().ToString();
  EXPECT_TRUE(p->Free(*dev, kPage, AllocationKind::kDevice).ok());
}

TEST(CudaDmabufTest, TheFakeDriverChecksArgumentsAsCudaDocumentsThem) {
  auto p = MakeCudaPlatform({FakeDriver()});
  ASSERT_TRUE(p->Probe().usable);  // cuInit done
  auto dev = p->Allocate(2 * kPage, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok());
  FakeDriverLib fake;
  auto get = fake.Get<PFN_cuMemGetHandleForAddressRange_v11070>("cuMemGetHandleForAddressRange", 11070);
  auto set_ctx = fake.Get<PFN_cuCtxSetCurrent_v4000>("cuCtxSetCurrent", 4000);
  ASSERT_NE(get, nullptr);
  ASSERT_NE(set_ctx, nullptr);
  const CUdeviceptr base = reinterpret_cast<uintptr_t>(*dev);
  int fd = -1;
  EXPECT_EQ(get(&fd, base, kPage, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(set_ctx(reinterpret_cast<CUcontext>(1)), CUDA_SUCCESS);  // device 0's context
  EXPECT_EQ(get(&fd, base + 64, kPage, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get(&fd, base, kPage + 1, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get(&fd, base, 3 * kPage, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get(&fd, base, kPage, static_cast<CUmemRangeHandleType>(2), 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get(&fd, base, kPage, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 4), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fd, -1);
  ASSERT_EQ(get(&fd, base + kPage, kPage, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), CUDA_SUCCESS);
  EXPECT_GE(fd, 0);
  close(fd);
  set_ctx(nullptr);
  EXPECT_TRUE(p->Free(*dev, 2 * kPage, AllocationKind::kDevice).ok());
}

TEST(CudaDmabufTest, LocalityIsThePciAddressAndItsSysfsNumaNode) {
  char tmpl[] = "/tmp/mc_cuda_sysfs_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  // The fake's device 1 sits at 0000:3c:00.0 (bus 0x3b + ordinal); device 0 has no sysfs entry here.
  const std::string dir = root + "/bus/pci/devices/0000:3c:00.0";
  ASSERT_EQ(system(("mkdir -p '" + dir + "'").c_str()), 0);
  std::ofstream(dir + "/numa_node") << "1\n";

  auto p = MakeCudaPlatform({FakeDriver()}, root);
  ASSERT_TRUE(p->Probe().usable);
  auto d1 = p->Locality(1);
  ASSERT_TRUE(d1.ok()) << d1.status().ToString();
  EXPECT_EQ(d1->pci_bus_id, "0000:3c:00.0");
  EXPECT_EQ(d1->numa_node, 1);
  auto d0 = p->Locality(0);
  ASSERT_TRUE(d0.ok());
  EXPECT_EQ(d0->pci_bus_id, "0000:3b:00.0");
  EXPECT_EQ(d0->numa_node, -1);  // unknown, not an error
  EXPECT_EQ(p->Locality(2).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_EQ(p->Locality(-1).status().code(), ErrorCode::kDeviceNotFound);

  // Cached: a later change of sysfs is not read again; the kernel's -1 ("no node") reads as unknown.
  std::ofstream(dir + "/numa_node") << "-1\n";
  EXPECT_EQ(p->Locality(1)->numa_node, 1);
  EXPECT_EQ(MakeCudaPlatform({FakeDriver()}, root)->Locality(1)->numa_node, -1);
  ASSERT_EQ(system(("rm -rf '" + root + "'").c_str()), 0);
}

}  // namespace
}  // namespace mooncake::te
