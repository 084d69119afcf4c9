#include "transfer_engine/transport/conformance/target.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/transport/conformance/pattern.h"

namespace mooncake::te::conformance {
namespace {

using Clock = std::chrono::steady_clock;

TargetOptions TcpOnly() {
  TargetOptions o;
  o.engine.local_server_name = "127.0.0.1";
  o.engine.metadata_conn = "P2PHANDSHAKE";
  o.engine.protocol = "tcp";
  o.engine.transports = {"tcp"};
  o.buffer_size = 1 << 20;
  return o;
}

class TargetTest : public ::testing::TestWithParam<bool> {  // true: child process
 protected:
  StatusOr<std::unique_ptr<Target>> Start(const TargetOptions& o) {
    return GetParam() ? StartPeerProcessTarget(o) : StartInProcessTarget(o);
  }
};

TEST_P(TargetTest, AnswersEveryCommand) {
  auto t = Start(TcpOnly());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Target& target = **t;
  EXPECT_FALSE(target.segment_name().empty());
  EXPECT_NE(target.buffer_address(), 0u);
  EXPECT_EQ(target.buffer_size(), size_t{1} << 20);

  ASSERT_TRUE(target.Fill(100, 5000, 42).ok());
  std::vector<uint8_t> expect(5000);
  FillPattern(expect.data(), expect.size(), 42, 100);
  auto d = target.DigestOf(100, 5000);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, Digest(expect.data(), expect.size()));
  auto zero = target.DigestOf(0, 100);  // untouched
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, Digest(std::vector<uint8_t>(100).data(), 100));

  auto stats = target.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(nlohmann::json::parse(*stats, nullptr, false).contains("listeners")) << *stats;

  auto extra = target.RegisterExtra(65536);
  ASSERT_TRUE(extra.ok()) << extra.status().ToString();
  EXPECT_NE(*extra, 0u);

  auto none = target.WaitNotification(std::chrono::milliseconds(20), 0, 16);
  EXPECT_EQ(none.status().code(), ErrorCode::kTimeout);

  EXPECT_TRUE(target.Unregister().ok());
  EXPECT_EQ(target.Unregister().code(), ErrorCode::kAddressNotRegistered);  // the engine's own code, carried over
  EXPECT_TRUE(target.Fill(0, 16, 1).ok());  // the memory stays
}

TEST_P(TargetTest, RangesOutsideTheBufferAreRefused) {
  auto t = Start(TcpOnly());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->Fill((1 << 20) - 1, 2, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*t)->DigestOf(1 << 20, 1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*t)->WaitNotification(std::chrono::milliseconds(1), 0, (1 << 20) + 1).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_TRUE((*t)->DigestOf(1 << 20, 0).ok());  // an empty range at the end is inside
}

TEST_P(TargetTest, AVanishedTargetAnswersWithAnError) {
  auto t = Start(TcpOnly());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::string name = (*t)->segment_name();
  (*t)->Vanish();
  EXPECT_EQ((*t)->segment_name(), name);
  EXPECT_EQ((*t)->Unregister().code(), ErrorCode::kPeerUnreachable);
  EXPECT_EQ((*t)->Stats().status().code(), ErrorCode::kPeerUnreachable);
}

TEST_P(TargetTest, AnEngineThatCannotBeCreatedIsReported) {
  TargetOptions o = TcpOnly();
  o.engine.protocol = "no_such_protocol";
  auto start = Clock::now();
  auto t = Start(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kNotImplemented) << t.status().ToString();
  EXPECT_NE(t.status().message().find("no_such_protocol"), std::string::npos) << t.status().ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

INSTANTIATE_TEST_SUITE_P(Modes, TargetTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "TwoProcess" : "InProcess"; });

TEST(PeerProcessTest, AChildThatIsNotReadyInTimeIsKilled) {
  auto start = Clock::now();
  auto t = StartPeerProcessTarget(TcpOnly(), std::chrono::milliseconds(1));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kTimeout) << t.status().ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(PeerProcessTest, UnknownFlagsAreReported) {
  TargetOptions o = TcpOnly();
  o.engine.transport_options["="] = "x";  // --option== : no key
  auto t = StartPeerProcessTarget(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument) << t.status().ToString();
}

TEST(PeerProcessTest, ArgumentsCarryTheTransportOptions) {
  TargetOptions o = TcpOnly();
  o.engine.transports = {"tcp", "shm"};
  o.engine.transport_options["tcp.lanes"] = "3";
  o.fault_transports = {{"faulty_tcp", "tcp"}};
  o.other_host = true;
  std::vector<std::string> args = PeerArguments(o);
  auto has = [&](const std::string& a) { return std::find(args.begin(), args.end(), a) != args.end(); };
  EXPECT_TRUE(has("--transports=tcp,shm"));
  EXPECT_TRUE(has("--protocol=tcp"));
  EXPECT_TRUE(has("--option=tcp.lanes=3"));
  EXPECT_TRUE(has("--fault_transport=faulty_tcp=tcp"));
  EXPECT_TRUE(has("--other_host"));
  EXPECT_TRUE(has("--buffer_size=1048576"));
}

TEST(PeerProcessTest, TheBinaryIsFound) {
  auto path = PeerBinaryPath();
  ASSERT_TRUE(path.ok()) << path.status().ToString();
}

}  // namespace
}  // namespace mooncake::te::conformance
