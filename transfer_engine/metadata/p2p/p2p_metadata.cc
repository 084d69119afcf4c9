// P2P handshake "backend" (connection string P2PHANDSHAKE): nothing is stored anywhere. Segment names are
// "host:rpc_port"; a peer's descriptor is fetched from the peer itself with a Metadata RPC.
#include <nlohmann/json.hpp>

#include "transfer_engine/core/metadata.h"
#include "transfer_engine/core/rpc.h"

namespace mooncake::te {
namespace {

class P2pMetadataBackend : public MetadataBackend {
 public:
  explicit P2pMetadataBackend(const EngineConfig& config) : config_(config) {}

  bool names_are_rpc_addresses() const override { return true; }
  Status PublishSegment(const std::string&, const std::string&) override { return Status::Ok(); }
  // Names are "host:<our bound RPC port>": the port makes them unique, there is nothing to claim.
  Status PublishRpcAddress(const std::string&, const net::HostPort&, const OwnerCheck&) override {
    return Status::Ok();
  }
  Status Unpublish(const std::string&) override { return Status::Ok(); }

  StatusOr<net::HostPort> ResolveRpcAddress(const std::string& name) override {
    auto hp = net::ParseHostPort(name);
    if (!hp.ok() || hp->port == 0) {
      return InvalidArgument("in P2PHANDSHAKE mode a segment name must be 'host:rpc_port', got '" + name + "'");
    }
    return hp;
  }

  StatusOr<std::string> FetchSegment(const std::string& name) override {
    auto rpc = ResolveRpcAddress(name);
    if (!rpc.ok()) return rpc.status();
    RpcFrame request;
    request.type = RpcType::kMetadata;
    request.body = nlohmann::json{{"segment_name", name}}.dump();
    auto reply = RpcCall(rpc->host, rpc->port, request, config_.handshake_connect_timeout,
                         config_.handshake_max_length);
    if (!reply.ok()) return reply.status();
    auto j = nlohmann::json::parse(reply->body, nullptr, false);
    if (j.is_object() && j.contains("error")) {
      return NotFound("peer " + name + " answered: " + j["error"].dump());
    }
    return reply->body;
  }

 private:
  const EngineConfig& config_;
};

StatusOr<std::unique_ptr<MetadataBackend>> CreateP2pBackend(const MetadataContext& ctx) {
  return std::unique_ptr<MetadataBackend>(new P2pMetadataBackend(*ctx.config));
}

}  // namespace

MC_REGISTER_METADATA_BACKEND("p2p", p2p, CreateP2pBackend);

}  // namespace mooncake::te
