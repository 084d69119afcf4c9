// The efa descriptor fields: what this engine writes (Mooncake's shape, under Mooncake's names when it
// publishes "efa"), what it reads from a Mooncake EFA peer and from older engines of this project, and what it
// refuses.

#include "transfer_engine/transport/efa/efa_descriptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <gtest/gtest.h>

#include <cstring>

namespace mooncake::te::efa {
namespace {

SegmentDescriptor Parse(const nlohmann::json& j) {
  auto d = SegmentDescriptor::Parse(j.dump());
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : SegmentDescriptor{};
}

std::string Hex(const void* p, size_t n) {
  std::string s;
  const char* digits = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = static_cast<const uint8_t*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::string Ipv4Gid(const char* ip) {
  struct sockaddr_in sin {};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(4242);
  inet_pton(AF_INET, ip, &sin.sin_addr);
  return Hex(&sin, sizeof(sin));
}

TEST(EfaDescriptorTest, WritesMooncakesShapeAndReadsItBack) {
  const std::vector<FabricDevice> devices = {{"rdmap0s31-rdm", "aabb", "efa"}, {"rdmap0s32-rdm", "ccdd", "efa"}};
  nlohmann::json d = {{"name", "peer"}, {"protocol", "efa"}};
  WriteFabric(d, /*mooncake_names=*/true, devices, true, 3, 0x1000, {11, 12});
  // Mooncake's golden shape: devices[{name, lid: 0, gid}], keys per device per buffer.
  ASSERT_TRUE(d["devices"].is_array());
  EXPECT_EQ(d["devices"][0]["name"], "rdmap0s31-rdm");
  EXPECT_EQ(d["devices"][0]["lid"], 0);
  EXPECT_EQ(d["devices"][1]["gid"], "ccdd");
  EXPECT_EQ(d["efa_devices"], d["devices"]) << "this project's own names are always written";
  nlohmann::json b = BufferFields(true, 0, {{0xffffffff00000001ull}, {7}}, true);
  EXPECT_EQ(b["rkey"], nlohmann::json::array({0xffffffff00000001ull, 7})) << "64-bit keys, one per device";
  EXPECT_EQ(b["lkey"], b["rkey"]);
  EXPECT_EQ(b["efa_rkey"], b["rkey"]);
  b["name"] = "cpu:0";
  b["addr"] = 0x10000;
  b["length"] = 4096;
  d["buffers"] = nlohmann::json::array({b});

  // Read back as a Mooncake peer would write it (Mooncake's names only).
  nlohmann::json mooncake = d;
  mooncake.erase("efa_devices");
  mooncake["buffers"][0].erase("efa_rkey");
  mooncake["buffers"][0].erase("efa_lkey");
  SegmentDescriptor sd = Parse(mooncake);
  auto p = ReadPeerFabric(sd);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->mooncake_names);
  ASSERT_EQ(p->devices.size(), 2u);
  EXPECT_EQ(p->devices[1].gid, "ccdd");
  EXPECT_TRUE(p->has_epoch);
  EXPECT_EQ(p->epoch_rkeys, (std::vector<uint64_t>{11, 12}));
  auto k = ReadBufferKeys(sd.buffers[0], *p);
  ASSERT_TRUE(k);
  uint64_t key = 0, off = 0;
  ASSERT_TRUE(k->Lookup(0, 100, &key, &off));
  EXPECT_EQ(key, 0xffffffff00000001ull);
  EXPECT_EQ(off, 100u);
  ASSERT_TRUE(k->Lookup(1, 0, &key, &off));
  EXPECT_EQ(key, 7u);
  EXPECT_FALSE(k->Lookup(2, 0, &key, &off));
}

TEST(EfaDescriptorTest, ReadsAMooncakePeerWithoutThisEnginesExtras) {
  // What a Mooncake EFA engine publishes: no provider, no efa_virt_addr, no epoch.
  nlohmann::json d = {{"name", "mc"},
                      {"protocol", "efa"},
                      {"devices", {{{"name", "rdmap16s27-rdm"}, {"lid", 0}, {"gid", "fe80aa"}}}},
                      {"buffers", {{{"name", "cpu:0"}, {"addr", 4096}, {"length", 8192}, {"lkey", {5}}, {"rkey", {5}}}}}};
  SegmentDescriptor sd = Parse(d);
  auto p = ReadPeerFabric(sd);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->devices[0].provider, "efa");
  EXPECT_TRUE(p->virt_addr);
  EXPECT_FALSE(p->has_epoch);
  EXPECT_TRUE(ReadBufferKeys(sd.buffers[0], *p));
  // The same fields under another protocol belong to that protocol (rdma's devices), not to efa.
  d["protocol"] = "rdma";
  EXPECT_FALSE(ReadPeerFabric(Parse(d)).ok());
}

TEST(EfaDescriptorTest, ReadsTheOlderFieldsOfThisProject) {
  // Engines before multi-NIC support: efa_devices with one device, a single efa_epoch_rkey, efa_rkey [k].
  nlohmann::json d = {{"name", "old"},
                      {"protocol", "tcp"},
                      {"efa_devices", {{{"name", "lo"}, {"lid", 0}, {"gid", "0a0b"}, {"provider", "tcp;ofi_rxm"}}}},
                      {"efa_virt_addr", false},
                      {"efa_epoch", 2},
                      {"efa_epoch_addr", 8192},
                      {"efa_epoch_rkey", 9},
                      {"buffers", {{{"name", "cpu:0"}, {"addr", 4096}, {"length", 8192}, {"efa_rkey", {4}}}}}};
  SegmentDescriptor sd = Parse(d);
  auto p = ReadPeerFabric(sd);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->mooncake_names);
  EXPECT_FALSE(p->virt_addr);
  EXPECT_EQ(p->epoch_rkeys, std::vector<uint64_t>{9});
  EXPECT_EQ(p->devices[0].provider, "tcp;ofi_rxm");
  auto k = ReadBufferKeys(sd.buffers[0], *p);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->keys, (std::vector<std::vector<uint64_t>>{{4}}));
}

