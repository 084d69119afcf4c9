// The rdma transport's device choice and handshake validation, on the FAKE verbs provider linked in.

#include "transfer_engine/transport/rdma/rdma_transport.h"

#include "transfer_engine/transport/rdma/rdma_responder.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/transport/rdma/testing/fake_verbs.h"

namespace mooncake::te::rdma {
namespace {

const bool kEnv = [] {
  const char* tmp = getenv("TEST_TMPDIR");
  setenv("MC_RDMA_FAKE_STATE", (std::string(tmp ? tmp : "/tmp") + "/rdma_transport_test").c_str(), 1);
  setenv("MC_RDMA_FAKE_DEVICES", "good0,down1:down,sw2:switch,nogid3:nogid,ib4:ib", 1);
  return true;
}();

const VerbsApi* Api() { return fake::FakeVerbs(); }

// The fd of this process that maps `addr` (the memfd behind a host emulation allocation) and the offset in it.
bool BackingFd(uint64_t addr, int* fd, uint64_t* offset) {
  FILE* maps = fopen("/proc/self/maps", "re");
  if (!maps) return false;
  char line[512];
  unsigned long long start = 0, end = 0, off = 0, inode = 0;
  bool found = false;
  while (!found && fgets(line, sizeof(line), maps)) {
    unsigned major, minor;
    char perms[8];
    found = sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &end, perms, &off, &major, &minor, &inode) == 7 &&
            addr >= start && addr < end && inode != 0;
  }
  fclose(maps);
  if (!found) return false;
  for (int i = 0; i < 4096; ++i) {
    struct stat st;
    if (fstat(i, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == inode) {
      *fd = i;
      *offset = off + (addr - start);
      return true;
    }
  }
  return false;
}

class Devices {
 public:
  Devices() { list_ = Api()->get_device_list(&n_); }
  ~Devices() { Api()->free_device_list(list_); }
  ibv_device* Get(const std::string& name) const {
    for (int i = 0; i < n_; ++i) {
      if (name == Api()->get_device_name(list_[i])) return list_[i];
    }
    return nullptr;
  }

