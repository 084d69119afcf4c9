#ifndef MOONCAKE_TRANSFER_ENGINE_API_TYPES_H_
#define MOONCAKE_TRANSFER_ENGINE_API_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake::te {

using BatchId = uint64_t;        ///< 0 is never a valid batch.
using SegmentHandle = uint64_t;  ///< kLocalSegment is this engine's own segment.

inline constexpr BatchId kInvalidBatch = 0;
inline constexpr SegmentHandle kLocalSegment = 0;
inline constexpr SegmentHandle kInvalidSegment = UINT64_MAX;

enum class OpCode : uint8_t { kRead = 0, kWrite = 1 };

/// One request: move `length` bytes between local `source` (inside locally registered memory) and the
/// absolute virtual address `target_address` inside memory the target segment registered for remote access.
struct TransferRequest {
  OpCode opcode = OpCode::kWrite;
  void* source = nullptr;
  SegmentHandle target = kInvalidSegment;
  uint64_t target_address = 0;
  size_t length = 0;
};

enum class TransferState : uint8_t {
  kWaiting = 0,    ///< accepted, nothing sent yet
  kPending = 1,    ///< in flight
  kInvalid = 2,
  kCanceled = 3,
  kCompleted = 4,
  kTimeout = 5,
  kFailed = 6,
};

const char* TransferStateName(TransferState s);
inline bool IsTerminal(TransferState s) {
  return s == TransferState::kCompleted || s == TransferState::kFailed || s == TransferState::kTimeout ||
         s == TransferState::kCanceled || s == TransferState::kInvalid;
}

struct TransferStatus {
  TransferState state = TransferState::kWaiting;
  size_t transferred_bytes = 0;
};

/// One registered buffer of a segment, as published in its descriptor.
struct BufferInfo {
  std::string location;  ///< "cpu:0", "*", ...
  uint64_t addr = 0;
  uint64_t length = 0;
};

/// A message delivered to a peer engine's notification queue (see TransferEngine::GetNotifies).
struct Notification {
  std::string name;
  std::string message;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_API_TYPES_H_
