// The rdma transport's device choice and handshake validation, on the FAKE verbs provider linked in.

#include "transfer_engine/transport/rdma/rdma_transport.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>

#include <nlohmann/json.hpp>

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
  EXPECT_TRUE(dev->declined);
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
