#include "transfer_engine/transport/tcp/wire.h"

#include <cstring>

namespace mooncake::te::tcp {
namespace {

template <typename T>
void Put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

template <typename T>
T Get(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

}  // namespace

const char* ParseResultName(ParseResult r) {
  switch (r) {
    case ParseResult::kOk: return "ok";
    case ParseResult::kNeedMore: return "need more bytes";
    case ParseResult::kBadMagic: return "bad magic";
    case ParseResult::kBadVersion: return "unsupported wire version";
    case ParseResult::kBadOpcode: return "bad opcode";
    case ParseResult::kBadStatus: return "bad status";
    case ParseResult::kTooLarge: return "frame larger than the allowed maximum";
  }
  return "?";
}

void EncodeRequest(const RequestHeader& h, uint8_t out[kRequestHeaderSize]) {
  Put<uint32_t>(out, kRequestMagic);
  out[4] = kWireVersion;
  out[5] = static_cast<uint8_t>(h.op);
  Put<uint16_t>(out + 6, 0);
  Put<uint64_t>(out + 8, h.seq);
  Put<uint64_t>(out + 16, h.addr);
  Put<uint64_t>(out + 24, h.length);
}

void EncodeResponse(const ResponseHeader& h, uint8_t out[kResponseHeaderSize]) {
  Put<uint32_t>(out, kResponseMagic);
  out[4] = kWireVersion;
  out[5] = static_cast<uint8_t>(h.status);
  Put<uint16_t>(out + 6, 0);
  Put<uint64_t>(out + 8, h.seq);
  Put<uint64_t>(out + 16, h.length);
}

ParseResult DecodeRequest(const uint8_t* data, size_t len, uint64_t max_payload, RequestHeader* out) {
  // Check what is already there first, so garbage is rejected without waiting for a whole header.
  for (size_t i = 0; i < 4 && i < len; ++i) {
    if (data[i] != static_cast<uint8_t>(kRequestMagic >> (8 * i))) return ParseResult::kBadMagic;
  }
  if (len > 4 && data[4] != kWireVersion) return ParseResult::kBadVersion;
  if (len > 5 && data[5] != static_cast<uint8_t>(FrameOp::kWrite) && data[5] != static_cast<uint8_t>(FrameOp::kRead)) {
    return ParseResult::kBadOpcode;
  }
  if (len < kRequestHeaderSize) return ParseResult::kNeedMore;
  out->op = static_cast<FrameOp>(data[5]);
  out->seq = Get<uint64_t>(data + 8);
  out->addr = Get<uint64_t>(data + 16);
  out->length = Get<uint64_t>(data + 24);
  if (out->length > max_payload) return ParseResult::kTooLarge;
  return ParseResult::kOk;
}

ParseResult DecodeResponse(const uint8_t* data, size_t len, uint64_t max_payload, ResponseHeader* out) {
  for (size_t i = 0; i < 4 && i < len; ++i) {
    if (data[i] != static_cast<uint8_t>(kResponseMagic >> (8 * i))) return ParseResult::kBadMagic;
  }
  if (len > 4 && data[4] != kWireVersion) return ParseResult::kBadVersion;
  if (len > 5 && data[5] != static_cast<uint8_t>(FrameStatus::kOk) &&
      data[5] != static_cast<uint8_t>(FrameStatus::kAddressRejected) &&
      data[5] != static_cast<uint8_t>(FrameStatus::kDeviceCopyFailed)) {
    return ParseResult::kBadStatus;
  }
  if (len < kResponseHeaderSize) return ParseResult::kNeedMore;
  out->status = static_cast<FrameStatus>(data[5]);
  out->seq = Get<uint64_t>(data + 8);
  out->length = Get<uint64_t>(data + 16);
  if (out->length > max_payload) return ParseResult::kTooLarge;
  return ParseResult::kOk;
}

}  // namespace mooncake::te::tcp
