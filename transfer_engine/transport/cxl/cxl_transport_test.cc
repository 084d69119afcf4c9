// The transport against descriptors it did not write: bounds of published offsets, malformed fields, peers
// that closed or withdrew memory, which registrations publish an offset, and overlap with others' allocations.
#include "transfer_engine/transport/cxl/cxl_transport.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "transfer_engine/core/batch.h"
#include "transfer_engine/core/memory_registry.h"

namespace mooncake::te::cxl {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSize = 32 * kMiB;
constexpr uint64_t kPeerAddr = 0x7000000000;  // where the emulated peer says its buffer is (its address space)
constexpr uint64_t kPeerOffset = 8 * kMiB;

class CxlTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/dev/shm/mc-cxl-transport-test-XXXXXX";
    int fd = mkstemp(path_.data());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, kSize), 0);
    close(fd);
    ASSERT_TRUE(t_.Configure(TransportOptions("cxl", {{"cxl.dev_path", path_},
                                                      {"cxl.dev_size", std::to_string(kSize)}}))
                    .ok());
    TransportContext ctx;
    ctx.memory = &registry_;
    ctx.instance = "initiator";
    ctx.local_segment_name = "initiator";
    Status st = t_.Start(ctx);
    ASSERT_TRUE(st.ok()) << st.ToString();
    auto peer = CxlDevice::Open(path_, kSize);  // the peer's own mapping of the device
    ASSERT_TRUE(peer.ok());
    peer_dev_ = std::move(peer.value());
    auto slot = peer_dev_->ClaimSlot("peer-instance");
    ASSERT_TRUE(slot.ok());
    peer_slot_ = *slot;
  }
  void TearDown() override {
    t_.Stop();
    unlink(path_.c_str());
  }

  // The descriptor a peer of this device would publish, with one buffer at kPeerOffset.
  nlohmann::json PeerJson() {
    nlohmann::json j = nlohmann::json::object();
    t_.Describe(j);
    j["name"] = "peer";
    j["protocol"] = "cxl";
    j["instance"] = "peer-instance";
    j["pid"] = getpid();
    j["cxl_slot"] = peer_slot_;
    j["cxl_epoch"] = 0;
    j["buffers"] = {{{"name", "*"}, {"addr", kPeerAddr}, {"length", 4 * kMiB}, {"offset", kPeerOffset}}};
    return j;
  }
  static SegmentDescriptor Desc(const nlohmann::json& j) {
    auto d = SegmentDescriptor::Parse(j.dump());
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? *d : SegmentDescriptor{};
  }

  // One request through SubmitAndDrive; its task's outcome.
  Status Run(const SegmentDescriptor& d, OpCode op, char* local, uint64_t remote, size_t len) {
    auto batch = std::make_shared<Batch>(1);
    Task* task = *batch->AddTask();
    batch->StartTask(task, CutIntoSlices(op, local, remote, len, t_.slice_size()), nullptr);
    std::vector<Slice*> slices;
    for (auto& s : task->slices()) slices.push_back(&s);
    t_.SubmitAndDrive(d, slices);
    EXPECT_TRUE(batch->WaitUntil(std::chrono::steady_clock::now() + std::chrono::seconds(10)));
    return task->error();
  }

  char* PeerBytes(uint64_t offset) { return peer_dev_->base() + offset; }

  std::string path_;
  MemoryRegistry registry_;
  CxlTransport t_;
  std::unique_ptr<CxlDevice> peer_dev_;
  int peer_slot_ = -1;
};

TEST_F(CxlTransportTest, MovesBytesAtThePublishedOffset) {
  std::vector<char> src(8192, 'w'), dst(8192, 0);
  ASSERT_TRUE(Run(Desc(PeerJson()), OpCode::kWrite, src.data(), kPeerAddr + 100, 8192).ok());
  EXPECT_EQ(memcmp(PeerBytes(kPeerOffset + 100), src.data(), 8192), 0);
  memset(PeerBytes(kPeerOffset + 4 * kMiB - 8192), 'r', 8192);
  ASSERT_TRUE(Run(Desc(PeerJson()), OpCode::kRead, dst.data(), kPeerAddr + 4 * kMiB - 8192, 8192).ok());
  EXPECT_EQ(std::string(dst.begin(), dst.end()), std::string(8192, 'r'));
  EXPECT_EQ(t_.Stats()["peer"]["bytes"], 16384u);
}