TEST(EfaDescriptorTest, ChunkedBuffersRoundTripAndBadTablesAreRefused) {
  nlohmann::json d = {{"name", "p"}, {"protocol", "tcp"}};
  WriteFabric(d, false, {{"a", "01", "tcp;ofi_rxm"}, {"b", "02", "tcp;ofi_rxm"}}, false, 0, 64, {1, 2});
  nlohmann::json b = BufferFields(false, 1000, {{10, 11, 12}, {20, 21, 22}}, true);
  EXPECT_EQ(b["efa_rkey"], nlohmann::json::array({10, 20}));
  EXPECT_FALSE(b.contains("rkey")) << "Mooncake's names only for an engine publishing efa";
  EXPECT_EQ(b["efa_mr_chunk"], 1000);
  b["name"] = "cpu:0";
  b["addr"] = 4096;
  b["length"] = 2500;  // three chunks: 1000, 1000, 500
  d["buffers"] = nlohmann::json::array({b});
  SegmentDescriptor sd = Parse(d);
  auto p = ReadPeerFabric(sd);
  ASSERT_TRUE(p.ok());
  auto k = ReadBufferKeys(sd.buffers[0], *p);
  ASSERT_TRUE(k);
  uint64_t key = 0, off = 0;
  ASSERT_TRUE(k->Lookup(1, 2499, &key, &off));
  EXPECT_EQ(key, 22u);
  EXPECT_EQ(off, 499u);
  ASSERT_TRUE(k->Lookup(0, 1000, &key, &off));
  EXPECT_EQ(key, 11u);
  EXPECT_EQ(off, 0u);
  EXPECT_FALSE(k->Lookup(0, 3000, &key, &off));

  auto refused = [&](auto mutate) {
    nlohmann::json bad = d;
    mutate(bad["buffers"][0]);
    SegmentDescriptor s = Parse(bad);
    return !ReadBufferKeys(s.buffers[0], *ReadPeerFabric(s));
  };
  EXPECT_TRUE(refused([](nlohmann::json& x) { x["efa_chunk_rkeys"][0].erase(2); })) << "too few chunks";
  EXPECT_TRUE(refused([](nlohmann::json& x) { x["efa_chunk_rkeys"].erase(1); })) << "too few devices";
  EXPECT_TRUE(refused([](nlohmann::json& x) { x["efa_chunk_rkeys"][1][0] = 99; })) << "disagrees with rkey";
  EXPECT_TRUE(refused([](nlohmann::json& x) { x["efa_mr_chunk"] = 0; }));
  EXPECT_TRUE(refused([](nlohmann::json& x) { x["efa_mr_chunk"] = "1000"; }));
  EXPECT_TRUE(refused([](nlohmann::json& x) { x["efa_mr_chunk"] = 1; })) << "a chunk size that does not fit the key table";
  EXPECT_TRUE(refused([](nlohmann::json& x) { x["efa_rkey"] = nlohmann::json::array({10}); })) << "one key, two devices";
  EXPECT_TRUE(refused([](nlohmann::json& x) { x["efa_rkey"] = nlohmann::json::array({10, -1}); }));
  EXPECT_TRUE(refused([](nlohmann::json& x) { x.erase("efa_rkey"); })) << "not registered for remote access";
}

