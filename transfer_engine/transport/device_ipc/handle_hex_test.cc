// The shm_name codec of the device-IPC transports against untrusted text.
#include "transfer_engine/transport/device_ipc/handle_hex.h"

#include <gtest/gtest.h>

#include <string>

namespace mooncake::te::device_ipc {
namespace {

TEST(HandleHexTest, RoundTripsAndRefusesMalformedText) {
  std::string bytes("\x00\x01\xab\xff", 4);
  EXPECT_EQ(HandleToHex(bytes), "0001ABFF");
  auto back = HandleFromHex("0001abFF");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, bytes);
  for (const char* bad : {"", "0", "0G", "zz", "abc"}) {
    EXPECT_EQ(HandleFromHex(bad).status().code(), ErrorCode::kMalformedJson) << bad;
  }
  EXPECT_EQ(HandleFromHex(std::string(2 * kMaxHandleBytes + 2, 'A')).status().code(), ErrorCode::kMalformedJson);
  EXPECT_TRUE(HandleFromHex(std::string(2 * kMaxHandleBytes, 'A')).ok());
}

}  // namespace
}  // namespace mooncake::te::device_ipc
