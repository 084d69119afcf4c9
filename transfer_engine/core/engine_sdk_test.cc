// The engine's side of the Transport SDK, driven by a toy transport registered in this test: registration
// hooks (descriptor fields, veto, declining a kind), handshake methods over the engine's RPC port, selection
// by memory kind, per-transport options, and explicit protocols that cannot run.
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/core/rpc.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te {
namespace {

/// What the toy transports of this process saw (they live in engines the tests create).
struct ToyLog {
  std::mutex mu;
  std::vector<std::string> calls;  // "<segment>: connect <payload>" / "ready"
  int registered = 0, withdrawn = 0, unregistered = 0;
  long long flag = -1;
  void Add(const std::string& s) {
    std::lock_guard lock(mu);
    calls.push_back(s);
  }
};
ToyLog& Log() {
  static ToyLog log;
  return log;
}

constexpr size_t kVetoedLength = 12345;

/// Same-host toy: copies within this process after a connect + ready handshake with the peer's toy.
class ToyTransport : public Transport {
 public:
  std::string name() const override { return "toy"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.same_host = true;
    c.priority = 100;  // above shm: every same-process transfer comes here
    c.memory = {{MemoryType::kHost, MemoryType::kHost}};
    return c;
  }
  Status Configure(const TransportOptions& o) override {
    std::lock_guard lock(Log().mu);
    Log().flag = o.Int("flag", "MC_TOY_FLAG", -1, 0, 100);
    return Status::Ok();
  }
  Status Start(const TransportContext& ctx) override {
    ctx_ = ctx;
    std::string me = ctx.local_segment_name;
    MC_RETURN_IF_ERROR(ctx.host->RegisterMethod("toy.connect", [me](const std::string& payload) -> StatusOr<std::string> {
      Log().Add(me + ": connect " + payload);
      return std::string("{\"qpn\":42}");
    }));
    return ctx.host->RegisterMethod("toy.ready", [me](const std::string& payload) -> StatusOr<std::string> {
      Log().Add(me + ": ready " + payload);
      return std::string("ok");
    });
  }
  void Stop() override {}
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override {
    if (region.length == kVetoedLength) return Status(ErrorCode::kMemory, "toy cannot pin 12345 bytes");
    RegionRegistration r;
    if (region.kind.type != MemoryType::kHost) {
      r.declined = true;
      r.why_declined = "host memory only";
      return r;
    }
    r.descriptor_fields["toy_key"] = region.start ^ 0x5a5a;
    std::lock_guard lock(Log().mu);
    Log().registered++;
    return r;
  }
  void WithdrawRegion(const MemoryRegion&) override {
    std::lock_guard lock(Log().mu);
    Log().withdrawn++;
  }
  void UnregisterRegion(const MemoryRegion&) override {
    std::lock_guard lock(Log().mu);
    Log().unregistered++;
  }
  void Describe(nlohmann::json& d) const override { d["toy_version"] = 1; }
  bool CanReach(const SegmentDescriptor& peer) const override { return peer.json.value("pid", 0) == getpid(); }
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override {
    if (!connected_.count(peer.name)) {
      auto reply = ctx_.host->CallPeer(peer.name, "toy.connect", "{\"from\":\"" + ctx_.local_segment_name + "\"}");
      if (!reply.ok()) {
        for (Slice* s : slices) s->Complete(reply.status());
        return;
      }
      auto ready = ctx_.host->CallPeer(peer.name, "toy.ready", *reply);
      if (!ready.ok()) {
        for (Slice* s : slices) s->Complete(ready.status());
        return;
      }
      connected_.insert(peer.name);
    }
    for (Slice* s : slices) {
      const BufferDescriptor* b = peer.FindBuffer(s->remote, s->length);
      if (!b || JsonUint(b->json, "toy_key") != (b->addr ^ 0x5a5a)) {
        s->Complete(Status(ErrorCode::kRemoteRejected, "no toy key for the range"));
        continue;
      }
      auto* remote = reinterpret_cast<char*>(s->remote);
      if (s->opcode == OpCode::kWrite) memcpy(remote, s->local, s->length);
      else memcpy(s->local, remote, s->length);
      s->Complete(Status::Ok());
    }
  }
  size_t slice_size() const override { return 1 << 20; }

 private:
  TransportContext ctx_;
  std::set<std::string> connected_;  // Submit runs on the caller's thread; the tests submit from one thread
};

class AbsentTransport : public ToyTransport {
 public:
  std::string name() const override { return "absent"; }
};

const bool kRegistered = [] {
  (void)TransportRegistry::Get().Register(
      TransportPlugin{"toy", {"toy"}, "", nullptr, [] { return std::unique_ptr<Transport>(new ToyTransport()); }});
  (void)TransportRegistry::Get().Register(TransportPlugin{
      "absent", {"absent", "absent_alias"}, "", [] { return TransportProbe{false, "no absent device on this host"}; },
      [] { return std::unique_ptr<Transport>(new AbsentTransport()); }});
  return true;
}();

std::unique_ptr<TransferEngine> Make(const std::string& protocol = "tcp", std::map<std::string, std::string> opts = {}) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = protocol;
  o.transport_options = std::move(opts);
  auto e = TransferEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e.value()) : nullptr;
}

