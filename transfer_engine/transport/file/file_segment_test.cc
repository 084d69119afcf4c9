#include "transfer_engine/transport/file/file_segment.h"

#include <gtest/gtest.h>

#include "transfer_engine/transport/file/testing/memory_metadata.h"

namespace mooncake::te::file {
namespace {

TEST(FileSegment, DescriptorParsesBackIntoFileBuffers) {
  auto text = BuildFileSegmentDescriptor("nvmeof/s", {{"/a", 4096, {{"h1", "/mnt/a"}}}, {"/b", 100, {}}});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto d = SegmentDescriptor::Parse(*text);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->protocol, "nvmeof");
  ASSERT_EQ(d->buffers.size(), 2u);
  auto a = ParseFileBuffer(d->buffers[0]);
  auto b = ParseFileBuffer(d->buffers[1]);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->addr, kFileSegmentBase);
  EXPECT_EQ(b->addr, kFileSegmentBase + 4096);
  EXPECT_EQ(LocalPath(*a, {"h0", "h1"}), "/mnt/a");
  EXPECT_EQ(LocalPath(*a, {"h2"}), "/a");
  EXPECT_EQ(LocalPath(*b, {"h1"}), "/b");
}

TEST(FileSegment, BadInputIsRefused) {
  EXPECT_EQ(BuildFileSegmentDescriptor("", {{"/a", 1, {}}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(BuildFileSegmentDescriptor("s", {}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(BuildFileSegmentDescriptor("s", {{"", 1, {}}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(BuildFileSegmentDescriptor("s", {{"/nonexistent/file", 0, {}}}).status().code(),
            ErrorCode::kInvalidArgument);
  BufferDescriptor mem{"cpu:0", 4096, 4096, nlohmann::json::object()};
  EXPECT_FALSE(IsFileBuffer(mem));
  EXPECT_EQ(ParseFileBuffer(mem).status().code(), ErrorCode::kMalformedJson);
  BufferDescriptor wraps{"file", 4096, 4096, {{"file_path", "/a"}, {"offset", UINT64_MAX - 10}}};
  EXPECT_EQ(ParseFileBuffer(wraps).status().code(), ErrorCode::kMalformedJson);
  BufferDescriptor map{"file", 4096, 4096, {{"file_path", "/a"}, {"local_path_map", {{"h", 1}}}}};
  EXPECT_EQ(ParseFileBuffer(map).status().code(), ErrorCode::kMalformedJson);
  BufferDescriptor nopath{"file", 4096, 4096, {{"file_path", 5}}};
  EXPECT_EQ(ParseFileBuffer(nopath).status().code(), ErrorCode::kMalformedJson);
}

TEST(FileSegment, PublishesUnderMooncakesKey) {
  auto b = PublishFileSegment("memkv://publish_test", "nvmeof/p", {{"/a", 4096, {}}});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto v = testing::MemoryMetadataGet("publish_test", "mooncake/nvmeof/p");
  ASSERT_TRUE(v.has_value());
  EXPECT_NE(v->find("\"file_path\":\"/a\""), std::string::npos) << *v;
  EXPECT_EQ(PublishFileSegment("P2PHANDSHAKE", "nvmeof/p", {{"/a", 4096, {}}}).status().code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace mooncake::te::file
