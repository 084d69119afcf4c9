#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"
#include "transfer_engine/common/config.h"
#include "transfer_engine/core/batch.h"
#include "transfer_engine/core/memory_registry.h"
#include "transfer_engine/core/segment_descriptor.h"

namespace mooncake::te {

/// What a transport can do; the engine chooses among installed transports by asking these, never by name.
struct TransportCapabilities {
  bool remote_hosts = false;   ///< reaches segments on other hosts
  bool same_host = false;      ///< reaches segments of other processes on this host
  bool host_memory = true;     ///< moves CPU memory
  bool device_memory = false;  ///< moves accelerator memory directly
  int priority = 0;            ///< higher wins when several can reach a segment
};

/// What the engine lends a transport. Outlives the transport.
struct TransportContext {
  const EngineConfig* config = nullptr;
  MemoryRegistry* memory = nullptr;  ///< local registrations; the authority for what peers may touch
  std::string local_segment_name;
  std::string advertised_ip;  ///< the address peers should use to reach this host
  std::string host_id;        ///< LocalHostId(): equal on peers that share this kernel and namespaces
  std::string instance;       ///< this engine's random id (the descriptor's "instance")
  std::string device_filter;  ///< comma-separated NIC allow-list (device_name, else MC_TE_FILTERS; empty: all)
};

/// A data path between registered memory of two engines. Implementations live in their own folder under
/// transport/ and register with MC_REGISTER_TRANSPORT.
///
/// Threading: every method may be called from any thread. Submit must not block on the network for long
/// (it may do a bounded connect); completions are reported on the transport's own threads.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string name() const = 0;
  virtual TransportCapabilities capabilities() const = 0;

  /// Starts listeners and threads. Called once, before anything else.
  virtual Status Start(const TransportContext& ctx) = 0;
  /// Stops threads and closes connections; slices still in flight complete with an error. Idempotent.
  virtual void Stop() = 0;

  /// Adds this transport's fields (how peers reach it) to the local segment descriptor.
  virtual void Describe(nlohmann::json& descriptor) const = 0;
  /// Whether the segment described by `peer` is reachable through this transport.
  virtual bool CanReach(const SegmentDescriptor& peer) const = 0;

  /// Moves the slices to/from the peer. Every slice is completed exactly once (Slice::Complete), with an
  /// error status when it could not be moved (unreachable peer, rejected address, timeout).
  virtual void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) = 0;

  /// As Submit, for a caller that will block until these slices are done: a transport may move them on the
  /// calling thread (no hand-off to its I/O threads, the lowest latency for small synchronous transfers).
  /// Returns with the slices completed, or still in flight if the transport fell back to Submit.
  virtual void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
    Submit(peer, slices);
  }

  /// Drops cached connections to a peer (e.g. after its descriptor changed). Default: nothing cached.
  virtual void ForgetPeer(const std::string& /*segment_name*/) {}

  /// Preferred slice size for this transport.
  virtual size_t slice_size() const = 0;

  /// Per-path counters as JSON (bytes, slices, errors, state); empty object by default.
  virtual nlohmann::json Stats() const { return nlohmann::json::object(); }
  /// Counters of the transport's own listener (connections from peers), or null when it has none.
  virtual nlohmann::json ListenerStats() const { return nullptr; }
};

using TransportFactory = std::function<std::unique_ptr<Transport>()>;

/// Process-wide registry of transport plugins, filled by static registrars (link with alwayslink).
class TransportRegistry {
 public:
  static TransportRegistry& Get();
  void Register(const std::string& name, TransportFactory factory);
  std::unique_ptr<Transport> Create(const std::string& name) const;
  std::vector<std::string> Names() const;

 private:
  std::vector<std::pair<std::string, TransportFactory>> factories_;
};

struct TransportRegistrar {
  TransportRegistrar(const std::string& name, TransportFactory factory) {
    TransportRegistry::Get().Register(name, std::move(factory));
  }
};

}  // namespace mooncake::te

#define MC_REGISTER_TRANSPORT(name, Type)                                         \
  static ::mooncake::te::TransportRegistrar mc_transport_registrar_##Type(name, [] { \
    return std::unique_ptr<::mooncake::te::Transport>(new Type());                \
  })

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TRANSPORT_H_
