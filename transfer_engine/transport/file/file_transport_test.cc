// The file transport through the engine's public API: file segments published in a metadata store (the
// in-process "memkv" service), opened by name, read and written at every kind of offset and length, on ext4 /tmp
// (which enforces O_DIRECT alignment) and tmpfs /dev/shm (which does not); the errors of missing, removed and
// truncated files and of untrusted descriptors; capabilities, path mapping and the allowed-directory guard.
#include "transfer_engine/transport/file/file_transport.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/file/file_segment.h"
#include "transfer_engine/transport/file/testing/memory_metadata.h"
#include "transfer_engine/transport/file/testing/scratch.h"

namespace mooncake::te::file {
namespace {

using testing::Pattern;
using testing::ScratchDir;

std::atomic<int> g_store{0};

// One engine, a metadata store of its own, and a registered buffer.
struct Rig {
  explicit Rig(std::map<std::string, std::string> options = {}) {
    store = "file_test_" + std::to_string(getpid()) + "_" + std::to_string(++g_store);
    EngineOptions o;
    o.local_server_name = "127.0.0.1";
    o.metadata_conn = "memkv://" + store;
    if (!options.count("file.allowed_dirs")) options["file.allowed_dirs"] = "/tmp:/dev/shm";
    o.transport_options = std::move(options);
    auto e = TransferEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return;
    engine = std::move(e.value());
    mem.assign(16 << 20, 0);
    EXPECT_TRUE(engine->RegisterMemory(mem.data(), mem.size()).ok());
  }
  std::string conn() const { return "memkv://" + store; }
  // Publishes `files` as segment `name` and opens it.
  SegmentHandle Publish(const std::string& name, const std::vector<FileSegmentFile>& files) {
    auto b = PublishFileSegment(conn(), name, files);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (b.ok()) backends.push_back(std::move(b.value()));
    auto h = engine->OpenSegment(name);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    return h.ok() ? *h : kInvalidSegment;
  }
  Status Sync(OpCode op, size_t local_off, SegmentHandle seg, uint64_t logical, size_t len) {
    TransferRequest r{op, mem.data() + local_off, seg, kFileSegmentBase + logical, len};
    return engine->TransferSync({r}, std::chrono::seconds(20));
  }
  uint64_t Carried(const std::string& segment) const {
    auto j = nlohmann::json::parse(engine->StatsJson(), nullptr, false);
    std::function<uint64_t(const nlohmann::json&)> find = [&](const nlohmann::json& n) -> uint64_t {
      if (!n.is_object()) return 0;
      if (n.contains("file") && n["file"].is_object() && n["file"].contains(segment)) {
        return n["file"][segment].value("bytes", uint64_t{0});
      }
      for (const auto& [k, v] : n.items()) {
        if (uint64_t got = find(v)) return got;
      }
      return 0;
    };
    return find(j);
  }

