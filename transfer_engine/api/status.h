#ifndef MOONCAKE_TRANSFER_ENGINE_API_STATUS_H_
#define MOONCAKE_TRANSFER_ENGINE_API_STATUS_H_

#include <optional>
#include <string>
#include <utility>

namespace mooncake::te {

/// Error codes, numerically identical to Mooncake's (`include/error.h`), so integer results seen by
/// Python and C callers match.
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = -1,
  kTooManyRequests = -2,
  kAddressNotRegistered = -3,
  kBatchBusy = -4,
  kDeviceNotFound = -6,
  kAddressOverlapped = -7,
  kDns = -101,
  kSocket = -102,
  kMalformedJson = -103,
  kRejectHandshake = -104,
  kMetadata = -200,
  kEndpoint = -201,
  kContext = -202,
  kNuma = -300,
  kClock = -301,
  kMemory = -302,
  kNotImplemented = -303,
  // Not in Mooncake's table: distinct codes for conditions it folds into -1.
  kTimeout = -400,
  kNotFound = -401,
  kPeerUnreachable = -402,
  kRemoteRejected = -403,
  kStaleMetadata = -404,  ///< the target changed its registrations since its descriptor was fetched: refresh
};

const char* ErrorCodeName(ErrorCode code);

/// Result of an operation: a code and, on error, a message meant for a human (what failed and why).
/// Cheap to copy when ok. Thread-compatible.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  int raw_code() const { return static_cast<int>(code_); }
  const std::string& message() const { return message_; }
  /// "CODE_NAME(-n): message".
  std::string ToString() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status(ErrorCode::kInvalidArgument, std::move(m)); }
inline Status NotFound(std::string m) { return Status(ErrorCode::kNotFound, std::move(m)); }

/// A value or an error Status. Accessing value() of an error is a programming error (asserts).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace mooncake::te

#define MC_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::mooncake::te::Status _st = (expr);     \
    if (!_st.ok()) return _st;               \
  } while (0)

#endif  // MOONCAKE_TRANSFER_ENGINE_API_STATUS_H_
