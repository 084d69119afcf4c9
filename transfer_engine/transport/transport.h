#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TRANSPORT_H_

// Transport SDK v1: what a transport plugin implements and what the engine lends it. See README.md beside this
// file for how to add a transport.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"
#include "transfer_engine/common/config.h"
#include "transfer_engine/core/batch.h"
#include "transfer_engine/core/memory_registry.h"
#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/platform/platform.h"
#include "transfer_engine/transport/options.h"

namespace mooncake::te {

/// How a transport interprets TransferRequest::target_address.
enum class AddressMode : uint8_t {
  kVirtual = 0,  ///< an absolute virtual address inside a buffer the peer published (tcp, shm, rdma, efa)
  kOffset = 1,   ///< an offset into a device or file the buffer is a range of (cxl, nvmeof)
};

/// What a transport can do; the engine chooses among installed transports by asking these, never by name.
struct TransportCapabilities {
  bool remote_hosts = false;  ///< reaches segments on other hosts
  bool same_host = false;     ///< reaches segments of other processes on this host
  /// The (local memory, remote memory) pairs it moves; empty means {(host, host)}.
  std::vector<std::pair<MemoryType, MemoryType>> memory;
  /// Order of choice when several can do a request: same-host-only transports first (no network: the best
  /// path whenever they reach the peer), by priority; then the preferred protocol; then other network
  /// transports by priority.
  int priority = 0;
  AddressMode addressing = AddressMode::kVirtual;

  bool Moves(MemoryType local, MemoryType remote) const {
    if (memory.empty()) return local == MemoryType::kHost && remote == MemoryType::kHost;
    for (const auto& [l, r] : memory) {
      if (l == local && r == remote) return true;
    }
    return false;
  }
};

/// A transport's answer to a registration.
struct RegionRegistration {
  /// Merged into this region's entry of the descriptor's `buffers` (e.g. rdma `lkey[]`/`rkey[]`, shm `shm_fd`).
  nlohmann::json descriptor_fields = nlohmann::json::object();
  std::shared_ptr<TransportRegionState> state;  ///< may be null
  /// The transport will not move this region (a GPU-IPC transport given host memory): the registration
  /// still succeeds, and the engine never selects this transport for requests from or to it.
  bool declined = false;
  std::string why_declined;
};

/// Services the engine offers its transports (implemented by the engine; outlives the transports).
/// Thread-safe.
class TransportHost {
 public:
  /// Handles one request of a transport-defined method; returns the reply payload. Runs on the engine's RPC
  /// thread: it must be quick and must not call CallPeer. Requests may be repeated (a caller retries after a
  /// lost reply), so handlers must be idempotent.
  using MethodHandler = std::function<StatusOr<std::string>(const std::string& payload)>;

  virtual ~TransportHost() = default;
  /// Serves `method` ("<transport>.<name>", e.g. "rdma.connect") on the engine's RPC port. Called in Start.
  /// kAddressOverlapped when the method already exists.
  virtual Status RegisterMethod(const std::string& method, MethodHandler handler) = 0;
  /// Calls `method` on the engine serving segment `segment`: the reply payload, or the peer's error (its
  /// message kept; kNotImplemented when the peer does not serve the method). Bounded by the handshake
  /// timeout; a connection-oriented transport sends "<t>.connect" then "<t>.ready" once its end is up.
  virtual StatusOr<std::string> CallPeer(const std::string& segment, const std::string& method,
                                         const std::string& payload) = 0;
  /// Republishes this engine's descriptor (the transport's Describe output changed).
  virtual Status Republish() = 0;
};

/// What the engine lends a transport in Start. Pointers outlive the transport.
struct TransportContext {
  const EngineConfig* config = nullptr;  ///< engine-wide settings (timeouts, retry count, topology file)
  TransportOptions options;              ///< this transport's own settings (options map, then MC_* variables)
  MemoryRegistry* memory = nullptr;      ///< local registrations; the authority for what peers may touch
  PlatformRegistry* platforms = nullptr;
  TransportHost* host = nullptr;
  std::string local_segment_name;
  std::string advertised_ip;  ///< the address peers should use to reach this host
  std::string host_id;        ///< LocalHostId(): equal on peers that share this kernel and namespaces
  std::string instance;       ///< this engine's random id (the descriptor's "instance")
  std::string device_filter;  ///< comma-separated NIC allow-list (device_name, else MC_TE_FILTERS; empty: all)
  std::string protocol;       ///< the protocol the engine publishes in its descriptor (its preferred transport's)
};

/// A data path between registered memory of two engines. Implementations live in their own folder under
/// transport/ and register with MC_TRANSPORT_PLUGIN (plugin/plugin.h: linked in, or as a loadable .so).
///
/// Life cycle: Configure, Start, then any number of registrations and submissions from any thread, then Stop.
/// Completions are reported on the transport's own threads (or the caller's, in SubmitAndDrive).
class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string name() const = 0;
  virtual TransportCapabilities capabilities() const = 0;

  /// Reads this transport's settings before Start; an error fails the engine's initialisation when this
  /// transport was asked for explicitly, else the transport is skipped.
  virtual Status Configure(const TransportOptions& /*options*/) { return Status::Ok(); }
  /// The address this transport wants peers to use (e.g. its bind address); empty: no preference.
  virtual std::string advertised_address() const { return ""; }

