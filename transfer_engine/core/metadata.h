#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_METADATA_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_METADATA_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/common/config.h"
#include "transfer_engine/common/net.h"

namespace mooncake::te {

/// Where segment descriptors and RPC addresses are published and found. Plugins (metadata/<name>/) register
/// a factory for their URI scheme with MC_REGISTER_METADATA_BACKEND.
///
/// Threading: all methods may be called concurrently.
class MetadataBackend {
 public:
  virtual ~MetadataBackend() = default;

  /// Whether segment names are themselves RPC addresses ("host:port"), as in P2P handshake mode.
  virtual bool names_are_rpc_addresses() const { return false; }

  virtual Status PublishSegment(const std::string& name, const std::string& descriptor_json) = 0;
  virtual Status PublishRpcAddress(const std::string& name, const net::HostPort& rpc) = 0;
  /// Removes everything published for `name` (best effort; missing keys are fine).
  virtual Status Unpublish(const std::string& name) = 0;

  /// The descriptor JSON of a segment; kNotFound when nothing is published under that name.
  virtual StatusOr<std::string> FetchSegment(const std::string& name) = 0;
  virtual StatusOr<net::HostPort> ResolveRpcAddress(const std::string& name) = 0;
};

/// A flat key-value service (HTTP, etcd, Redis ...). KeyValueMetadataBackend maps the metadata operations
/// onto Mooncake's key layout on top of it.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual StatusOr<std::string> Get(const std::string& key) = 0;  ///< kNotFound when absent
  virtual Status Put(const std::string& key, const std::string& value) = 0;
  virtual Status Delete(const std::string& key) = 0;  ///< ok when absent
};

/// Keys: `mooncake/[<cluster>/]ram/<segment>` (descriptor) and `mooncake/[<cluster>/]rpc_meta/<segment>`
/// (`{"ip_or_host_name", "rpc_port"}`), as in reference §1.5; <cluster> is MC_METADATA_CLUSTER_ID.
class KeyValueMetadataBackend : public MetadataBackend {
 public:
  KeyValueMetadataBackend(std::unique_ptr<KeyValueStore> store, std::string cluster_id);

  Status PublishSegment(const std::string& name, const std::string& descriptor_json) override;
  Status PublishRpcAddress(const std::string& name, const net::HostPort& rpc) override;
  Status Unpublish(const std::string& name) override;
  StatusOr<std::string> FetchSegment(const std::string& name) override;
  StatusOr<net::HostPort> ResolveRpcAddress(const std::string& name) override;

  std::string SegmentKey(const std::string& name) const;
  std::string RpcKey(const std::string& name) const;

 private:
  std::unique_ptr<KeyValueStore> store_;
  std::string prefix_;
};

/// What a backend factory receives.
struct MetadataContext {
  std::string uri;       ///< the whole connection string, e.g. "http://h:8080/metadata"
  std::string location;  ///< the part after "scheme://"
  const EngineConfig* config = nullptr;
};

using MetadataFactory = std::function<StatusOr<std::unique_ptr<MetadataBackend>>(const MetadataContext&)>;

/// Creates the backend for a connection string: "P2PHANDSHAKE", "scheme://rest", or (Mooncake's default
/// for a bare address) etcd. kMetadata with the list of built-in schemes when none matches.
StatusOr<std::unique_ptr<MetadataBackend>> CreateMetadataBackend(const std::string& conn,
                                                                  const EngineConfig& config);
void RegisterMetadataBackend(const std::string& scheme, MetadataFactory factory);
std::vector<std::string> MetadataBackendSchemes();

struct MetadataBackendRegistrar {
  MetadataBackendRegistrar(const std::string& scheme, MetadataFactory factory) {
    RegisterMetadataBackend(scheme, std::move(factory));
  }
};

}  // namespace mooncake::te

#define MC_REGISTER_METADATA_BACKEND(scheme, var, factory) \
  static ::mooncake::te::MetadataBackendRegistrar mc_metadata_registrar_##var(scheme, factory)

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_METADATA_H_