  std::string store;
  std::unique_ptr<TransferEngine> engine;
  std::vector<uint8_t> mem;
  std::vector<std::unique_ptr<MetadataBackend>> backends;
};

class FileTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FileTransportTest, EveryOffsetAndLengthArrivesIntact) {
  ScratchDir dir(GetParam());
  auto a = Pattern(1 << 20, 1), b = Pattern((3 << 20) + 5, 2);
  std::string pa = dir.WriteFile("a", a), pb = dir.WriteFile("b", b);
  Rig s;
  ASSERT_TRUE(s.engine);
  SegmentHandle seg = s.Publish("nvmeof/seg", {{pa, 0, {}}, {pb, 0, {}}});
  auto buffers = s.engine->GetSegmentBuffers("nvmeof/seg");
  ASSERT_TRUE(buffers.ok());
  ASSERT_EQ(buffers->size(), 2u);
  EXPECT_EQ((*buffers)[0].addr, kFileSegmentBase);
  EXPECT_EQ((*buffers)[1].addr, kFileSegmentBase + a.size()) << "files are concatenated in the logical space";
  std::mt19937 rng(3);
  uint64_t seed = 50;
  std::vector<uint8_t>* files[] = {&a, &b};
  const std::string paths[] = {pa, pb};
  for (size_t len : {size_t{1}, size_t{3}, size_t{512}, size_t{4096}, size_t{4097}, size_t{65535}, size_t{1} << 20,
                     (size_t{5} << 19) + 7}) {
    for (int which = 0; which < 2; ++which) {
      std::vector<uint8_t>& content = *files[which];
      if (len > content.size()) continue;
      uint64_t base = which == 0 ? 0 : a.size();
      uint64_t off = rng() % (content.size() - len + 1);
      if (len == 4096) off = off / 4096 * 4096;  // one aligned case per file
      size_t lo = rng() % (s.mem.size() - len);
      Status st = s.Sync(OpCode::kRead, lo, seg, base + off, len);
      ASSERT_TRUE(st.ok()) << len << "@" << off << ": " << st.ToString();
      ASSERT_EQ(memcmp(s.mem.data() + lo, content.data() + off, len), 0) << "read " << len << "@" << off;
      auto fresh = Pattern(len, ++seed);
      memcpy(s.mem.data() + lo, fresh.data(), len);
      st = s.Sync(OpCode::kWrite, lo, seg, base + off, len);
      ASSERT_TRUE(st.ok()) << len << "@" << off << ": " << st.ToString();
      memcpy(content.data() + off, fresh.data(), len);
    }
  }
  EXPECT_EQ(ScratchDir::ReadFile(pa), a);
  EXPECT_EQ(ScratchDir::ReadFile(pb), b);
  EXPECT_GT(s.Carried("nvmeof/seg"), uint64_t{4} << 20) << s.engine->StatsJson();
}

TEST_P(FileTransportTest, BatchOfManyTasksCompletesTaskByTask) {
  ScratchDir dir(GetParam());
  std::string p = dir.WriteFile("f", std::vector<uint8_t>(1 << 20, 0));
  Rig s;
  ASSERT_TRUE(s.engine);
  SegmentHandle seg = s.Publish("nvmeof/batch", {{p, 0, {}}});
  auto src = Pattern(128 * 4096, 9);
  memcpy(s.mem.data(), src.data(), src.size());
  auto batch = s.engine->AllocateBatch(128);
  ASSERT_TRUE(batch.ok());
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < 128; ++i) {
    reqs.push_back({OpCode::kWrite, s.mem.data() + i * 4096, seg, kFileSegmentBase + (127 - i) * 4096 + (i % 2), 4096});
  }
  // Odd tasks start one byte into their block and end at its end: unaligned, so through the page cache; even
  // tasks are aligned (O_DIRECT from the registered memory).
  for (size_t i = 1; i < 128; i += 2) reqs[i].length = 4095;
  ASSERT_TRUE(s.engine->Submit(*batch, reqs).ok());
  auto st = s.engine->WaitBatch(*batch, std::chrono::seconds(20));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, TransferState::kCompleted);
  for (size_t i = 0; i < 128; ++i) EXPECT_EQ(s.engine->GetTaskStatus(*batch, i)->state, TransferState::kCompleted);
  auto file = ScratchDir::ReadFile(p);
  for (size_t i = 0; i < 128; ++i) {
    size_t at = (127 - i) * 4096 + (i % 2);
    ASSERT_EQ(memcmp(file.data() + at, src.data() + i * 4096, reqs[i].length), 0) << "task " << i;
  }
  EXPECT_TRUE(s.engine->FreeBatch(*batch).ok());
}

TEST_P(FileTransportTest, MissingRemovedAndTruncatedFilesFailClearly) {
  ScratchDir dir(GetParam());
  std::string p = dir.WriteFile("f", Pattern(1 << 20, 4));
  Rig s;
  ASSERT_TRUE(s.engine);
  SegmentHandle seg = s.Publish("nvmeof/err", {{p, 0, {}}});
  ASSERT_TRUE(s.Sync(OpCode::kRead, 0, seg, 0, 65536).ok());  // the file is open and cached
  // Beyond the segment: the engine refuses before any transport sees it.
  EXPECT_EQ(s.Sync(OpCode::kRead, 0, seg, (1 << 20) - 10, 20).code(), ErrorCode::kAddressNotRegistered);
  // Truncated: a read of the part that is gone fails and says so; the part that is left still reads.
  ASSERT_EQ(truncate(p.c_str(), 100000), 0);
  Status st = s.Sync(OpCode::kRead, 0, seg, 200000, 4096);
  EXPECT_EQ(st.code(), ErrorCode::kRemoteRejected) << st.ToString();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  EXPECT_TRUE(s.Sync(OpCode::kRead, 0, seg, 0, 4096).ok());
  // Short read at the end: the request ends past the file's end.
  st = s.Sync(OpCode::kRead, 0, seg, 98304, 4096);
  EXPECT_EQ(st.code(), ErrorCode::kRemoteRejected) << st.ToString();
  // Removed: the cached descriptor still lists it; the transfer fails, naming the file.
  ASSERT_EQ(unlink(p.c_str()), 0);
  st = s.Sync(OpCode::kWrite, 0, seg, 0, 4096);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(st.code() == ErrorCode::kRemoteRejected || st.code() == ErrorCode::kNotFound ||
              st.code() == ErrorCode::kNotImplemented)
      << st.ToString();
  st = s.Sync(OpCode::kRead, 0, seg, 0, 4096);
  EXPECT_FALSE(st.ok()) << "a read from a removed file succeeded";
  EXPECT_EQ(access(p.c_str(), F_OK), -1) << "a write re-created the removed file";
}

