#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_TESTING_ENGINE_PAIR_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_TESTING_ENGINE_PAIR_H_

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/platform.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::device_ipc::testing {

inline constexpr auto kTimeout = std::chrono::seconds(20);

/// A transport context on host "this-host" over `platforms` (null: none); pinned in place (ctx.config points
/// into it).
struct LocalContext {
  explicit LocalContext(PlatformRegistry* platforms) {
    ctx.config = &config;
    ctx.platforms = platforms;
    ctx.host_id = "this-host";
  }
  LocalContext(const LocalContext&) = delete;
  LocalContext& operator=(const LocalContext&) = delete;
  EngineConfig config;
  TransportContext ctx;
};

/// Options of an engine of this process on 127.0.0.1 with the P2P handshake and `protocol` preferred.
inline EngineOptions LocalEngineOptions(const std::string& protocol) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = protocol;
  return o;
}

/// The region [p, p+length) of kind `kind`, as the engine hands it to RegisterRegion.
inline MemoryRegion RegionOf(void* p, size_t length, MemoryKind kind) {
  MemoryRegion r;
  r.start = reinterpret_cast<uint64_t>(p);
  r.length = length;
  r.kind = kind;
  return r;
}

/// What one device-IPC transport's engine tests need.
struct EnginePairSpec {
  std::string transport;  ///< "nvlink_intra", "hip", "nvlink"
  MemoryType memory;      ///< the platform's device type (the registry's usable platform of it is used)
  AllocationKind kind;    ///< how the two buffers are allocated
  std::string protocol = "tcp";  ///< the engines' protocol
  std::map<std::string, std::string> options = {};  ///< EngineOptions::transport_options
};

/// Two engines of this process (a: initiator, b: target), each with one registered device buffer of kLen bytes
/// (local_ in a, remote_ in b), and a's handle of b's segment. Needs a usable platform of spec.memory in the
/// registry (the tests' BUILD env enables the host emulation). Not thread-safe (a gtest fixture).
class EnginePairTest : public ::testing::Test {
 protected:
  explicit EnginePairTest(EnginePairSpec spec) : spec_(std::move(spec)) {}
  void SetUp() override;
  void TearDown() override;

  /// One transfer of `len` bytes between local_+local_off and remote_+remote_off.
  Status Move(OpCode op, size_t local_off, size_t remote_off, size_t len);
  /// a's statistics of the transport for b's segment.
  nlohmann::json Carried();
  /// Bytes a moved over tcp.
  uint64_t TcpBytes();

  /// Writes and reads of the whole buffer and of odd offsets and lengths, all through one mapping, none over tcp.
  void CheckMovesThroughOneMapping();
  /// A buffer b registered, was written once through the transport, then unregistered: the next write into it
  /// fails with kAddressNotRegistered and never lands, while b's other buffer stays reachable.
  void CheckUnregisteredIsNeverWritten();

  static constexpr size_t kLen = 8 << 20;
  const EnginePairSpec spec_;
  std::shared_ptr<Platform> dev_;
  std::unique_ptr<TransferEngine> a_, b_;
  void* local_ = nullptr;
  void* remote_ = nullptr;
  SegmentHandle peer_{};
};

}  // namespace mooncake::te::device_ipc::testing

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_TESTING_ENGINE_PAIR_H_
