#include "transfer_engine/core/segment_descriptor.h"

#include <gtest/gtest.h>

namespace mooncake::te {
namespace {

TEST(SegmentDescriptorTest, RoundTripKeepsTransportFields) {
  SegmentDescriptor d;
  d.name = "node:1";
  d.protocol = "toy";
  d.json = {{"toy_port", 1234}};
  d.buffers = {{"cpu:0", 0x1000, 4096, {{"toy_key", 9}}}, {"*", 0x10000, 1 << 20}};
  auto parsed = SegmentDescriptor::Parse(d.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->name, "node:1");
  EXPECT_EQ(parsed->json["toy_port"], 1234);
  EXPECT_EQ(JsonUint(parsed->buffers[0].json, "toy_key"), 9u);
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
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"pid_start\":[1]}",
                          "{\"name\":\"a\",\"protocol\":\"tcp\",\"host_id\":null}"}) {
    auto d = SegmentDescriptor::Parse(bad);
    EXPECT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), ErrorCode::kMalformedJson) << bad;
  }
}

TEST(SegmentDescriptorTest, TypedReadsNeverThrow) {
  nlohmann::json j = {{"u", 5}, {"neg", -3}, {"s", "x"}, {"arr", {1}}, {"big", UINT64_MAX}};
  EXPECT_EQ(JsonUint(j, "u"), 5u);
  EXPECT_EQ(JsonUint(j, "neg"), std::nullopt);
  EXPECT_EQ(JsonInt(j, "neg"), -3);
  EXPECT_EQ(JsonInt(j, "big"), std::nullopt);
  EXPECT_EQ(JsonString(j, "s"), "x");
  EXPECT_EQ(JsonString(j, "u"), std::nullopt);
  EXPECT_EQ(JsonUint(j, "arr"), std::nullopt);
  EXPECT_EQ(JsonUint(j, "missing"), std::nullopt);
  EXPECT_EQ(JsonUint(nlohmann::json::array(), "u"), std::nullopt);
}

}  // namespace
}  // namespace mooncake::te
