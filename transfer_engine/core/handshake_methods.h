#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_HANDSHAKE_METHODS_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_HANDSHAKE_METHODS_H_

#include <mutex>
#include <string>
#include <unordered_map>

#include "transfer_engine/api/status.h"
#include "transfer_engine/core/rpc.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te {

/// The transports' handshake methods on the engine's RPC port (TransportHost::RegisterMethod / CallPeer).
/// Wire form: a kConnection frame whose body is {"method": "<transport>.<verb>", "payload": "<text>"}; the reply
/// body is {"payload": "<text>"}, or the RPC server's {"error": "...", "code": N}. Thread-safe.
class HandshakeMethods {
 public:
  using Handler = TransportHost::MethodHandler;

  /// kInvalidArgument for an empty name or handler, kAddressOverlapped when `method` exists.
  Status Register(const std::string& method, Handler handler);
  /// Answers one request body (any peer may send it: a malformed body is kMalformedJson, an unknown method
  /// kNotImplemented naming the `installed` transports).
  StatusOr<std::string> Handle(const std::string& body, const std::string& installed) const;

  static RpcFrame Request(const std::string& method, const std::string& payload);
  /// The payload of a reply from `segment`, or its error (kNotImplemented kept, else kRejectHandshake).
  static StatusOr<std::string> ParseReply(const std::string& segment, const std::string& method,
                                          const std::string& body);

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Handler> methods_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_HANDSHAKE_METHODS_H_
