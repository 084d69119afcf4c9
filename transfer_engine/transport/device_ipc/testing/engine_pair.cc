#include "transfer_engine/transport/device_ipc/testing/engine_pair.h"

#include <cstring>

namespace mooncake::te::device_ipc::testing {

void EnginePairTest::SetUp() {
  dev_ = PlatformRegistry::Get().ForType(spec_.memory);
  ASSERT_NE(dev_, nullptr) << "no usable " << MemoryTypeName(spec_.memory) << " platform (emulation off?)";
  EngineOptions o = LocalEngineOptions(spec_.protocol);
  o.transport_options = spec_.options;
  auto a = TransferEngine::Create(o);
  auto b = TransferEngine::Create(o);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  a_ = std::move(*a);
  b_ = std::move(*b);
  for (void** p : {&local_, &remote_}) {
    auto m = dev_->Allocate(kLen, spec_.kind, 0);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    *p = *m;
  }
  ASSERT_TRUE(a_->RegisterMemory(local_, kLen).ok());
  ASSERT_TRUE(b_->RegisterMemory(remote_, kLen).ok());
  auto h = a_->OpenSegment(b_->segment_name());
  ASSERT_TRUE(h.ok());
  peer_ = *h;
}

void EnginePairTest::TearDown() {
  a_.reset();
  b_.reset();
  for (void* p : {local_, remote_}) {
    if (p) {
      EXPECT_TRUE(dev_->Free(p, kLen, spec_.kind).ok());
    }
  }
}

Status EnginePairTest::Move(OpCode op, size_t local_off, size_t remote_off, size_t len) {
  TransferRequest r{op, static_cast<char*>(local_) + local_off, peer_, reinterpret_cast<uint64_t>(remote_) + remote_off,
                    len};
  return a_->TransferSync({r}, kTimeout);
}

nlohmann::json EnginePairTest::Carried() {
  auto j = nlohmann::json::parse(a_->StatsJson());
  return j[spec_.transport][b_->segment_name()];
}

uint64_t EnginePairTest::TcpBytes() {
  auto stats = nlohmann::json::parse(a_->StatsJson());
  uint64_t tcp = 0;
  if (stats.contains("tcp")) {
    for (const auto& [path, k] : stats["tcp"].items()) tcp += k.value("bytes", uint64_t{0});
  }
  return tcp;
}

void EnginePairTest::CheckMovesThroughOneMapping() {
  auto* src = static_cast<unsigned char*>(local_);
  auto* dst = static_cast<unsigned char*>(remote_);
  for (size_t i = 0; i < kLen; ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, kLen).ok());
  EXPECT_EQ(0, memcmp(src, dst, kLen));
  ASSERT_TRUE(Move(OpCode::kWrite, 3, 4099, 1000001).ok());  // odd offsets and length
  EXPECT_EQ(0, memcmp(src + 3, dst + 4099, 1000001));
  for (size_t i = 0; i < kLen; ++i) dst[i] = static_cast<unsigned char>(i * 13 + 1);
  ASSERT_TRUE(Move(OpCode::kRead, 0, 0, kLen).ok());
  EXPECT_EQ(0, memcmp(src, dst, kLen));
  nlohmann::json c = Carried();
  EXPECT_GE(c["bytes"].get<uint64_t>(), 2 * kLen + 1000001) << c.dump();
  EXPECT_EQ(c["imports"], 1u) << "the peer buffer is mapped once: " << c.dump();
  EXPECT_EQ(c["mapped"], 1u);
  EXPECT_EQ(TcpBytes(), 0u) << "device memory went over tcp";
}

void EnginePairTest::CheckUnregisteredIsNeverWritten() {
  constexpr size_t kExtra = 1 << 20;
  auto extra = dev_->Allocate(kExtra, spec_.kind, 0);
  ASSERT_TRUE(extra.ok());
  ASSERT_TRUE(b_->RegisterMemory(*extra, kExtra).ok());
  a_->InvalidateSegment(b_->segment_name());  // a's next transfer fetches b's descriptor with `extra` in it
  memset(local_, 'w', 4096);
  TransferRequest r{OpCode::kWrite, local_, peer_, reinterpret_cast<uint64_t>(*extra), 4096};
  ASSERT_TRUE(a_->TransferSync({r}, kTimeout).ok());
  EXPECT_EQ(static_cast<char*>(*extra)[4095], 'w');
  ASSERT_TRUE(b_->UnregisterMemory(*extra).ok());  // a's cached descriptor still lists it; its mapping is cached
  memset(*extra, 0, 4096);
  memset(local_, 'z', 4096);
  Status st = a_->TransferSync({r}, kTimeout);
  EXPECT_EQ(st.code(), ErrorCode::kAddressNotRegistered) << st.ToString();
  EXPECT_EQ(static_cast<char*>(*extra)[0], 0) << "a write landed in memory the target had unregistered";
  ASSERT_TRUE(Move(OpCode::kWrite, 0, 0, 4096).ok());  // the rest of b is still reachable
  EXPECT_EQ(static_cast<char*>(remote_)[0], 'z');
  EXPECT_TRUE(dev_->Free(*extra, kExtra, spec_.kind).ok());
}

}  // namespace mooncake::te::device_ipc::testing
