#include "transfer_engine/core/rpc.h"

#include <unistd.h>

#include <cstring>

namespace mooncake::te {
namespace {

Status WriteFrame(int fd, const RpcFrame& f, net::Clock::time_point deadline) {
  std::string buf = EncodeRpcFrame(f);
  return net::SendAll(fd, buf.data(), buf.size(), deadline);
}

StatusOr<RpcFrame> ReadFrame(int fd, size_t max_length, net::Clock::time_point deadline) {
  uint64_t len = 0;
  MC_RETURN_IF_ERROR(net::RecvAll(fd, &len, sizeof(len), deadline));
  if (len == 0 || len > max_length) {
    return Status(ErrorCode::kMalformedJson, "bad RPC frame length " + std::to_string(len) + " (max " +
                                                 std::to_string(max_length) + ", MC_HANDSHAKE_MAX_LENGTH)");
  }
  std::string buf(len, '\0');
  MC_RETURN_IF_ERROR(net::RecvAll(fd, buf.data(), len, deadline));
  return DecodeRpcFrame(buf);
}

}  // namespace

std::string EncodeRpcFrame(const RpcFrame& f) {
  uint64_t len = f.body.size() + 1;
  std::string buf(sizeof(len) + len, '\0');
  memcpy(buf.data(), &len, sizeof(len));
  buf[sizeof(len)] = static_cast<char>(f.type);
  memcpy(buf.data() + sizeof(len) + 1, f.body.data(), f.body.size());
  return buf;
}

RpcFrame DecodeRpcFrame(std::string_view payload) {
  RpcFrame f;
  uint8_t type = static_cast<uint8_t>(payload[0]);
  // Mooncake's oldest peers send an untyped frame: a first byte above 3 means "connection".
  f.type = type > 3 ? RpcType::kConnection : static_cast<RpcType>(type);
  f.body = std::string(type > 3 ? payload : payload.substr(1));
  return f;
}

StatusOr<RpcFrame> RpcCall(const std::string& host, uint16_t port, const RpcFrame& request,
                           std::chrono::milliseconds timeout, size_t max_length, bool* refused) {
  auto deadline = net::Clock::now() + timeout;
  std::string peer = net::HostPort{host, port}.ToString();
  auto fd = net::Connect(host, port, timeout, "", refused);
  if (!fd.ok()) return fd.status();
  Status st = WriteFrame(*fd, request, deadline);
  StatusOr<RpcFrame> reply = st.ok() ? ReadFrame(*fd, max_length, deadline) : StatusOr<RpcFrame>(st);
  close(*fd);
  if (!reply.ok()) {
    return Status(reply.status().code() == ErrorCode::kTimeout ? ErrorCode::kTimeout : ErrorCode::kPeerUnreachable,
                  "RPC to " + peer + ": " + reply.status().message());
  }
  return reply;
}

}  // namespace mooncake::te