  /// Starts listeners and threads, registers handshake methods. Called once, before anything below.
  virtual Status Start(const TransportContext& ctx) = 0;
  /// Stops threads and closes connections; slices still in flight complete with an error. Idempotent.
  virtual void Stop() = 0;

  // --- memory registration hooks (every registration after Start, in order) ---
  /// Called before a region becomes visible. An error fails the registration (and is undone in the
  /// transports already asked); `declined` keeps the registration but excludes this transport.
  virtual StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& /*region*/) {
    return RegionRegistration{};
  }
  /// The region no longer accepts new transfers (peers must stop touching it); transfers already running
  /// may still finish. Called before the engine waits for them.
  virtual void WithdrawRegion(const MemoryRegion& /*region*/) {}
  /// The region is gone and nothing uses it: release keys and handles.
  virtual void UnregisterRegion(const MemoryRegion& /*region*/) {}

  /// Adds this transport's fields (how peers reach it) to the local segment descriptor.
  virtual void Describe(nlohmann::json& descriptor) const = 0;
  /// Whether the segment described by `peer` is reachable through this transport.
  virtual bool CanReach(const SegmentDescriptor& peer) const = 0;
  /// A descriptor the engine's parser refused (kMalformedJson), e.g. one a foreign tool wrote in its own shape
  /// (Mooncake's nvmeof `register.py`: no `name`, buffers without `name`/`addr`). A transport whose protocol the
  /// document names may fill in what is missing and return true; the engine then parses it again. The document
  /// is untrusted: check every type, never throw. Called on the engine's caller threads, without engine locks.
  virtual bool CompleteForeignDescriptor(const std::string& /*segment_name*/, nlohmann::json& /*descriptor*/) const {
    return false;
  }

  /// Moves the slices to/from the peer. Every slice is completed exactly once (Slice::Complete / Fail), with
  /// an error when it could not be moved; a retriable error (SliceRetry) lets the engine move it again.
  virtual void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) = 0;

  /// As Submit, for a caller that will block until these slices are done: a transport may move them on the
  /// calling thread (no hand-off to its I/O threads, the lowest latency for small synchronous transfers).
  /// Returns with the slices completed, or still in flight if the transport fell back to Submit.
  virtual void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) {
    Submit(peer, slices);
  }

  /// Drops cached connections and mappings of a peer (e.g. after its descriptor changed).
  virtual void ForgetPeer(const std::string& /*segment_name*/) {}

  // --- managed memory (allocate_managed_buffer), asked of the preferred transport only ---
  /// Memory this transport wants transfers to target (cxl: a range carved from the shared device), not yet
  /// registered: the engine registers it. `device`: -1 the transport's default; >= 0 that device of its platform
  /// (a transport whose memory is not on a device refuses it: kInvalidArgument). kNotImplemented (the default):
  /// the engine's own (host) allocator serves.
  virtual StatusOr<void*> AllocateManaged(size_t /*length*/, int /*device*/) {
    return Status(ErrorCode::kNotImplemented, "no transport allocator");
  }
  /// Frees what AllocateManaged returned, after the engine unregistered it.
  virtual Status FreeManaged(void* /*addr*/, size_t /*length*/) {
    return Status(ErrorCode::kNotImplemented, "no transport allocator");
  }

  /// Preferred slice size for this transport.
  virtual size_t slice_size() const = 0;

  /// Per-path counters as JSON (bytes, slices, errors, state); empty object by default.
  virtual nlohmann::json Stats() const { return nlohmann::json::object(); }
  /// Counters of the transport's own listener (connections from peers), or null when it has none.
  virtual nlohmann::json ListenerStats() const { return nullptr; }
};

/// Whether a transport can run on this host, and why not.
struct TransportProbe {
  bool usable = true;
  std::string reason;
};

/// One transport plugin as the registry knows it: linked in (alwayslink) or loaded from a .so.
struct TransportPlugin {
  std::string name;                    ///< the transport's name
  std::vector<std::string> protocols;  ///< Mooncake protocol strings it serves ("rdma", "efa", ...)
  /// When this environment variable is true, this transport is the only one installed (MC_FORCE_TCP).
  std::string exclusive_env;
  std::function<TransportProbe()> probe;  ///< null: always usable
  std::function<std::unique_ptr<Transport>()> create;
  std::string origin = "builtin";  ///< "builtin" or the .so path it was loaded from
};

/// Process-wide registry of transport plugins. Thread-safe.
class TransportRegistry {
 public:
  static TransportRegistry& Get();
  /// kAddressOverlapped when a plugin of that name is already registered.
  Status Register(TransportPlugin plugin);
  /// The plugin serving `protocol` (its name or one of its protocols), or null.
  const TransportPlugin* FindByProtocol(const std::string& protocol) const;
  /// Registration order.
  std::vector<TransportPlugin> All() const;
  std::vector<std::string> Names() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<TransportPlugin>> plugins_;
};

struct TransportRegistrar {
  explicit TransportRegistrar(TransportPlugin plugin);
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TRANSPORT_H_
