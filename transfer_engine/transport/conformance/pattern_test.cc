#include "transfer_engine/transport/conformance/pattern.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace mooncake::te::conformance {
namespace {

TEST(PatternTest, AnyRangeMatchesTheWholeBuffersPattern) {
  std::vector<uint8_t> whole(4099);
  FillPattern(whole.data(), whole.size(), 3, 0);
  for (size_t off : {0, 1, 7, 8, 13, 4000}) {
    for (size_t len : {0, 1, 5, 8, 17, 99}) {
      std::vector<uint8_t> part(len);
      FillPattern(part.data(), len, 3, off);
      EXPECT_EQ(0, memcmp(part.data(), whole.data() + off, len)) << off << "+" << len;
      EXPECT_TRUE(MatchesPattern(whole.data() + off, len, 3, off));
      if (len) {
        EXPECT_EQ(PatternByte(3, off + len - 1), whole[off + len - 1]);
      }
    }
  }
}

TEST(PatternTest, WrongSeedOffsetOrByteDoesNotMatch) {
  std::vector<uint8_t> b(256);
  FillPattern(b.data(), b.size(), 11, 64);
  EXPECT_TRUE(MatchesPattern(b.data(), b.size(), 11, 64));
  EXPECT_FALSE(MatchesPattern(b.data(), b.size(), 12, 64));
  EXPECT_FALSE(MatchesPattern(b.data(), b.size(), 11, 65));
  b[100] ^= 1;
  EXPECT_FALSE(MatchesPattern(b.data(), b.size(), 11, 64));
}

TEST(PatternTest, DigestIsFnv1a64) {
  EXPECT_EQ(Digest(nullptr, 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(Digest("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_NE(Digest("ab", 2), Digest("ba", 2));
}

}  // namespace
}  // namespace mooncake::te::conformance