INSTANTIATE_TEST_SUITE_P(FileSystems, FileTransportTest, ::testing::ValuesIn(testing::TestRoots()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param == "/tmp" ? std::string("ext4_tmp") : std::string("tmpfs_dev_shm");
                         });

TEST(FileTransport, CapabilitiesAndPlugin) {
  const TransportPlugin* plugin = TransportRegistry::Get().FindByProtocol("nvmeof");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->name, "file");
  EXPECT_EQ(TransportRegistry::Get().FindByProtocol("file"), plugin);
  ASSERT_TRUE(plugin->probe);
  TransportProbe probe = plugin->probe();
  EXPECT_TRUE(probe.usable) << probe.reason;
  auto t = plugin->create();
  TransportCapabilities c = t->capabilities();
  EXPECT_EQ(c.addressing, AddressMode::kOffset);
  EXPECT_TRUE(c.Moves(MemoryType::kHost, MemoryType::kFile));
  EXPECT_FALSE(c.Moves(MemoryType::kHost, MemoryType::kHost)) << "memory to memory is other transports' work";
  EXPECT_FALSE(c.Moves(MemoryType::kCuda, MemoryType::kFile)) << "GDS is not driven";
  EXPECT_GT(t->slice_size(), 0u);
}

TEST(FileTransport, GdsProbeSaysWhyItIsUnusable) {
  std::string why = ProbeGds(&PlatformRegistry::Get());
  EXPECT_EQ(why.rfind("unusable: ", 0), 0u) << why;
  Rig s;
  ASSERT_TRUE(s.engine);
  auto j = nlohmann::json::parse(s.engine->StatsJson(), nullptr, false);
  EXPECT_NE(s.engine->StatsJson().find("\"gds\":\"unusable: "), std::string::npos) << s.engine->StatsJson();
}

TEST(FileTransport, LocalPathMapNamesTheFileOnThisHost) {
  ScratchDir dir("/tmp");
  auto content = Pattern(65536, 5);
  std::string p = dir.WriteFile("mapped", content);
  Rig s;
  ASSERT_TRUE(s.engine);
  // The owner's path does not exist here; this host ("127.0.0.1", the host part of the engine's name) maps it.
  SegmentHandle seg = s.Publish("nvmeof/mapped", {{"/nonexistent/owner/path", 65536, {{"127.0.0.1", p}}}});
  Status st = s.Sync(OpCode::kRead, 0, seg, 4096, 8192);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(memcmp(s.mem.data(), content.data() + 4096, 8192), 0);
  // A host the map does not name uses file_path, which does not exist: no transport reaches the segment.
  SegmentHandle other = s.Publish("nvmeof/unmapped", {{"/nonexistent/owner/path", 65536, {{"10.9.9.9", p}}}});
  st = s.Sync(OpCode::kRead, 0, other, 0, 4096);
  EXPECT_EQ(st.code(), ErrorCode::kNotImplemented) << st.ToString();
}

