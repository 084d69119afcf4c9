#include "transfer_engine/transport/tcp/wire.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace mooncake::te::tcp {
namespace {

TEST(WireTest, RequestRoundTrip) {
  RequestHeader h{FrameOp::kRead, 42, 0xdeadbeef000, 1 << 20};
  uint8_t buf[kRequestHeaderSize];
  EncodeRequest(h, buf);
  RequestHeader out;
  ASSERT_EQ(DecodeRequest(buf, sizeof(buf), 1 << 20, &out), ParseResult::kOk);
  EXPECT_EQ(out.op, FrameOp::kRead);
  EXPECT_EQ(out.seq, 42u);
  EXPECT_EQ(out.addr, 0xdeadbeef000u);
  EXPECT_EQ(out.length, 1u << 20);
  for (size_t n = 0; n < kRequestHeaderSize; ++n) {
    EXPECT_EQ(DecodeRequest(buf, n, 1 << 20, &out), ParseResult::kNeedMore) << n;
  }
  EXPECT_EQ(DecodeRequest(buf, sizeof(buf), (1 << 20) - 1, &out), ParseResult::kTooLarge);
}

TEST(WireTest, ResponseRoundTripAndErrors) {
  ResponseHeader h{FrameStatus::kAddressRejected, 7, 0};
  uint8_t buf[kResponseHeaderSize];
  EncodeResponse(h, buf);
  ResponseHeader out;
  ASSERT_EQ(DecodeResponse(buf, sizeof(buf), 0, &out), ParseResult::kOk);
  EXPECT_EQ(out.status, FrameStatus::kAddressRejected);
  uint8_t bad[kResponseHeaderSize];
  memcpy(bad, buf, sizeof(buf));
  bad[0] ^= 1;
  EXPECT_EQ(DecodeResponse(bad, 1, 0, &out), ParseResult::kBadMagic);  // detected from the first byte
  memcpy(bad, buf, sizeof(buf));
  bad[4] = 9;
  EXPECT_EQ(DecodeResponse(bad, 5, 0, &out), ParseResult::kBadVersion);
  memcpy(bad, buf, sizeof(buf));
  bad[5] = 9;
  EXPECT_EQ(DecodeResponse(bad, sizeof(bad), 0, &out), ParseResult::kBadStatus);
  uint8_t req[kRequestHeaderSize];
  EncodeRequest(RequestHeader{FrameOp::kWrite, 1, 1, 1}, req);
  EXPECT_EQ(DecodeResponse(req, sizeof(req), 0, &out), ParseResult::kBadMagic);  // a request is not a response
}

// Randomized robustness: arbitrary bytes and single-byte corruptions never crash the decoder, never decode a
// payload above the limit, and only a valid header decodes as kOk.
TEST(WireTest, RandomInputNeverMisparses) {
  std::mt19937_64 rng(12345);
  uint8_t valid[kRequestHeaderSize];
  EncodeRequest(RequestHeader{FrameOp::kWrite, 9, 0x1000, 4096}, valid);
  for (int i = 0; i < 200000; ++i) {
    uint8_t buf[kRequestHeaderSize];
    size_t len = rng() % (kRequestHeaderSize + 1);
    if (i % 2) {
      for (auto& b : buf) b = static_cast<uint8_t>(rng());
    } else {
      memcpy(buf, valid, sizeof(buf));
      buf[rng() % kRequestHeaderSize] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    RequestHeader out;
    ParseResult r = DecodeRequest(buf, len, 1 << 20, &out);
    if (r == ParseResult::kOk) {
      EXPECT_EQ(len, kRequestHeaderSize);
      EXPECT_LE(out.length, 1u << 20);
      EXPECT_TRUE(out.op == FrameOp::kWrite || out.op == FrameOp::kRead);
    }
  }
}

}  // namespace
}  // namespace mooncake::te::tcp
