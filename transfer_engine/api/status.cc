#include "transfer_engine/api/status.h"
#include "transfer_engine/api/types.h"

namespace mooncake::te {

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "OK";
    case ErrorCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case ErrorCode::kTooManyRequests: return "TOO_MANY_REQUESTS";
    case ErrorCode::kAddressNotRegistered: return "ADDRESS_NOT_REGISTERED";
    case ErrorCode::kBatchBusy: return "BATCH_BUSY";
    case ErrorCode::kDeviceNotFound: return "DEVICE_NOT_FOUND";
    case ErrorCode::kAddressOverlapped: return "ADDRESS_OVERLAPPED";
    case ErrorCode::kDns: return "DNS";
    case ErrorCode::kSocket: return "SOCKET";
    case ErrorCode::kMalformedJson: return "MALFORMED_JSON";
    case ErrorCode::kRejectHandshake: return "REJECT_HANDSHAKE";
    case ErrorCode::kMetadata: return "METADATA";
    case ErrorCode::kEndpoint: return "ENDPOINT";
    case ErrorCode::kContext: return "CONTEXT";
    case ErrorCode::kNuma: return "NUMA";
    case ErrorCode::kClock: return "CLOCK";
    case ErrorCode::kMemory: return "MEMORY";
    case ErrorCode::kNotImplemented: return "NOT_IMPLEMENTED";
    case ErrorCode::kTimeout: return "TIMEOUT";
    case ErrorCode::kNotFound: return "NOT_FOUND";
    case ErrorCode::kPeerUnreachable: return "PEER_UNREACHABLE";
    case ErrorCode::kRemoteRejected: return "REMOTE_REJECTED";
    case ErrorCode::kStaleMetadata: return "STALE_METADATA";
  }
  return "UNKNOWN";
}

const char* TransferStateName(TransferState s) {
  switch (s) {
    case TransferState::kWaiting: return "WAITING";
    case TransferState::kPending: return "PENDING";
    case TransferState::kInvalid: return "INVALID";
    case TransferState::kCanceled: return "CANCELED";
    case TransferState::kCompleted: return "COMPLETED";
    case TransferState::kTimeout: return "TIMEOUT";
    case TransferState::kFailed: return "FAILED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  std::string s = ErrorCodeName(code_);
  s += "(" + std::to_string(static_cast<int>(code_)) + ")";
  if (!message_.empty()) s += ": " + message_;
  return s;
}

}  // namespace mooncake::te