TEST(FileTransport, AllowedDirsKeepOtherPathsOut) {
  ScratchDir allowed("/tmp"), other("/dev/shm");
  std::string in = allowed.WriteFile("in", Pattern(8192, 1)), out = other.WriteFile("out", Pattern(8192, 2));
  Rig s({{"file.allowed_dirs", allowed.path()}});
  ASSERT_TRUE(s.engine);
  SegmentHandle ok = s.Publish("nvmeof/in", {{in, 0, {}}});
  SegmentHandle no = s.Publish("nvmeof/out", {{out, 0, {}}});
  EXPECT_TRUE(s.Sync(OpCode::kRead, 0, ok, 0, 4096).ok());
  Status st = s.Sync(OpCode::kWrite, 0, no, 0, 4096);
  EXPECT_EQ(st.code(), ErrorCode::kNotImplemented) << st.ToString();
  EXPECT_EQ(ScratchDir::ReadFile(out), Pattern(8192, 2)) << "a file outside the allowed directories was written";
}

TEST(FileTransport, UntrustedDescriptorsAreRefusedWithoutACrash) {
  ScratchDir dir("/tmp");
  std::string p = dir.WriteFile("f", Pattern(8192, 1));
  Rig s;
  ASSERT_TRUE(s.engine);
  const std::string prefix = "mooncake/nvmeof/";
  auto desc = [](int i, const std::string& fields) {
    return R"({"name":"nvmeof/b)" + std::to_string(i) + R"(","protocol":"nvmeof","buffers":[{"name":"file",)" +
           R"("addr":1099511627776,"length":8192,)" + fields + "}]}";
  };
  const std::string bad[] = {
      desc(1, R"("file_path":7)"),
      desc(2, R"("file_path":"P","offset":-5)"),
      desc(3, R"("file_path":"P","offset":18446744073709551615)"),
      desc(4, R"("file_path":"/x","local_path_map":{"127.0.0.1":3})"),
  };

  for (int i = 0; i < 4; ++i) {
    std::string text = bad[i];
    size_t at = text.find("\"P\"");
    if (at != std::string::npos) text.replace(at, 3, "\"" + p + "\"");
    std::string name = "nvmeof/b" + std::to_string(i + 1);
    testing::MemoryMetadataPut(s.store, prefix + "b" + std::to_string(i + 1), text);
    auto h = s.engine->OpenSegment(name);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    Status st = s.Sync(OpCode::kWrite, 0, *h, 0, 4096);
    EXPECT_FALSE(st.ok()) << name << " was accepted";
  }
  EXPECT_EQ(ScratchDir::ReadFile(p), Pattern(8192, 1)) << "a corrupted descriptor led to a write";
}

TEST(FileTransport, MooncakeWrittenDescriptorIsReadable) {
  // Mooncake's register.py writes `server_name` and buffers without name and addr; the transport completes
  // them (CompleteForeignDescriptor): its files are concatenated from kFileSegmentBase as ours are.
  ScratchDir dir("/tmp");
  auto a = Pattern(8192, 1), b = Pattern(5000, 2);
  std::string pa = dir.WriteFile("a", a), pb = dir.WriteFile("b", b);
  Rig s;
  ASSERT_TRUE(s.engine);
  testing::MemoryMetadataPut(s.store, "mooncake/nvmeof/mc",
                             R"({"server_name":"mc","protocol":"nvmeof","buffers":[{"length":8192,"file_path":")" +
                                 pa + R"(","local_path_map":{}},{"length":5000,"file_path":")" + pb + R"("}]})");
  auto h = s.engine->OpenSegment("nvmeof/mc");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto buffers = s.engine->GetSegmentBuffers("nvmeof/mc");
  ASSERT_TRUE(buffers.ok());
  ASSERT_EQ(buffers->size(), 2u);
  EXPECT_EQ((*buffers)[1].addr, kFileSegmentBase + 8192);
  ASSERT_TRUE(s.Sync(OpCode::kRead, 0, *h, 8192 + 100, 4000).ok());
  EXPECT_EQ(memcmp(s.mem.data(), b.data() + 100, 4000), 0);
  // A request across the boundary of the two files is split there (Mooncake does the same).
  Status across = s.Sync(OpCode::kRead, 0, *h, 8000, 1000);
  ASSERT_TRUE(across.ok()) << across.ToString();
  EXPECT_EQ(memcmp(s.mem.data(), a.data() + 8000, 192), 0);
  EXPECT_EQ(memcmp(s.mem.data() + 192, b.data(), 808), 0);
  EXPECT_FALSE(s.Sync(OpCode::kRead, 0, *h, 8000, 8192 + 5000).ok()) << "ran past the last file";
  // What cannot be completed stays refused: no file_path, a zero or mistyped length, addresses that wrap.
  for (const char* bad : {R"({"protocol":"nvmeof","buffers":[{"length":8192}]})",
                          R"({"protocol":"nvmeof","buffers":[{"length":0,"file_path":"/tmp/x"}]})",
                          R"({"protocol":"nvmeof","buffers":[{"length":"8","file_path":"/tmp/x"}]})",
                          R"({"protocol":"nvmeof","buffers":[{"length":8,"addr":18446744073709551615,"file_path":"/x"}]})",
                          R"({"protocol":"tcp","buffers":[{"length":8,"file_path":"/tmp/x"}]})"}) {
    testing::MemoryMetadataPut(s.store, "mooncake/nvmeof/bad", bad);
    s.engine->InvalidateSegment("nvmeof/bad");
    auto hb = s.engine->OpenSegment("nvmeof/bad");
    EXPECT_FALSE(hb.ok()) << bad;
    if (!hb.ok()) {
      EXPECT_EQ(hb.status().code(), ErrorCode::kMalformedJson) << bad;
    }
  }
}