 private:
  ibv_device** list_ = nullptr;
  int n_ = 0;
};

TEST(RdmaDeviceChoiceTest, UnusableHcasAreSkippedWithTheReason) {
  Devices d;
  RdmaConfig cfg;
  auto good = InspectDevice(Api(), d.Get("good0"), cfg);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->gid_index, 2) << "RoCEv2 IPv4-mapped is chosen first";
  EXPECT_EQ(good->gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_TRUE(good->ethernet);
  auto down = InspectDevice(Api(), d.Get("down1"), cfg);
  EXPECT_NE(down.status().message().find("not ACTIVE"), std::string::npos) << down.status().ToString();
  auto sw = InspectDevice(Api(), d.Get("sw2"), cfg);
  EXPECT_NE(sw.status().message().find("node type switch"), std::string::npos) << sw.status().ToString();
  auto nogid = InspectDevice(Api(), d.Get("nogid3"), cfg);
  EXPECT_NE(nogid.status().message().find("no usable GID"), std::string::npos) << nogid.status().ToString();
  auto ib = InspectDevice(Api(), d.Get("ib4"), cfg);
  ASSERT_TRUE(ib.ok()) << ib.status().ToString();
  EXPECT_FALSE(ib->ethernet);
  EXPECT_EQ(ib->gid_index, 0);
  EXPECT_NE(ib->lid, 0);
}

TEST(RdmaDeviceChoiceTest, GidIndexFromTheConfiguration) {
  Devices d;
  RdmaConfig cfg;
  cfg.gid_index = 1;
  auto one = InspectDevice(Api(), d.Get("good0"), cfg);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->gid_index, 1);
  cfg.gid_index = 3;  // an empty entry
  EXPECT_FALSE(InspectDevice(Api(), d.Get("good0"), cfg).ok());
  cfg.gid_index = -1;
  cfg.ib_port = 2;
  auto port = InspectDevice(Api(), d.Get("good0"), cfg);
  EXPECT_NE(port.status().message().find("no port 2"), std::string::npos) << port.status().ToString();
}

TEST(RdmaDeviceChoiceTest, GidText) {
  ibv_gid g{};
  g.raw[0] = 0xfe;
  g.raw[1] = 0x80;
  g.raw[15] = 0x01;
  EXPECT_EQ(GidText(g), "fe80:0000:0000:0000:0000:0000:0000:0001");
  auto back = ParseGid(GidText(g));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(memcmp(back->raw, g.raw, 16), 0);
  EXPECT_TRUE(ParseGid("fe800000000000000000000000000001").has_value());
  EXPECT_FALSE(ParseGid("fe80::1").has_value());
  EXPECT_FALSE(ParseGid("zz800000000000000000000000000001").has_value());
  EXPECT_FALSE(ParseGid("").has_value());
}

// Captures the handshake methods the transport registers.
class Host : public TransportHost {
 public:
  Status RegisterMethod(const std::string& method, MethodHandler handler) override {
    methods[method] = std::move(handler);
    return Status::Ok();
  }
  StatusOr<std::string> CallPeer(const std::string&, const std::string&, const std::string&) override {
    return Status(ErrorCode::kNotImplemented, "no peers");
  }
  Status Republish() override { return Status::Ok(); }
  std::map<std::string, MethodHandler> methods;
};

class RdmaTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_.host = &host_;
    ctx_.memory = &memory_;
    ctx_.instance = "self";
    ASSERT_TRUE(t_.Configure(TransportOptions()).ok());
    Status st = t_.Start(ctx_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  void TearDown() override { t_.Stop(); }
  nlohmann::json Request() {
    return {{"instance", "peer-1"}, {"segment", "peer"}, {"local_nic", "x0"}, {"peer_nic", "good0"},
            {"qpn", 0x1234},        {"psn", 7},          {"gid", "0000:0000:0000:0000:0000:ffff:0a00:0001"},
            {"lid", 0},             {"mtu", 3}};
  }

  Host host_;
  MemoryRegistry memory_;
  TransportContext ctx_;
  RdmaTransport t_{fake::FakeVerbs()};
};

TEST_F(RdmaTransportTest, UsesTheUsableHcasAndDescribesThem) {
  auto nics = t_.nics();
  ASSERT_EQ(nics.size(), 2u);
  EXPECT_EQ(nics[0].name, "good0");
  EXPECT_EQ(nics[1].name, "ib4");
  nlohmann::json d = nlohmann::json::object();
  t_.Describe(d);
  ASSERT_EQ(d["devices"].size(), 2u);
  EXPECT_EQ(d["devices"][0]["name"], "good0");
  EXPECT_EQ(d["devices"][0]["lid"], 0);
  EXPECT_EQ(d["devices"][0]["gid"].get<std::string>().size(), 39u);
  EXPECT_TRUE(host_.methods.count("rdma.connect"));
  EXPECT_TRUE(host_.methods.count("rdma.ready"));
}

TEST_F(RdmaTransportTest, RegistrationPublishesKeysPerDevice) {
  std::vector<uint8_t> mem(1 << 16);
  MemoryRegion r;
  r.start = reinterpret_cast<uint64_t>(mem.data());
  r.length = mem.size();
  r.kind = MemoryKind{MemoryType::kHost, 0};
  auto reg = t_.RegisterRegion(r);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(reg->descriptor_fields["lkey"].size(), 2u);
  EXPECT_EQ(reg->descriptor_fields["rkey"].size(), 2u);
  EXPECT_FALSE(reg->descriptor_fields.contains("rdma_chunk_size"));
  r.remote_accessible = false;
  auto local_only = t_.RegisterRegion(r);
  ASSERT_TRUE(local_only.ok());
  EXPECT_FALSE(local_only->descriptor_fields.contains("rkey")) << "no remote key for local-only memory";
  r.kind = MemoryKind{MemoryType::kCuda, 0};
  auto dev = t_.RegisterRegion(r);
  ASSERT_TRUE(dev.ok());
  // Device memory without a dma-buf fd, and no peer-memory client (MC_RDMA_FAKE_PEERMEM unset): declined, saying
  // why for both paths.
  EXPECT_TRUE(dev->declined);
  EXPECT_NE(dev->why_declined.find("dma-buf: the platform exported no dma-buf fd"), std::string::npos)
      << dev->why_declined;
  EXPECT_NE(dev->why_declined.find("peer memory: no peer-memory client"), std::string::npos) << dev->why_declined;
  EXPECT_EQ(dev->state, nullptr);
}

// The responder table: unconfirmed connections are evicted first, then the least recently confirmed one (a dead
// peer's entries must not fill the table for good); a restarted peer's old QPs go; "rdma.close" drops one; one
// instance cannot take the whole table; keys are tuples (no peer string can alias another's key).
TEST(RdmaResponderTest, EvictsUnconfirmedThenLeastRecentlyConfirmedAndBoundsEachPeer) {
  Devices d;
  RdmaConfig cfg;
  auto info = InspectDevice(Api(), d.Get("good0"), cfg);
  ASSERT_TRUE(info.ok());
  auto nic = RdmaNic::Open(Api(), d.Get("good0"), *info, cfg);
  ASSERT_TRUE(nic.ok());
  auto req = [](const std::string& instance, const std::string& segment, const std::string& local, uint32_t qpn) {
    return nlohmann::json{{"instance", instance}, {"segment", segment}, {"local_nic", local}, {"peer_nic", "good0"},
                          {"qpn", qpn}, {"psn", 1}, {"gid", "0000:0000:0000:0000:0000:ffff:0a00:0001"}, {"lid", 0},
                          {"mtu", 3}}
        .dump();
  };
  auto ready = [](const std::string& instance, const std::string& local, uint32_t qpn) {
    return nlohmann::json{{"instance", instance}, {"local_nic", local}, {"peer_nic", "good0"}, {"qpn", qpn}}.dump();
  };
  {
    Responder r({*nic}, cfg, "self", /*capacity=*/2, /*ready_window=*/std::chrono::milliseconds(0));
    auto a = r.Connect(req("i1", "s1", "x0", 0x100));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(r.Ready(ready("i1", "x0", 0x100)).ok());
    ASSERT_TRUE(r.Connect(req("i2", "s2", "x0", 0x200)).ok());
    ASSERT_TRUE(r.Ready(ready("i2", "x0", 0x200)).ok());
    auto again = r.Connect(req("i1", "s1", "x0", 0x100));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *a) << "a repeated request gets the same QP";
    // Full of confirmed entries (i1 confirmed before i2): a newcomer takes the least recently confirmed place.
    auto c = r.Connect(req("i3", "s3", "x0", 0x300));
    ASSERT_TRUE(c.ok()) << "a full table of confirmed entries refuses for good: " << c.status().ToString();
    EXPECT_FALSE(r.Ready(ready("i1", "x0", 0x100)).ok()) << "not the least recently confirmed entry went";
    EXPECT_TRUE(r.Ready(ready("i2", "x0", 0x200)).ok());  // i2 is now the most recently confirmed
    // The evicted requester reconnects (a new QP): it takes the place of i3, unconfirmed, before confirmed i2.
    ASSERT_TRUE(r.Connect(req("i1", "s1", "x0", 0x101)).ok());
    EXPECT_FALSE(r.Ready(ready("i3", "x0", 0x300)).ok());
    EXPECT_TRUE(r.Ready(ready("i1", "x0", 0x101)).ok());
    EXPECT_TRUE(r.Ready(ready("i2", "x0", 0x200)).ok());
    // s2 restarts as i4: i2's QP goes at once, which makes room.
    ASSERT_TRUE(r.Connect(req("i4", "s2", "x0", 0x400)).ok());
    EXPECT_EQ(r.size(), 2u);
    EXPECT_FALSE(r.Ready(ready("i2", "x0", 0x200)).ok());
    // rdma.close: only with the QPN and PSN of the entry (a close overtaken by a reconnect, even one that got the
    // same QPN again, leaves it alone); idempotent.
    auto close = [](const std::string& instance, uint32_t qpn, uint32_t psn) {
      return nlohmann::json{{"instance", instance}, {"local_nic", "x0"}, {"peer_nic", "good0"}, {"qpn", qpn},
                            {"psn", psn}}
          .dump();
    };
    EXPECT_TRUE(r.Close(close("i4", 0x999, 1)).ok());
    EXPECT_TRUE(r.Close(close("i4", 0x400, 2)).ok());
    EXPECT_EQ(r.size(), 2u);
    EXPECT_TRUE(r.Close(close("i4", 0x400, 1)).ok());
    EXPECT_EQ(r.size(), 1u);
    EXPECT_TRUE(r.Close(close("i4", 0x400, 1)).ok());
    EXPECT_FALSE(r.Ready(ready("i4", "x0", 0x400)).ok());
    EXPECT_EQ(r.Close("{\"instance\": 5}").status().code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(r.Ready(ready("i1", "x0", 0x101)).ok());
  }
  {
    // Handshakes within their ready window are not dropped: a table full of them refuses.
    Responder r({*nic}, cfg, "self", /*capacity=*/1, /*ready_window=*/std::chrono::seconds(60));
    ASSERT_TRUE(r.Connect(req("i1", "s1", "x0", 0x100)).ok());
    EXPECT_EQ(r.Connect(req("i2", "s2", "x0", 0x200)).status().code(), ErrorCode::kTooManyRequests);
    ASSERT_TRUE(r.Ready(ready("i1", "x0", 0x100)).ok());
    EXPECT_TRUE(r.Connect(req("i2", "s2", "x0", 0x200)).ok()) << "a confirmed entry makes room";
  }
  {
    // "a|b" + "c" and "a" + "b|c" are different connections.
    Responder r({*nic}, cfg);
    ASSERT_TRUE(r.Connect(req("i|x", "s1", "y", 0x100)).ok());
    ASSERT_TRUE(r.Connect(req("i", "s2", "x|y", 0x200)).ok());
    EXPECT_EQ(r.size(), 2u);
    EXPECT_TRUE(r.Ready(ready("i|x", "y", 0x100)).ok()) << "one peer's request replaced another's QP";
    EXPECT_TRUE(r.Ready(ready("i", "x|y", 0x200)).ok());
  }
  {
    // Segment s1 restarts as instance "i" with a connection whose strings would have joined to the old
    // instance's key: the old one's QP goes, the new one is made (no entry is used after its erase).
    Responder r({*nic}, cfg);
    ASSERT_TRUE(r.Connect(req("i|x", "s1", "y", 0x100)).ok());
    ASSERT_TRUE(r.Connect(req("i", "s1", "x|y", 0x200)).ok());
    EXPECT_EQ(r.size(), 1u);
    EXPECT_FALSE(r.Ready(ready("i|x", "y", 0x100)).ok());
    EXPECT_TRUE(r.Ready(ready("i", "x|y", 0x200)).ok());
  }
  {
    Responder r({*nic}, cfg);
    int refused = 0;
    for (uint32_t k = 0; k < 65; ++k) {
      refused += r.Connect(req("greedy", "g", "x" + std::to_string(k), 0x1000 + k)).status().code() ==
                 ErrorCode::kTooManyRequests;
    }
    EXPECT_EQ(refused, 1) << "one instance holds at most 64 x our NICs";
    EXPECT_TRUE(r.Connect(req("other", "o", "x0", 0x9000)).ok());
  }
  (*nic)->Stop();
}

// A requester QP of our own on good0, connected to the transport's responder through "rdma.connect": it uses the
// keys the transport published as a peer would.
class RawRequester {
 public:
  explicit RawRequester(size_t len) : mem(len) {}
  ~RawRequester() {
    if (qp_) V().destroy_qp(qp_);
    if (mr_) V().dereg_mr(mr_);
    if (cq_) V().destroy_cq(cq_);
    if (pd_) V().dealloc_pd(pd_);
    if (ctx_) V().close_device(ctx_);
    if (list_) V().free_device_list(list_);
  }
  void Connect(TransportHost::MethodHandler& connect) {
    int n = 0;
    list_ = V().get_device_list(&n);
    for (int i = 0; i < n; ++i) {
      if (std::string(V().get_device_name(list_[i])) == "good0") ctx_ = V().open_device(list_[i]);
    }
    ASSERT_NE(ctx_, nullptr);
    pd_ = V().alloc_pd(ctx_);
    cq_ = V().create_cq(ctx_, 64, nullptr, nullptr, 0);
    mr_ = V().reg_mr(pd_, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_TRUE(pd_ && cq_ && mr_);
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 16;
    init.cap.max_recv_wr = init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    qp_ = V().create_qp(pd_, &init);
    ASSERT_NE(qp_, nullptr);
    ibv_gid gid;
    V().query_gid(ctx_, 1, 2, &gid);
    nlohmann::json req = {{"instance", "raw"}, {"segment", "raw"}, {"local_nic", "raw0"}, {"peer_nic", "good0"},
                          {"qpn", qp_->qp_num}, {"psn", 11}, {"gid", GidText(gid)}, {"lid", 0},
                          {"mtu", IBV_MTU_4096}, {"rd_atom", 16}};
    auto reply = connect(req.dump());
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    nlohmann::json j = nlohmann::json::parse(*reply);
    QpAddress peer;
    peer.qpn = j["qpn"].get<uint32_t>();
    peer.psn = j["psn"].get<uint32_t>();
    peer.mtu = j["mtu"].get<int>();
    peer.rd_atom = 16;
    peer.gid = *ParseGid(j["gid"].get<std::string>());
    NicInfo local;
    local.gid_index = 2;
    local.active_mtu = IBV_MTU_4096;
    Status st = ConnectQp(Api(), qp_, local, peer, 11, RdmaConfig(), QpRole::kRequester);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ibv_wc_status Run(ibv_wr_opcode op, size_t off, uint64_t remote, uint32_t rkey, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uint64_t>(mem.data()) + off, len, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (V().post_send(qp_, &wr, &bad) != 0) return IBV_WC_GENERAL_ERR;
    ibv_wc wc{};
    for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
         std::chrono::steady_clock::now() < until;) {
      if (V().poll_cq(cq_, 1, &wc) == 1) return wc.status;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return IBV_WC_GENERAL_ERR;
  }
  std::vector<uint8_t> mem;

 private:
  static const VerbsApi& V() { return *Api(); }
  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_qp* qp_ = nullptr;
};

// Device memory whose platform exported a dma-buf fd (here: the host emulation's memfd) is registered with
// ibv_reg_dmabuf_mr; a peer's writes and reads through its rkey reach the device buffer.
TEST_F(RdmaTransportTest, DeviceMemoryWithADmabufFdIsRegisteredThroughDmabuf) {
  auto platform = MakeHostEmulationPlatform(1);
  constexpr size_t kLen = 1 << 20;
  auto dev = platform->Allocate(kLen, AllocationKind::kDevice, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  MemoryRegion r;
  r.start = reinterpret_cast<uint64_t>(*dev);
  r.length = kLen;
  r.kind = MemoryKind{MemoryType::kCuda, 0};
  ASSERT_TRUE(BackingFd(r.start, &r.backing_fd, &r.backing_offset)) << "the emulation's memfd is not open here";
  auto reg = t_.RegisterRegion(r);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  ASSERT_FALSE(reg->declined) << reg->why_declined;
  r.transports.push_back({"rdma", reg->descriptor_fields, reg->state});
  EXPECT_EQ(RdmaTransport::RegistrationPath(r), "dma-buf");
  const uint32_t lkey = reg->descriptor_fields["lkey"][0].get<uint32_t>();
  const uint32_t rkey = reg->descriptor_fields["rkey"][0].get<uint32_t>();
  EXPECT_NE(lkey, rkey) << "local and remote MRs are separate";

  RawRequester peer(kLen);
  peer.Connect(host_.methods["rdma.connect"]);
  for (size_t i = 0; i < kLen; ++i) peer.mem[i] = static_cast<uint8_t>(i * 13 + 1);
  ASSERT_EQ(peer.Run(IBV_WR_RDMA_WRITE, 0, r.start + 4096, rkey, 65536), IBV_WC_SUCCESS);
  std::vector<uint8_t> back(65536);
  auto copy = platform->CopyAsync(back.data(), reinterpret_cast<const uint8_t*>(*dev) + 4096, back.size(), 0);
  ASSERT_TRUE(copy.ok() && (*copy)->Wait().ok());
  EXPECT_EQ(memcmp(back.data(), peer.mem.data(), back.size()), 0) << "host -> device bytes damaged";
  memset(reinterpret_cast<uint8_t*>(*dev) + 8192, 0x7e, 4096);
  ASSERT_EQ(peer.Run(IBV_WR_RDMA_READ, 100000, r.start + 8192, rkey, 4096), IBV_WC_SUCCESS);
  EXPECT_EQ(peer.mem[100000], 0x7e);
  EXPECT_EQ(peer.mem[100000 + 4095], 0x7e);
  EXPECT_EQ(peer.Run(IBV_WR_RDMA_WRITE, 0, r.start, lkey, 64), IBV_WC_REM_ACCESS_ERR) << "an lkey is no rkey";
  t_.UnregisterRegion(r);
  ASSERT_TRUE(platform->Free(*dev, kLen, AllocationKind::kDevice).ok());
}

// Withdrawing a region stops remote access at once (before the engine drains our own transfers, which keep
// their local keys until UnregisterRegion).
TEST_F(RdmaTransportTest, WithdrawnRegionsRefuseRemoteAccessAtOnce) {
  std::vector<uint8_t> mem(1 << 16, 0);
  MemoryRegion r;
  r.start = reinterpret_cast<uint64_t>(mem.data());
  r.length = mem.size();
  auto reg = t_.RegisterRegion(r);
  ASSERT_TRUE(reg.ok());
  r.transports.push_back({"rdma", reg->descriptor_fields, reg->state});
  const uint32_t rkey = reg->descriptor_fields["rkey"][0].get<uint32_t>();
  RawRequester peer(1 << 16);
  peer.Connect(host_.methods["rdma.connect"]);
  peer.mem[0] = 1;
  ASSERT_EQ(peer.Run(IBV_WR_RDMA_WRITE, 0, r.start, rkey, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(mem[0], 1);
  t_.WithdrawRegion(r);
  peer.mem[0] = 2;
  EXPECT_EQ(peer.Run(IBV_WR_RDMA_WRITE, 0, r.start, rkey, 64), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(mem[0], 1) << "a late write landed in withdrawn memory";
  t_.UnregisterRegion(r);
}

// On mlx5 an MR's lkey is also an rkey, so the published lkey[] must belong to MRs without remote access: a peer
// using one as an rkey is refused (the fake gives one key per MR, as mlx5 does).
TEST_F(RdmaTransportTest, APublishedLkeyIsNoRemoteKey) {
  std::vector<uint8_t> mem(1 << 16, 0);
  MemoryRegion r;
  r.start = reinterpret_cast<uint64_t>(mem.data());
  r.length = mem.size();
  auto reg = t_.RegisterRegion(r);
  ASSERT_TRUE(reg.ok());
  r.transports.push_back({"rdma", reg->descriptor_fields, reg->state});
  const uint32_t lkey = reg->descriptor_fields["lkey"][0].get<uint32_t>();
  const uint32_t rkey = reg->descriptor_fields["rkey"][0].get<uint32_t>();
  ASSERT_NE(lkey, rkey);
  RawRequester peer(1 << 16);
  peer.Connect(host_.methods["rdma.connect"]);
  peer.mem[0] = 1;
  ASSERT_EQ(peer.Run(IBV_WR_RDMA_WRITE, 0, r.start, rkey, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(mem[0], 1);
  peer.mem[0] = 2;
  EXPECT_EQ(peer.Run(IBV_WR_RDMA_WRITE, 0, r.start, lkey, 64), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(mem[0], 1) << "a write through the published lkey landed";
  t_.WithdrawRegion(r);
  t_.UnregisterRegion(r);
}

TEST_F(RdmaTransportTest, ConnectRequestsAreValidated) {
  auto& connect = host_.methods["rdma.connect"];
  EXPECT_FALSE(connect("not json").ok());
  EXPECT_FALSE(connect("[]").ok());
  EXPECT_FALSE(connect("{}").ok());
  for (const char* field : {"instance", "local_nic", "peer_nic", "qpn", "psn", "gid", "lid", "mtu"}) {
    nlohmann::json r = Request();
    r.erase(field);
    EXPECT_FALSE(connect(r.dump()).ok()) << "without " << field;
    r = Request();
    r[field] = nlohmann::json::array({1});
    EXPECT_FALSE(connect(r.dump()).ok()) << field << " of the wrong type";
  }
  nlohmann::json r = Request();
  r["qpn"] = 1 << 24;
  EXPECT_FALSE(connect(r.dump()).ok()) << "QPN above 24 bits";
  r = Request();
  r["qpn"] = -5;
  EXPECT_FALSE(connect(r.dump()).ok()) << "negative QPN";
  r = Request();
  r["gid"] = "fe80::1";
  EXPECT_FALSE(connect(r.dump()).ok());
  r = Request();
  r["peer_nic"] = "mlx5_9";
  auto unknown = connect(r.dump());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kDeviceNotFound) << unknown.status().ToString();
  r = Request();
  r["mtu"] = 9;
  EXPECT_FALSE(connect(r.dump()).ok());

  auto reply = connect(Request().dump());
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  nlohmann::json j = nlohmann::json::parse(*reply);
  EXPECT_GT(j["qpn"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["nic"], "good0");
  EXPECT_LE(j["mtu"].get<int>(), MtuEnum(RdmaConfig().mtu)) << "the reply advertises the MTU capped by MC_MTU";
  EXPECT_GT(j["rd_atom"].get<int>(), 0) << "and the READ depth it serves";
  auto again = connect(Request().dump());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *reply) << "a repeated request gets the same QP";
  nlohmann::json reused = Request();
  reused["psn"] = 8;  // the requester reconnected and its HCA reused the QPN: a new QP, not the old one
  auto fresh = connect(reused.dump());
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(*fresh, *reply);
  nlohmann::json ready = {{"instance", "peer-1"}, {"local_nic", "x0"}, {"peer_nic", "good0"}, {"qpn", 0x1234}};
  EXPECT_TRUE(host_.methods["rdma.ready"](ready.dump()).ok());
  ready["qpn"] = 99;
  EXPECT_FALSE(host_.methods["rdma.ready"](ready.dump()).ok());
}

TEST_F(RdmaTransportTest, PeersWithoutUsableDevicesAreNotReachable) {
  SegmentDescriptor d;
  d.name = "p";
  d.json = nlohmann::json::object();
  EXPECT_FALSE(t_.CanReach(d));
  d.json["devices"] = "mlx5_0";
  EXPECT_FALSE(t_.CanReach(d));
  d.json["devices"] = nlohmann::json::array({{{"name", "mlx5_0"}, {"lid", 0}, {"gid", 5}}});
  EXPECT_FALSE(t_.CanReach(d));
  d.json["devices"] = nlohmann::json::array({{{"name", "mlx5_0"}, {"lid", -1}, {"gid", GidText(ibv_gid{})}}});
  EXPECT_FALSE(t_.CanReach(d));
  d.json["devices"] = nlohmann::json::array({{{"name", "mlx5_0"}, {"lid", 0}, {"gid", GidText(ibv_gid{})}}});
  EXPECT_TRUE(t_.CanReach(d));
}

}  // namespace
}  // namespace mooncake::te::rdma
