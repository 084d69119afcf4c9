// GPU memory to and from files through cuFile, on the host emulation platform (MC_PLATFORM_EMULATION=1, BUILD
// env) with a FAKE libcufile (testing/fake_cufile.cc, its path as argv[1]): registration with cuFileBufRegister,
// writes and reads of "device" memory through the GDS threads (never io_uring), bytes verified, handles released;
// host memory still through io_uring; and the reasons GDS is unusable: no library, a driver that fails to open.
#include <dlfcn.h>

#include <cstring>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/platform.h"
#include "transfer_engine/transport/file/file_segment.h"
#include "transfer_engine/transport/file/gds.h"
#include "transfer_engine/transport/file/testing/scratch.h"

namespace mooncake::te::file {
namespace {

std::string g_fake;  // path of the fake libcufile

using testing::Pattern;
using testing::ScratchDir;

std::unique_ptr<TransferEngine> MakeEngine(const std::string& cufile_lib) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.transport_options = {{"file.cufile_lib", cufile_lib}};
  auto e = TransferEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e.value()) : nullptr;
}

std::string GdsStatus(TransferEngine& e) {
  auto j = nlohmann::json::parse(e.StatsJson(), nullptr, false);
  return j.contains("file") ? j["file"].value("gds", std::string()) : std::string();
}

struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : length(n) {
    platform = PlatformRegistry::Get().ForType(MemoryType::kCuda);
    auto p = platform ? platform->Allocate(n, AllocationKind::kDevice, 0) : Status(ErrorCode::kNotImplemented, "");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    ptr = p.ok() ? static_cast<uint8_t*>(*p) : nullptr;
  }
  ~DeviceBuffer() {
    if (ptr) (void)platform->Free(ptr, length, AllocationKind::kDevice);
  }
  std::shared_ptr<Platform> platform;
  uint8_t* ptr = nullptr;
  size_t length;
};