TEST(FileTransport, DefinedSegmentsNeedNoAllowedDirectory) {
  // A segment the application defines is its own word: its paths are opened without file.allowed_dirs, while
  // the same descriptor from the metadata service is refused; undefining it resolves the name there again.
  ScratchDir dir("/tmp");
  auto a = Pattern(12288, 7);
  std::string pa = dir.WriteFile("a", a);
  Rig s(std::map<std::string, std::string>{{"file.allowed_dirs", "/dev/shm"}});
  ASSERT_TRUE(s.engine);
  auto text = BuildFileSegmentDescriptor("nvmeof/own", {{pa, 0, {}}});
  ASSERT_TRUE(text.ok());
  testing::MemoryMetadataPut(s.store, "mooncake/nvmeof/own", *text);
  auto h = s.engine->OpenSegment("nvmeof/own");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_FALSE(s.Sync(OpCode::kRead, 0, *h, 0, 4096).ok()) << "a published path outside allowed_dirs was opened";
  ASSERT_TRUE(s.engine->DefineSegment("nvmeof/own", *text).ok());
  Status st = s.Sync(OpCode::kRead, 0, *h, 4096, 8192);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(memcmp(s.mem.data(), a.data() + 4096, 8192), 0);
  auto fresh = Pattern(4096, 9);
  memcpy(s.mem.data(), fresh.data(), fresh.size());
  ASSERT_TRUE(s.Sync(OpCode::kWrite, 0, *h, 0, 4096).ok());
  auto written = ScratchDir::ReadFile(pa);
  EXPECT_TRUE(std::equal(fresh.begin(), fresh.end(), written.begin()));
  ASSERT_TRUE(s.engine->UndefineSegment("nvmeof/own").ok());
  EXPECT_EQ(s.engine->UndefineSegment("nvmeof/own").code(), ErrorCode::kNotFound);
  EXPECT_FALSE(s.Sync(OpCode::kRead, 0, *h, 0, 4096).ok()) << "the definition outlived UndefineSegment";
  EXPECT_EQ(s.engine->DefineSegment("nvmeof/x", "{not json").code(), ErrorCode::kMalformedJson);
  EXPECT_EQ(s.engine->DefineSegment("", *text).code(), ErrorCode::kInvalidArgument);
}

TEST(FileTransport, DescriptorKeepsMooncakesFields) {
  ScratchDir dir("/tmp");
  std::string p = dir.WriteFile("f", Pattern(8192, 1));
  auto text = BuildFileSegmentDescriptor("nvmeof/x", {{p, 0, {{"hostB", "/mnt/x"}}}});
  ASSERT_TRUE(text.ok());
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["protocol"], "nvmeof");
  EXPECT_EQ(j["server_name"], "nvmeof/x");
  ASSERT_EQ(j["buffers"].size(), 1u);
  EXPECT_EQ(j["buffers"][0]["file_path"], p);
  EXPECT_EQ(j["buffers"][0]["length"], 8192);
  EXPECT_EQ(j["buffers"][0]["local_path_map"]["hostB"], "/mnt/x");
}

}  // namespace
}  // namespace mooncake::te::file
