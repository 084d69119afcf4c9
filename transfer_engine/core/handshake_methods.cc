#include "transfer_engine/core/handshake_methods.h"

#include <nlohmann/json.hpp>

#include "transfer_engine/core/segment_descriptor.h"

namespace mooncake::te {

Status HandshakeMethods::Register(const std::string& method, Handler handler) {
  if (method.empty() || !handler) return InvalidArgument("a handshake method needs a name and a handler");
  std::lock_guard lock(mu_);
  if (!methods_.emplace(method, std::move(handler)).second) {
    return Status(ErrorCode::kAddressOverlapped, "handshake method '" + method + "' is already registered");
  }
  return Status::Ok();
}

StatusOr<std::string> HandshakeMethods::Handle(const std::string& body, const std::string& installed) const {
  auto j = nlohmann::json::parse(body, nullptr, false);
  auto method = JsonString(j, "method");
  auto payload = JsonString(j, "payload");
  if (!method || !payload) {
    return Status(ErrorCode::kMalformedJson, "a connection request needs string fields method and payload");
  }
  Handler handler;
  {
    std::lock_guard lock(mu_);
    auto it = methods_.find(*method);
    if (it != methods_.end()) handler = it->second;
  }
  if (!handler) {
    return Status(ErrorCode::kNotImplemented,
                  "this engine serves no handshake method '" + *method + "' (transports: " + installed + ")");
  }
  auto reply = handler(*payload);
  if (!reply.ok()) return reply.status();
  return nlohmann::json{{"payload", *reply}}.dump();
}

RpcFrame HandshakeMethods::Request(const std::string& method, const std::string& payload) {
  RpcFrame f;
  f.type = RpcType::kConnection;
  f.body = nlohmann::json{{"method", method}, {"payload", payload}}.dump();
  return f;
}

StatusOr<std::string> HandshakeMethods::ParseReply(const std::string& segment, const std::string& method,
                                                   const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (auto p = JsonString(j, "payload")) return *p;
  if (auto e = JsonString(j, "error")) {
    auto code = JsonInt(j, "code");
    bool missing = code && *code == static_cast<int>(ErrorCode::kNotImplemented);
    return Status(missing ? ErrorCode::kNotImplemented : ErrorCode::kRejectHandshake,
                  "segment '" + segment + "' refused '" + method + "': " + *e);
  }
  return Status(ErrorCode::kRejectHandshake, "segment '" + segment + "' answered '" + method +
                                                 "' with something that is not a reply: " + body.substr(0, 200));
}

}  // namespace mooncake::te