void Counters(long* out) {
  void* lib = dlopen(g_fake.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto fn = reinterpret_cast<void (*)(long*)>(dlsym(lib, "fake_cufile_counters"));
  ASSERT_NE(fn, nullptr);
  fn(out);
  dlclose(lib);
}

TEST(Gds, DeviceMemoryMovesThroughCuFile) {
  ASSERT_FALSE(g_fake.empty());
  auto engine = MakeEngine(g_fake);
  ASSERT_TRUE(engine);
  EXPECT_EQ(GdsStatus(*engine).rfind("usable: cuFile via ", 0), 0u) << GdsStatus(*engine);
  ScratchDir dir("/tmp");
  const size_t n = (3 << 20) + 123;
  std::string path = dir.WriteFile("f", std::vector<uint8_t>(n + 8192, 0));
  auto text = BuildFileSegmentDescriptor("gds/seg", {{path, 0, {}}});
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(engine->DefineSegment("gds/seg", *text).ok());
  auto seg = engine->OpenSegment("gds/seg");
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();

  DeviceBuffer src(n), dst(n);
  ASSERT_TRUE(src.ptr && dst.ptr);
  auto bytes = Pattern(n, 5);
  memcpy(src.ptr, bytes.data(), n);  // emulated device memory is host-addressable
  ASSERT_TRUE(engine->RegisterMemory(src.ptr, n, "cuda:0").ok());
  ASSERT_TRUE(engine->RegisterMemory(dst.ptr, n, "cuda:0").ok());
  long c[6];
  Counters(c);
  EXPECT_EQ(c[3], 2) << "cuFileBufRegister per device region";

  Status w = engine->TransferSync({{OpCode::kWrite, src.ptr, *seg, kFileSegmentBase + 4096 - 7, n}},
                                  std::chrono::seconds(20));
  ASSERT_TRUE(w.ok()) << w.ToString();
  auto file = ScratchDir::ReadFile(path);
  ASSERT_EQ(memcmp(file.data() + 4096 - 7, bytes.data(), n), 0);
  Status r = engine->TransferSync({{OpCode::kRead, dst.ptr, *seg, kFileSegmentBase + 4096 - 7, n}},
                                  std::chrono::seconds(20));
  ASSERT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(memcmp(dst.ptr, bytes.data(), n), 0);
  Counters(c);
  EXPECT_GE(c[0], 3) << "reads went through cuFile (1 MiB slices)";
  EXPECT_GE(c[1], 3) << "writes went through cuFile";
  EXPECT_EQ(c[2], 1) << "one cuFile handle per open file, kept while the file is open";
  EXPECT_EQ(c[5], 0) << "every cuFile I/O named the registered base of its region";

  // Host memory to the same segment still goes through io_uring, not cuFile.
  std::vector<uint8_t> host(8192, 0x5a);
  ASSERT_TRUE(engine->RegisterMemory(host.data(), host.size()).ok());
  ASSERT_TRUE(engine->TransferSync({{OpCode::kWrite, host.data(), *seg, kFileSegmentBase + n + 4096, 4096}},
                                   std::chrono::seconds(20)).ok());
  long after[6];
  Counters(after);
  EXPECT_EQ(after[1], c[1]);
  // A segment longer than its file: reading past the end is a clear error from cuFile's short count.
  auto longer = BuildFileSegmentDescriptor("gds/long", {{path, n + 8192 + (1 << 20), {}}});
  ASSERT_TRUE(longer.ok());
  ASSERT_TRUE(engine->DefineSegment("gds/long", *longer).ok());
  auto lseg = engine->OpenSegment("gds/long");
  ASSERT_TRUE(lseg.ok());
  Status past = engine->TransferSync({{OpCode::kRead, dst.ptr, *lseg, kFileSegmentBase + n + 8192, 100}},
                                     std::chrono::seconds(20));
  EXPECT_EQ(past.code(), ErrorCode::kRemoteRejected) << past.ToString();
  // A file opened through the page cache ("direct": false): cuFile gets an O_DIRECT descriptor of its own.
  auto j = nlohmann::json::parse(*text);
  j["buffers"][0]["direct"] = false;
  ASSERT_TRUE(engine->DefineSegment("gds/buffered", j.dump()).ok());
  auto bseg = engine->OpenSegment("gds/buffered");
  ASSERT_TRUE(bseg.ok());
  memset(dst.ptr, 0, n);
  Status viacache = engine->TransferSync({{OpCode::kRead, dst.ptr, *bseg, kFileSegmentBase + 4096 - 7, n}},
                                         std::chrono::seconds(20));
  ASSERT_TRUE(viacache.ok()) << viacache.ToString();
  EXPECT_EQ(memcmp(dst.ptr, bytes.data(), n), 0);
  ASSERT_TRUE(engine->UnregisterMemory(src.ptr).ok());
  ASSERT_TRUE(engine->UnregisterMemory(dst.ptr).ok());
  Counters(c);
  EXPECT_EQ(c[3], 0) << "cuFileBufDeregister at unregistration";
  engine.reset();
  Counters(c);
  EXPECT_EQ(c[2], 0) << "every cuFile handle was released with its file";
  EXPECT_EQ(c[4], 0) << "the driver was closed";
}

TEST(Gds, UnusableCuFileSaysWhyAndDeviceMemoryFindsNoPath) {
  EXPECT_EQ(Gds::Open("/nonexistent/libcufile.so.0").status().code(), ErrorCode::kNotImplemented);
  setenv("FAKE_CUFILE_OPEN_FAILS", "1", 1);
  auto failed = Gds::Open(g_fake);
  unsetenv("FAKE_CUFILE_OPEN_FAILS");
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("cuFileDriverOpen failed"), std::string::npos) << failed.status().ToString();

  auto engine = MakeEngine("/nonexistent/libcufile.so.0");
  ASSERT_TRUE(engine);
  EXPECT_EQ(GdsStatus(*engine).rfind("unusable: ", 0), 0u) << GdsStatus(*engine);
  ScratchDir dir("/tmp");
  std::string path = dir.WriteFile("f", std::vector<uint8_t>(8192, 1));
  auto text = BuildFileSegmentDescriptor("gds/none", {{path, 0, {}}});
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(engine->DefineSegment("gds/none", *text).ok());
  auto seg = engine->OpenSegment("gds/none");
  ASSERT_TRUE(seg.ok());
  DeviceBuffer dev(8192);
  ASSERT_TRUE(engine->RegisterMemory(dev.ptr, 8192, "cuda:0").ok());
  Status st = engine->TransferSync({{OpCode::kRead, dev.ptr, *seg, kFileSegmentBase, 4096}}, std::chrono::seconds(20));
  EXPECT_EQ(st.code(), ErrorCode::kNotImplemented) << st.ToString();
}

}  // namespace
}  // namespace mooncake::te::file

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) mooncake::te::file::g_fake = argv[1];
  return RUN_ALL_TESTS();
}
