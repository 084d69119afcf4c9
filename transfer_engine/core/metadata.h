#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_METADATA_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_METADATA_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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

  /// Decides whether the engine whose RPC address `owner` is published under a name we claim is provably
  /// gone: ok (the name is taken over) or the error that leaves the name to it.
  using OwnerCheck = std::function<Status(const net::HostPort& owner)>;

  virtual Status PublishSegment(const std::string& name, const std::string& descriptor_json) = 0;
  /// Publishes our RPC address under `name`, which claims the name. When another engine's address is already
  /// published there, `owner_gone` decides: the stale entry is replaced, or the claim fails with its error
  /// and nothing another engine published is touched.
  virtual Status PublishRpcAddress(const std::string& name, const net::HostPort& rpc,
                                   const OwnerCheck& owner_gone) = 0;
  /// Removes what this backend itself published for `name` (best effort; keys it never wrote, or that
  /// another engine holds by now, are left alone).
  virtual Status Unpublish(const std::string& name) = 0;

  /// The descriptor JSON of a segment; kNotFound when nothing is published under that name.
  virtual StatusOr<std::string> FetchSegment(const std::string& name) = 0;
  virtual StatusOr<net::HostPort> ResolveRpcAddress(const std::string& name) = 0;
};

/// A flat key-value service (HTTP, etcd, Redis ...). KeyValueMetadataBackend maps the metadata operations
/// onto Mooncake's key layout on top of it.
///
/// Keys written with Put, Create, Adopt or PutGuarded are this store's own: it keeps them alive (lease, TTL,
/// re-publication after a server restart) until DeleteIfValue removes them or the store is destroyed, and
/// never writes one back over a value another engine put there meanwhile. A guarded key (PutGuarded) is kept
/// only while its guard is: the store writes guards back before the keys they guard, and when it finds a
/// guard taken by another engine it drops the guard and every key it guards (Owns() then says false).
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual StatusOr<std::string> Get(const std::string& key) = 0;  ///< kNotFound when absent
  virtual Status Put(const std::string& key, const std::string& value) = 0;
  /// Writes the key only if it does not exist: true when written, false when it exists (left untouched).
  /// Atomic on etcd, Redis and our HTTP server; on other HTTP servers as far as they refuse to replace
  /// rpc_meta keys.
  virtual StatusOr<bool> Create(const std::string& key, const std::string& value) = 0;
  /// Makes an existing key that holds `value` this store's own (bound to its lease / TTL / re-publication),
  /// as Create would have: true when adopted, false when the key holds something else or nothing by now.
  virtual StatusOr<bool> Adopt(const std::string& key, const std::string& value) = 0;
  /// Writes `key` only while `guard` holds `guard_value`: true when written, false when the guard holds
  /// something else or nothing (`key` left untouched). Atomic on etcd and Redis; a read then a write on HTTP.
  virtual StatusOr<bool> PutGuarded(const std::string& key, const std::string& value, const std::string& guard,
                                    const std::string& guard_value) = 0;
  /// Deletes the key only while it holds `value` (ok when absent or different), and stops keeping it. Atomic
  /// on etcd, Redis and our HTTP server; a read then a delete on other HTTP servers.
  virtual Status DeleteIfValue(const std::string& key, const std::string& value) = 0;
  /// Whether the store still keeps `key` as its own (false once it found the key, or its guard, taken).
  virtual bool Owns(const std::string& key) = 0;
};

/// Keys: `mooncake/[<cluster>/]ram/<segment>` (descriptor) and `mooncake/[<cluster>/]rpc_meta/<segment>`
/// (`{"ip_or_host_name", "rpc_port"}`), as in reference §1.5; <cluster> is MC_METADATA_CLUSTER_ID.
///
/// The rpc_meta entry is the claim on a name: once claimed, the descriptor is written only while the claim
/// still holds our address (PutGuarded), so an engine that lost its name (to an engine that found it gone)
/// never overwrites the new owner's descriptor. On finding the name lost, or after Unpublish, every later
/// PublishSegment of that name fails with kMetadata.
class KeyValueMetadataBackend : public MetadataBackend {
 public:
  KeyValueMetadataBackend(std::unique_ptr<KeyValueStore> store, std::string cluster_id);

  Status PublishSegment(const std::string& name, const std::string& descriptor_json) override;
  Status PublishRpcAddress(const std::string& name, const net::HostPort& rpc, const OwnerCheck& owner_gone) override;
  Status Unpublish(const std::string& name) override;
  StatusOr<std::string> FetchSegment(const std::string& name) override;
  StatusOr<net::HostPort> ResolveRpcAddress(const std::string& name) override;

  std::string SegmentKey(const std::string& name) const;
  std::string RpcKey(const std::string& name) const;

  /// The RPC address in an rpc_meta value; kMalformedJson (naming `name`) when it is not one: not a JSON
  /// object with a string "ip_or_host_name" and an integer "rpc_port" in [1, 65535].
  static StatusOr<net::HostPort> ParseRpcValue(const std::string& name, const std::string& value);

 private:
  /// Stops publishing `name`: removes what we published there (where it still holds our values; the first
  /// error) and makes later PublishSegment calls fail with `why`. mu_ held.
  Status ReleaseLocked(const std::string& name, const std::string& why);

  std::unique_ptr<KeyValueStore> store_;
  std::string prefix_;
  // Held across each publishing operation (they are rare), so an Unpublish cannot interleave with a
  // PublishSegment of the same name. Guards published_ and released_.
  std::mutex mu_;
  std::map<std::string, std::string> published_;  // key -> the value we last wrote there
  std::map<std::string, std::string> released_;   // name -> why we no longer publish it
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
