#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_WIRE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_WIRE_H_

#include <cstddef>
#include <cstdint>

namespace mooncake::te::tcp {

/// Data-connection framing (little-endian):
///   request  (32 B): magic "MCTE" | version u8 | op u8 | reserved u16 | seq u64 | addr u64 | length u64
///                    followed by `length` payload bytes for a WRITE.
///   response (24 B): magic "MCTR" | version u8 | status u8 | reserved u16 | seq u64 | length u64
///                    followed by `length` payload bytes for an accepted READ (length 0 otherwise).
/// Responses come in request order on each connection; `seq` must echo the request's.
inline constexpr uint32_t kRequestMagic = 0x4554434D;   // bytes 'M' 'C' 'T' 'E'
inline constexpr uint32_t kResponseMagic = 0x5254434D;  // bytes 'M' 'C' 'T' 'R'
inline constexpr uint8_t kWireVersion = 1;
inline constexpr size_t kRequestHeaderSize = 32;
inline constexpr size_t kResponseHeaderSize = 24;

enum class FrameOp : uint8_t { kWrite = 1, kRead = 2 };
/// A response's status. kAddressRejected: the range is not inside memory the target registered for remote access;
/// kDeviceCopyFailed: the range is registered device memory, but the target could not move it through its staging
/// (the device copy failed, or it has no staging pool); the initiator reports it as ErrorCode::kMemory.
enum class FrameStatus : uint8_t { kOk = 0, kAddressRejected = 1, kDeviceCopyFailed = 2 };

struct RequestHeader {
  FrameOp op = FrameOp::kWrite;
  uint64_t seq = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
};

struct ResponseHeader {
  FrameStatus status = FrameStatus::kOk;
  uint64_t seq = 0;
  uint64_t length = 0;
};

enum class ParseResult { kOk, kNeedMore, kBadMagic, kBadVersion, kBadOpcode, kBadStatus, kTooLarge };
const char* ParseResultName(ParseResult r);

void EncodeRequest(const RequestHeader& h, uint8_t out[kRequestHeaderSize]);
void EncodeResponse(const ResponseHeader& h, uint8_t out[kResponseHeaderSize]);

/// Decodes a header from the first `len` bytes of `data`. kNeedMore when len is short; any other error means
/// the stream is corrupt and the connection must be closed. `max_payload` bounds `length`.
ParseResult DecodeRequest(const uint8_t* data, size_t len, uint64_t max_payload, RequestHeader* out);
ParseResult DecodeResponse(const uint8_t* data, size_t len, uint64_t max_payload, ResponseHeader* out);

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_WIRE_H_
