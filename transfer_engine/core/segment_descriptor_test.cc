#include "transfer_engine/core/segment_descriptor.h"

#include <gtest/gtest.h>

namespace mooncake::te {
namespace {

TEST(SegmentDescriptorTest, RoundTripKeepsTransportFields) {
  SegmentDescriptor d;
  d.name = "node:1";
  d.protocol = "tcp";
  d.json = {{"tcp_data_port", 1234}};
  d.buffers = {{"cpu:0", 0x1000, 4096}, {"*", 0x10000, 1 << 20}};
  auto parsed = SegmentDescriptor::Parse(d.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->name, "node:1");
  EXPECT_EQ(parsed->json["tcp_data_port"], 1234);
  ASSERT_EQ(parsed->buffers.size(), 2u);
  EXPECT_EQ(parsed->buffers[1].addr, 0x10000u);
  EXPECT_NE(parsed->FindBuffer(0x10000 + 100, 100), nullptr);
  EXPECT_EQ(parsed->FindBuffer(0x1000 + 4000, 200), nullptr);
  EXPECT_EQ(parsed->FindBuffer(UINT64_MAX, 2), nullptr);
}

TEST(SegmentDescriptorTest, RejectsCorruptDocuments) {
  for (const char* bad : {"", "[]", "not json", "{\"protocol\":\"tcp\"}", "{\"name\":\"\",\"protocol\":\"tcp\"}",
                          "{\"name\":\"a\"}", "{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":{}}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":[{\"name\":\"x\",\"addr\":0,\"length\":1}]}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":[{\"name\":\"x\",\"addr\":1,\"length\":0}]}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":[{\"name\":\"\",\"addr\":1,\"length\":1}]}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":[{\"name\":\"x\",\"addr\":-1,\"length\":1}]}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"instance\":7}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"pid\":\"12\"}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"epoch\":[1]}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"host_id\":null}"}) {
    auto d = SegmentDescriptor::Parse(bad);
    EXPECT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), ErrorCode::kMalformedJson) << bad;
  }
}

}  // namespace
}  // namespace mooncake::te