TEST(EfaDescriptorTest, MalformedPeerFieldsAreRefusedNotThrown) {
  const nlohmann::json good = {{"name", "p"},
                               {"protocol", "efa"},
                               {"devices", {{{"name", "a"}, {"gid", "01"}}}},
                               {"efa_epoch", 1},
                               {"efa_epoch_addr", 2},
                               {"efa_epoch_rkey", {3}}};
  ASSERT_TRUE(ReadPeerFabric(Parse(good)).ok());
  std::vector<std::function<void(nlohmann::json&)>> bad = {
      [](nlohmann::json& j) { j["devices"] = "x"; },
      [](nlohmann::json& j) { j["devices"] = nlohmann::json::array(); },
      [](nlohmann::json& j) { j["devices"][0]["gid"] = 5; },
      [](nlohmann::json& j) { j["devices"][0].erase("gid"); },
      [](nlohmann::json& j) { j["devices"] = nlohmann::json::array({1}); },
      [](nlohmann::json& j) {
        nlohmann::json dev = {{"gid", "01"}};
        j["devices"] = std::vector<nlohmann::json>(65, dev);
      },
      [](nlohmann::json& j) { j["efa_virt_addr"] = 1; },
      [](nlohmann::json& j) { j["efa_epoch"] = -1; },
      [](nlohmann::json& j) { j.erase("efa_epoch_addr"); },
      [](nlohmann::json& j) { j["efa_epoch_rkey"] = nlohmann::json::array({3, 4}); },
      [](nlohmann::json& j) { j["efa_epoch_rkey"] = "3"; },
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    nlohmann::json j = good;
    bad[i](j);
    auto p = ReadPeerFabric(Parse(j));
    EXPECT_FALSE(p.ok()) << "case " << i << " accepted: " << j.dump();
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), ErrorCode::kMalformedJson);
    }
  }
}

TEST(EfaDescriptorTest, EpochLeaseRoundTripsAndBadValuesAreRefused) {
  const std::vector<FabricDevice> devices = {{"lo", "0102", "tcp;ofi_rxm"}};
  nlohmann::json d = {{"name", "peer"}, {"protocol", "efa"}};
  WriteFabric(d, false, devices, false, 4, 0x2000, {9}, /*epoch_lease_us=*/1500);
  EXPECT_EQ(d["efa_epoch_lease_us"], 1500);
  auto p = ReadPeerFabric(Parse(d));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->epoch_lease_us, 1500u);
  // No lease: the field is not written, and a reader takes 0 (read before every submission).
  nlohmann::json none = {{"name", "peer"}, {"protocol", "efa"}};
  WriteFabric(none, false, devices, false, 4, 0x2000, {9});
  EXPECT_FALSE(none.contains("efa_epoch_lease_us"));
  auto q = ReadPeerFabric(Parse(none));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->epoch_lease_us, 0u);
  for (const nlohmann::json& bad : {nlohmann::json("1500"), nlohmann::json(-1), nlohmann::json(10'000'001),
                                    nlohmann::json(1.5), nlohmann::json::array()}) {
    nlohmann::json b = d;
    b["efa_epoch_lease_us"] = bad;
    auto r = ReadPeerFabric(Parse(b));
    EXPECT_FALSE(r.ok()) << bad.dump();
    if (!r.ok()) EXPECT_EQ(r.status().code(), ErrorCode::kMalformedJson) << r.status().ToString();
  }
}

TEST(EfaDescriptorTest, EndpointAddressesThatAreIpv4AndLoopback) {
  EXPECT_EQ(GidIpv4(Ipv4Gid("10.78.2.1")), 0x0a4e0201u);
  EXPECT_FALSE(GidIsLoopback(Ipv4Gid("10.78.2.1")));
  EXPECT_TRUE(GidIsLoopback(Ipv4Gid("127.0.0.1")));
  struct sockaddr_in6 six {};
  six.sin6_family = AF_INET6;
  six.sin6_addr = in6addr_loopback;
  EXPECT_TRUE(GidIsLoopback(Hex(&six, sizeof(six))));
  EXPECT_FALSE(GidIpv4(Hex(&six, sizeof(six))));
  for (const char* junk : {"", "zz", "abc", "0102"}) {
    EXPECT_FALSE(GidIpv4(junk)) << junk;
    EXPECT_FALSE(GidIsLoopback(junk)) << junk;
  }
}

}  // namespace
}  // namespace mooncake::te::efa