nlohmann::json DescriptorOf(const TransferEngine& e) {
  RpcFrame f;
  f.type = RpcType::kMetadata;
  f.body = "{}";
  auto reply = RpcCall("127.0.0.1", e.rpc_port(), f, std::chrono::seconds(5), 1 << 20);
  EXPECT_TRUE(reply.ok());
  return reply.ok() ? nlohmann::json::parse(reply->body) : nlohmann::json();
}

TEST(EngineSdkTest, TransportFieldsReachTheDescriptorAndVetoesFailRegistration) {
  auto e = Make();
  ASSERT_TRUE(e);
  std::vector<char> buf(1 << 16), vetoed(kVetoedLength);
  ASSERT_TRUE(e->RegisterMemory(buf.data(), buf.size(), "cpu:0").ok());
  nlohmann::json d = DescriptorOf(*e);
  EXPECT_EQ(d["toy_version"], 1);
  ASSERT_EQ(d["buffers"].size(), 1u);
  EXPECT_EQ(d["buffers"][0]["toy_key"].get<uint64_t>(), reinterpret_cast<uint64_t>(buf.data()) ^ 0x5a5a);
  EXPECT_EQ(d["buffers"][0]["name"], "cpu:0");

  Status st = e->RegisterMemory(vetoed.data(), vetoed.size());
  EXPECT_EQ(st.code(), ErrorCode::kMemory) << st.ToString();
  EXPECT_NE(st.message().find("toy cannot pin"), std::string::npos) << st.message();
  EXPECT_FALSE(e->IsRegistered(vetoed.data(), 1));
  EXPECT_EQ(DescriptorOf(*e)["buffers"].size(), 1u);

  int withdrawn, unregistered;
  {
    std::lock_guard lock(Log().mu);
    withdrawn = Log().withdrawn;
    unregistered = Log().unregistered;
  }
  ASSERT_TRUE(e->UnregisterMemory(buf.data()).ok());
  std::lock_guard lock(Log().mu);
  EXPECT_EQ(Log().withdrawn, withdrawn + 1);
  EXPECT_EQ(Log().unregistered, unregistered + 1);
}

TEST(EngineSdkTest, HandshakeMethodsRunOnThePeersRpcPort) {
  auto a = Make(), b = Make();
  ASSERT_TRUE(a && b);
  std::vector<char> src(4096, 'x'), dst(4096, 0);
  ASSERT_TRUE(a->RegisterMemory(src.data(), src.size()).ok());
  ASSERT_TRUE(b->RegisterMemory(dst.data(), dst.size()).ok());
  auto h = a->OpenSegment(b->segment_name());
  ASSERT_TRUE(h.ok());
  TransferRequest r{OpCode::kWrite, src.data(), *h, reinterpret_cast<uint64_t>(dst.data()), src.size()};
  ASSERT_TRUE(a->TransferSync({r}, std::chrono::seconds(10)).ok());
  EXPECT_EQ(memcmp(src.data(), dst.data(), src.size()), 0);
  ASSERT_TRUE(a->TransferSync({r}, std::chrono::seconds(10)).ok());  // connected once
  std::vector<std::string> calls;
  {
    std::lock_guard lock(Log().mu);
    for (const auto& c : Log().calls) {
      if (c.rfind(b->segment_name() + ":", 0) == 0) calls.push_back(c);
    }
  }
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], b->segment_name() + ": connect {\"from\":\"" + a->segment_name() + "\"}");
  EXPECT_EQ(calls[1], b->segment_name() + ": ready {\"qpn\":42}");
  EXPECT_NE(a->StatsJson().find("\"toy\""), std::string::npos);
}

