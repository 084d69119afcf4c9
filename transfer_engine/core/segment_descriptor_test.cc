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

TEST(SegmentDescriptorTest, FindsRunsOfBuffersBackToBack) {
  auto d = SegmentDescriptor::Parse(
      R"({"name":"s","protocol":"tcp","buffers":[{"name":"f","addr":8192,"length":4096},)"
      R"({"name":"f","addr":4096,"length":4096},{"name":"f","addr":16384,"length":4096},)"
      R"({"name":"g","addr":12288,"length":4096}]})");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto run = d->FindBufferRun(4096 + 100, 4096);  // registered out of order: found in address order
  ASSERT_EQ(run.size(), 2u);
  EXPECT_EQ(run[0]->addr, 4096u);
  EXPECT_EQ(run[1]->addr, 8192u);
  EXPECT_EQ(d->FindBufferRun(5000, 10).size(), 1u);
  EXPECT_TRUE(d->FindBufferRun(8192, 8192).empty()) << "another location next to it is not part of a run";
  EXPECT_TRUE(d->FindBufferRun(4096, 16384).empty());
  EXPECT_TRUE(d->FindBufferRun(20000, 1000).empty()) << "runs past the last buffer";
  EXPECT_TRUE(d->FindBufferRun(100, 10).empty());
  EXPECT_TRUE(d->FindBufferRun(UINT64_MAX - 1, 8).empty());
  EXPECT_TRUE(d->FindBufferRun(4096, 0).empty());
  // Overlapping buffers (a peer may publish anything): only buffers that start where the previous one ends
  // form a run, so the cuts always increase inside the range.
  auto o = SegmentDescriptor::Parse(
      R"({"name":"s","protocol":"tcp","buffers":[{"name":"f","addr":100,"length":100},)"
      R"({"name":"f","addr":50,"length":250},{"name":"f","addr":300,"length":100}]})");
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->FindBufferRun(150, 200).empty()) << "[100,200) is followed by no buffer starting at 200";
  auto x = SegmentDescriptor::Parse(
      R"({"name":"s","protocol":"tcp","buffers":[{"name":"f","addr":50,"length":250},)"
      R"({"name":"f","addr":100,"length":100},{"name":"f","addr":300,"length":100}]})");
  ASSERT_TRUE(x.ok());
  auto r = x->FindBufferRun(150, 200);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]->addr, 50u);
  EXPECT_EQ(r[1]->addr, 300u);
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
