#include "transfer_engine/core/memory_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace mooncake::te {
namespace {

MemoryRegion Region(uint64_t addr, uint64_t length, const char* location, bool remote) {
  MemoryRegion m;
  m.start = addr;
  m.length = length;
  m.location = location;
  m.remote_accessible = remote;
  return m;
}

TEST(MemoryRegistryTest, RegisterFindUnregister) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Register(Region(0x10000, 0x1000, "cpu:0", true)).ok());
  EXPECT_NE(r.Find(0x10000, 0x1000, true), nullptr);
  EXPECT_NE(r.Find(0x10800, 0x800, true), nullptr);
  EXPECT_EQ(r.Find(0x10800, 0x801, true), nullptr);  // runs past the end
  EXPECT_EQ(r.Find(0xffff, 2, true), nullptr);       // starts before
  EXPECT_EQ(r.Find(0x11000, 1, true), nullptr);
  ASSERT_TRUE(r.Unregister(0x10000, std::chrono::milliseconds(10)).ok());
  EXPECT_EQ(r.Find(0x10000, 1, true), nullptr);
  EXPECT_EQ(r.Unregister(0x10000, std::chrono::milliseconds(10)).code(), ErrorCode::kAddressNotRegistered);
}

TEST(MemoryRegistryTest, RejectsBadRangesAndOverlaps) {
  MemoryRegistry r;
  EXPECT_EQ(r.Register(Region(0, 10, "*", true)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.Register(Region(0x1000, 0, "*", true)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.Register(Region(UINT64_MAX - 4, 10, "*", true)).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(r.Register(Region(0x2000, 0x1000, "*", true)).ok());
  EXPECT_EQ(r.Register(Region(0x2000, 0x1000, "*", true)).code(), ErrorCode::kAddressOverlapped);
  EXPECT_EQ(r.Register(Region(0x1800, 0x1000, "*", true)).code(), ErrorCode::kAddressOverlapped);
  EXPECT_EQ(r.Register(Region(0x2fff, 0x10, "*", true)).code(), ErrorCode::kAddressOverlapped);
  EXPECT_EQ(r.Register(Region(0x1000, 0x4000, "*", true)).code(), ErrorCode::kAddressOverlapped);
  EXPECT_TRUE(r.Register(Region(0x1000, 0x1000, "*", true)).ok());  // adjacent is fine
  EXPECT_TRUE(r.Register(Region(0x3000, 0x1000, "*", true)).ok());
  EXPECT_EQ(r.size(), 3u);
  auto list = r.List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].start, 0x2000u);  // registration order
  EXPECT_EQ(r.Find(0x2800, 0x1000, true), nullptr);  // spans two registrations
}

TEST(MemoryRegistryTest, LocalOnlyRegionsAreInvisibleToPeers) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Register(Region(0x5000, 0x100, "*", false)).ok());
  EXPECT_EQ(r.Find(0x5000, 0x10, /*remote=*/true), nullptr);
  EXPECT_NE(r.Find(0x5000, 0x10, /*remote=*/false), nullptr);
}

TEST(MemoryRegistryTest, UnregisterWaitsForPinnedTransfers) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Register(Region(0x9000, 0x100, "*", true)).ok());
  RegionPin pin = r.Find(0x9000, 0x10, true);
  ASSERT_NE(pin, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pin.reset();
  });
  ASSERT_TRUE(r.Unregister(0x9000, std::chrono::seconds(5)).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(40));
  releaser.join();
}

TEST(MemoryRegistryTest, WithdrawRunsBeforeTheDrainAndReturnsTheRegion) {
  MemoryRegistry r;
  MemoryRegion m = Region(0xa000, 0x100, "cpu:0", true);
  m.transports.push_back({"toy", {{"key", 7}}, nullptr, false, ""});
  ASSERT_TRUE(r.Register(m).ok());
  ASSERT_NE(r.Find(0xa000, 1, true)->transport("toy"), nullptr);
  EXPECT_EQ(r.Find(0xa000, 1, true)->transport("other"), nullptr);
  RegionPin pin = r.Find(0xa000, 0x10, true);
  bool withdrawn_while_pinned = false;
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    pin.reset();
    released = true;
  });
  MemoryRegion removed;
  ASSERT_TRUE(r.Unregister(0xa000, std::chrono::seconds(5),
                           [&](const MemoryRegion& g) {
                             withdrawn_while_pinned = !released && g.start == 0xa000;
                           },
                           &removed)
                  .ok());
  releaser.join();
  EXPECT_TRUE(withdrawn_while_pinned);
  EXPECT_EQ(removed.transports.at(0).descriptor_fields["key"], 7);
}

}  // namespace
}  // namespace mooncake::te
