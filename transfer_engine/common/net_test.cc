#include "transfer_engine/common/net.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace mooncake::te::net {
namespace {

// Which owner addresses count as this host (a refused connection to them proves nothing listens).
TEST(NetTest, IsThisHostTrustsLoopbackAndOwnInterfacesOnly) {
  EXPECT_TRUE(IsThisHost("127.0.0.1"));
  EXPECT_TRUE(IsThisHost("127.3.4.5"));
  EXPECT_TRUE(IsThisHost("::1"));
  EXPECT_TRUE(IsThisHost("localhost"));
  char self[256] = {0};
  ASSERT_EQ(gethostname(self, sizeof(self) - 1), 0);
  EXPECT_TRUE(IsThisHost(self));
  std::string lan = FirstLanIp();
  if (!lan.empty() && lan.rfind("127.", 0) != 0) {
    EXPECT_TRUE(IsThisHost(lan));
  }
  EXPECT_FALSE(IsThisHost("192.0.2.1"));  // TEST-NET-1: never an address of this host
  EXPECT_FALSE(IsThisHost("198.51.100.7"));
  EXPECT_FALSE(IsThisHost("0.0.0.0"));
  EXPECT_FALSE(IsThisHost(""));
  EXPECT_FALSE(IsThisHost("no-such-host.invalid"));
}

}  // namespace
}  // namespace mooncake::te::net