TEST_F(CxlTransportTest, PublishedOffsetsOutsideThePayloadAreRefused) {
  std::vector<char> src(4096, 'x');
  std::vector<char> before(PeerBytes(kSize - 4 * kMiB), PeerBytes(kSize));
  struct Case {
    nlohmann::json offset;
    ErrorCode code;
  };
  std::vector<Case> cases = {
      {kSize - 1 * kMiB, ErrorCode::kRemoteRejected},  // the buffer would run past the device's end
      {kSize, ErrorCode::kRemoteRejected},
      {UINT64_MAX - 10, ErrorCode::kRemoteRejected},  // no wrap-around
      {4096, ErrorCode::kRemoteRejected},             // inside the table
      {0, ErrorCode::kRemoteRejected},
      {"8388608", ErrorCode::kNotImplemented},        // not a number: not on the device
      {-5, ErrorCode::kNotImplemented},
      {nullptr, ErrorCode::kNotImplemented},
  };
  for (const auto& c : cases) {
    nlohmann::json j = PeerJson();
    if (c.offset.is_null()) j["buffers"][0].erase("offset");
    else j["buffers"][0]["offset"] = c.offset;
    Status st = Run(Desc(j), OpCode::kWrite, src.data(), kPeerAddr + 4 * kMiB - 4096, 4096);
    EXPECT_EQ(st.code(), c.code) << c.offset.dump() << ": " << st.ToString();
  }
  EXPECT_EQ(memcmp(before.data(), PeerBytes(kSize - 4 * kMiB), before.size()), 0) << "bytes were written";
  EXPECT_EQ(t_.Stats()["peer"]["errors"], cases.size());
}

TEST_F(CxlTransportTest, MalformedSlotsAndGonePeersAreRefused) {
  std::vector<char> src(4096, 'x');
  for (nlohmann::json slot : {nlohmann::json(-1), nlohmann::json(CxlDevice::kMaxEngines), nlohmann::json("0"),
                              nlohmann::json(nullptr)}) {
    nlohmann::json j = PeerJson();
    if (slot.is_null()) j.erase("cxl_slot");
    else j["cxl_slot"] = slot;
    EXPECT_EQ(Run(Desc(j), OpCode::kWrite, src.data(), kPeerAddr, 4096).code(), ErrorCode::kRemoteRejected)
        << slot.dump();
  }
  nlohmann::json other = PeerJson();
  other["instance"] = "someone-else";  // the slot holds another engine
  EXPECT_EQ(Run(Desc(other), OpCode::kWrite, src.data(), kPeerAddr, 4096).code(), ErrorCode::kPeerUnreachable);
  peer_dev_->AdvanceEpoch(peer_slot_);  // the peer withdrew memory
  EXPECT_EQ(Run(Desc(PeerJson()), OpCode::kRead, src.data(), kPeerAddr, 4096).code(), ErrorCode::kStaleMetadata);
  nlohmann::json fresh = PeerJson();
  fresh["cxl_epoch"] = 1;
  EXPECT_TRUE(Run(Desc(fresh), OpCode::kWrite, src.data(), kPeerAddr, 4096).ok());
  peer_dev_->ReleaseSlot(peer_slot_);  // the peer stopped
  EXPECT_EQ(Run(Desc(fresh), OpCode::kWrite, src.data(), kPeerAddr, 4096).code(), ErrorCode::kPeerUnreachable);
}

TEST_F(CxlTransportTest, ReachesOnlyPeersOfTheSameDevice) {
  EXPECT_TRUE(t_.CanReach(Desc(PeerJson())));
  for (const char* key : {"cxl_uuid", "cxl_size", "cxl_dev", "cxl_ino"}) {
    nlohmann::json j = PeerJson();
    j[key] = j[key].is_string() ? nlohmann::json("0123") : nlohmann::json(12345);
    EXPECT_FALSE(t_.CanReach(Desc(j))) << key;
    j[key] = nlohmann::json::array();
    EXPECT_FALSE(t_.CanReach(Desc(j))) << key;
    j.erase(key);
    EXPECT_FALSE(t_.CanReach(Desc(j))) << key;
  }
  nlohmann::json far = PeerJson();  // another kernel: dev/ino mean nothing there, uuid and size decide
  far["cxl_kernel"] = "another-host";
  far["cxl_dev"] = 1;
  far["cxl_ino"] = 2;
  EXPECT_TRUE(t_.CanReach(Desc(far)));
}

