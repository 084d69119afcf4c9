#include "transfer_engine/platform/cuda/cuda_ipc_handle.h"

#include <gtest/gtest.h>

#include <string>

namespace mooncake::te::cuda {
namespace {

TEST(CudaIpcHandleTest, LegacyRoundTrip) {
  CudaIpcHandle h;
  h.kind = CudaIpcHandle::Kind::kLegacy;
  h.pid = 4242;
  h.device = 3;
  h.offset = 4096 + 5;
  h.length = 1 << 20;
  for (size_t i = 0; i < h.legacy.size(); ++i) h.legacy[i] = static_cast<uint8_t>(i * 37 + 1);
  const std::string text = h.Encode();
  EXPECT_EQ(text.rfind("mc-cuda-ipc:v1:legacy:4242:3:4101:1048576:", 0), 0u) << text;
  auto back = CudaIpcHandle::Decode(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, CudaIpcHandle::Kind::kLegacy);
  EXPECT_EQ(back->pid, 4242);
  EXPECT_EQ(back->device, 3);
  EXPECT_EQ(back->offset, 4101u);
  EXPECT_EQ(back->length, 1u << 20);
  EXPECT_EQ(back->legacy, h.legacy);
}

TEST(CudaIpcHandleTest, PosixFdRoundTrip) {
  CudaIpcHandle h;
  h.kind = CudaIpcHandle::Kind::kPosixFd;
  h.pid = 7;
  h.device = 0;
  h.offset = 100;
  h.length = 200;
  h.fd = 12;
  h.allocation_size = 2 << 20;
  h.allocation_id = 18446744073709551615u;
  const std::string text = h.Encode();
  EXPECT_EQ(text, "mc-cuda-ipc:v1:fd:7:0:100:200:12:2097152:18446744073709551615");
  auto back = CudaIpcHandle::Decode(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, CudaIpcHandle::Kind::kPosixFd);
  EXPECT_EQ(back->fd, 12);
  EXPECT_EQ(back->allocation_size, 2u << 20);
  EXPECT_EQ(back->allocation_id, 18446744073709551615u);
  EXPECT_EQ(back->Encode(), text);
}

TEST(CudaIpcHandleTest, FabricRoundTripAndRangeCheck) {
  CudaIpcHandle h;
  h.kind = CudaIpcHandle::Kind::kFabric;
  h.pid = 77;
  h.device = 1;
  h.offset = 64;
  h.length = 4096;
  h.allocation_size = 2 << 20;
  for (size_t i = 0; i < h.legacy.size(); ++i) h.legacy[i] = static_cast<uint8_t>(255 - i);
  const std::string text = h.Encode();
  EXPECT_EQ(text.rfind("mc-cuda-ipc:v1:fabric:77:1:64:4096:2097152:", 0), 0u) << text;
  auto back = CudaIpcHandle::Decode(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, CudaIpcHandle::Kind::kFabric);
  EXPECT_EQ(back->allocation_size, 2u << 20);
  EXPECT_EQ(back->legacy, h.legacy);
  h.offset = (2 << 20) - 100;  // runs past the allocation
  EXPECT_EQ(CudaIpcHandle::Decode(h.Encode()).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(CudaIpcHandle::Decode(text.substr(0, text.size() - 2)).ok()) << "127 hex digits";
}

TEST(CudaIpcHandleTest, RejectsMalformed) {
  const std::string hex(128, 'a');
  for (const std::string& bad : std::initializer_list<std::string>{
           "", "mc-cuda-ipc:v1:", "mc-cuda-ipc:v2:fd:7:0:100:200:12:2097152:1", "mc-cuda-ipc:v1:vmm:7:0:1:2:3:4",
           "mc-cuda-ipc:v1:fd:7:0:100:200:12", "mc-cuda-ipc:v1:fd:7:0:100:200:12:2097152",
           "mc-cuda-ipc:v1:fd:7:0:100:200:12:2097152:x", "mc-cuda-ipc:v1:fd:7:0:100:200:12:2097152:1:2",
           "mc-cuda-ipc:v1:fd:0:0:100:200:12:2097152:1", "mc-cuda-ipc:v1:fd:7:0:100:0:12:2097152:1",
           "mc-cuda-ipc:v1:fd:7:0:100:200:12:250:1", "mc-cuda-ipc:v1:fd:7:x:100:200:12:2097152:1", "mc-cuda-ipc:v1:legacy:7:0:0:1:" + hex.substr(1),
           "mc-cuda-ipc:v1:legacy:7:0:0:1:" + hex.substr(1) + "g", "mc-cuda-ipc:v1:legacy:7:0:0:1:" + hex + ":1",
           "mc-cuda-ipc:v1:legacy:7:0:18446744073709551615:2:" + hex, "mc-host-emulation-ipc:v1:1:2:3:4:5:6"}) {
    auto r = CudaIpcHandle::Decode(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("not a cuda IPC handle"), std::string::npos) << r.status().ToString();
  }
  EXPECT_TRUE(CudaIpcHandle::Decode("mc-cuda-ipc:v1:legacy:7:0:0:1:" + hex).ok());
  EXPECT_TRUE(CudaIpcHandle::Decode("mc-cuda-ipc:v1:legacy:7:0:0:1:" + std::string(128, 'F')).ok());
}

}  // namespace
}  // namespace mooncake::te::cuda