TEST(EngineSdkTest, UnknownMethodsAndMalformedRequestsAreRefused) {
  auto e = Make();
  ASSERT_TRUE(e);
  RpcFrame f;
  f.type = RpcType::kConnection;
  for (const char* body : {"{\"method\":\"nope.connect\",\"payload\":\"\"}", "{\"method\":7}", "not json", "{}"}) {
    f.body = body;
    auto reply = RpcCall("127.0.0.1", e->rpc_port(), f, std::chrono::seconds(5), 1 << 20);
    ASSERT_TRUE(reply.ok()) << body;
    auto j = nlohmann::json::parse(reply->body);
    EXPECT_TRUE(j.contains("error")) << body << " -> " << reply->body;
  }
  f.body = "{\"method\":\"nope.connect\",\"payload\":\"\"}";
  auto j = nlohmann::json::parse(RpcCall("127.0.0.1", e->rpc_port(), f, std::chrono::seconds(5), 1 << 20)->body);
  EXPECT_EQ(j["code"], static_cast<int>(ErrorCode::kNotImplemented));
}

TEST(EngineSdkTest, SelectionFollowsTheMemoryKind) {
  auto a = Make(), b = Make();
  ASSERT_TRUE(a && b);
  std::vector<char> src(4096, 'y'), dst(4096, 0);
  // Host bytes registered as device memory: every installed transport here moves host memory only.
  ASSERT_TRUE(a->RegisterMemory(src.data(), src.size(), "cuda:0").ok());
  ASSERT_TRUE(b->RegisterMemory(dst.data(), dst.size()).ok());
  auto h = a->OpenSegment(b->segment_name());
  ASSERT_TRUE(h.ok());
  TransferRequest r{OpCode::kWrite, src.data(), *h, reinterpret_cast<uint64_t>(dst.data()), src.size()};
  Status st = a->TransferSync({r}, std::chrono::seconds(10));
  EXPECT_EQ(st.code(), ErrorCode::kNotImplemented) << st.ToString();
  EXPECT_NE(st.message().find("cuda:0 memory"), std::string::npos) << st.message();
  EXPECT_EQ(dst[0], 0);
  EXPECT_EQ(a->RegisterMemory(dst.data(), 16, "cuda0").code(), ErrorCode::kInvalidArgument);
}

TEST(EngineSdkTest, OptionsReachTheirTransport) {
  auto e = Make("tcp", {{"toy.flag", "7"}, {"other.flag", "9"}});
  ASSERT_TRUE(e);
  std::lock_guard lock(Log().mu);
  EXPECT_EQ(Log().flag, 7);
}

TEST(EngineSdkTest, AnExplicitProtocolThatCannotRunFailsWithItsReason) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "absent_alias";
  auto e = TransferEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("no absent device on this host"), std::string::npos) << e.status().ToString();
  o.protocol = "rdma_that_nobody_serves";
  e = TransferEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kNotImplemented);
  EXPECT_NE(e.status().message().find("rdma_that_nobody_serves"), std::string::npos);
  // Not asked for: skipped, the engine runs without it.
  auto ok = Make("tcp");
  ASSERT_TRUE(ok);
  auto names = ok->InstalledTransports();
  EXPECT_EQ(names.front(), "tcp");
  EXPECT_EQ(std::count(names.begin(), names.end(), "absent"), 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), "toy"), 1);
}

TEST(EngineSdkTest, TheTransportListLimitsWhatIsInstalled) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.transports = {"tcp"};
  auto e = TransferEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->InstalledTransports(), std::vector<std::string>{"tcp"});
  o.protocol = "toy";
  EXPECT_EQ(TransferEngine::Create(o).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace mooncake::te
