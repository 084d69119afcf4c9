#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_HANDLE_HEX_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_HANDLE_HEX_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "transfer_engine/api/status.h"

namespace mooncake::te::device_ipc {

/// The largest handle a peer's descriptor may carry (decoded bytes); a legacy CUDA IPC handle is 64 bytes.
inline constexpr size_t kMaxHandleBytes = 4096;

/// A platform IPC handle (opaque bytes) as Mooncake's `shm_name` field carries it: upper-case hex, two digits per byte.
std::string HandleToHex(std::string_view handle);
/// The bytes of `hex` (upper or lower case). kMalformedJson for an odd length, a non-hex digit, an empty text or
/// more than kMaxHandleBytes bytes: the field comes from another engine's descriptor.
StatusOr<std::string> HandleFromHex(std::string_view hex);

}  // namespace mooncake::te::device_ipc

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_HANDLE_HEX_H_
