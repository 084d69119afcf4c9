#include "transfer_engine/core/managed_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

namespace mooncake::te {
namespace {

struct Recorder {
  std::set<void*> registered;
  ManagedMemory::RegisterFn reg() {
    return [this](void* a, size_t, int fd) {
      EXPECT_GE(fd, 0);
      registered.insert(a);
      return Status::Ok();
    };
  }
  ManagedMemory::UnregisterFn unreg() {
    return [this](void* a) { registered.erase(a); };
  }
};

TEST(ManagedMemoryTest, SizeClassesReuseAndAlignment) {
  Recorder rec;
  ManagedMemory m(rec.reg(), rec.unreg());
  auto a = m.Allocate(100);
  auto b = m.Allocate(8192);
  auto c = m.Allocate(3 << 20);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*c) % (4 << 20), reinterpret_cast<uintptr_t>(*c) % (4 << 20));
  memset(*c, 7, 3 << 20);  // usable
  EXPECT_EQ(rec.registered.size(), 1u);  // one slab so far
  ASSERT_TRUE(m.Free(*a, 100).ok());
  auto again = m.Allocate(5000);  // same 8 KiB class: reused
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
}

TEST(ManagedMemoryTest, LargeAllocationsGetTheirOwnRegistration) {
  Recorder rec;
  ManagedMemory m(rec.reg(), rec.unreg());
  auto big = m.Allocate(300 << 20);
  ASSERT_TRUE(big.ok());
  EXPECT_TRUE(rec.registered.count(*big));
  ASSERT_TRUE(m.Free(*big, 300 << 20).ok());
  EXPECT_FALSE(rec.registered.count(*big));
}

TEST(ManagedMemoryTest, BadFreesAreRejected) {
  Recorder rec;
  ManagedMemory m(rec.reg(), rec.unreg());
  auto a = m.Allocate(64 << 10);
  ASSERT_TRUE(a.ok());
  int local;
  EXPECT_EQ(m.Free(&local, 4).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(m.Free(*a, 1 << 20).code(), ErrorCode::kInvalidArgument);  // wrong size class
  EXPECT_TRUE(m.Free(*a, 64 << 10).ok());
  EXPECT_EQ(m.Free(*a, 64 << 10).code(), ErrorCode::kInvalidArgument);  // double free
  EXPECT_EQ(m.Allocate(0).status().code(), ErrorCode::kInvalidArgument);
}

TEST(ManagedMemoryTest, RegistrationFailureIsReported) {
  ManagedMemory m([](void*, size_t, int) { return Status(ErrorCode::kMemory, "no"); }, [](void*) {});
  EXPECT_EQ(m.Allocate(4096).status().code(), ErrorCode::kMemory);
}

}  // namespace
}  // namespace mooncake::te