MemoryRegion Region(const void* p, uint64_t len, MemoryType type = MemoryType::kHost) {
  MemoryRegion r;
  r.start = reinterpret_cast<uint64_t>(p);
  r.length = len;
  r.kind.type = type;
  return r;
}

TEST_F(CxlTransportTest, RegistrationsPublishTheirDeviceOffset) {
  char* own = t_.device()->base();
  auto inside = t_.RegisterRegion(Region(own + 10 * kMiB, kMiB));
  ASSERT_TRUE(inside.ok());
  EXPECT_EQ(inside->descriptor_fields["offset"], 10 * kMiB);
  EXPECT_EQ(t_.RegisterRegion(Region(own + kMiB, 2 * kMiB)).status().code(), ErrorCode::kInvalidArgument);  // table

  int fd = open(path_.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* shared = mmap(nullptr, 4 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 12 * kMiB);
  void* priv = mmap(nullptr, 4 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 12 * kMiB);
  close(fd);
  ASSERT_NE(shared, MAP_FAILED);
  ASSERT_NE(priv, MAP_FAILED);
  auto app = t_.RegisterRegion(Region(static_cast<char*>(shared) + 4096, kMiB));  // the application's mapping
  ASSERT_TRUE(app.ok());
  EXPECT_EQ(app->descriptor_fields["offset"], 12 * kMiB + 4096);
  auto too_long = t_.RegisterRegion(Region(shared, 8 * kMiB));  // runs past that mapping
  ASSERT_TRUE(too_long.ok());
  EXPECT_FALSE(too_long->descriptor_fields.contains("offset"));
  auto copy = t_.RegisterRegion(Region(priv, kMiB));  // a private copy is not the device
  ASSERT_TRUE(copy.ok());
  EXPECT_FALSE(copy->descriptor_fields.contains("offset"));
  std::vector<char> heap(4096);
  auto plain = t_.RegisterRegion(Region(heap.data(), heap.size()));  // a local source only
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->descriptor_fields.contains("offset"));
  auto gpu = t_.RegisterRegion(Region(heap.data(), heap.size(), MemoryType::kCuda));
  ASSERT_TRUE(gpu.ok());
  EXPECT_TRUE(gpu->declined);
  munmap(shared, 4 * kMiB);
  munmap(priv, 4 * kMiB);
}

// Another live process owns an allocation: this engine may not publish (and so expose) any part of it; once
// that process is gone, it may.
TEST_F(CxlTransportTest, RegisteringAnotherProcessesAllocationIsRefused) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    auto d = CxlDevice::Open(path_, kSize);
    auto a = d.ok() ? (*d)->Allocate(4 * kMiB, "other-client") : StatusOr<Allocation>(d.status());
    char ok = a.ok() && a->offset == CxlDevice::kReservedBytes ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  char* own = t_.device()->base();
  auto st = t_.RegisterRegion(Region(own + 5 * kMiB, 2 * kMiB));  // overlaps [2 MiB, 6 MiB)
  EXPECT_EQ(st.status().code(), ErrorCode::kAddressOverlapped) << st.status().ToString();
  EXPECT_NE(st.status().message().find("other-client"), std::string::npos);
  EXPECT_TRUE(t_.RegisterRegion(Region(own + 6 * kMiB, 2 * kMiB)).ok());  // just above it
  auto mine = t_.device()->Allocate(2 * kMiB, "mine");
  ASSERT_TRUE(mine.ok());
  EXPECT_TRUE(t_.RegisterRegion(Region(own + mine->offset, 2 * kMiB)).ok());  // our own allocation
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(t_.RegisterRegion(Region(own + 5 * kMiB, 2 * kMiB)).ok());
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace mooncake::te::cxl
