#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_TRANSPORT_SET_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_TRANSPORT_SET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"
#include "transfer_engine/core/memory_registry.h"
#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te {

/// The transports one engine installed, and the rules that choose among them. The engine core goes through this
/// class for everything transport-related and never names a transport.
///
/// Threading: Install, Start and Stop from the engine's owner; everything else from any thread (the set does
/// not change between Start and Stop).
class TransportSet {
 public:
  /// Installs, from the registry's plugins: the transport serving `protocol` (it must be usable and configure
  /// cleanly, else the error carries its reason; empty: no preference), then every other usable one, all
  /// restricted to `only` when not empty. A plugin's exclusive variable (MC_FORCE_TCP) being set overrides
  /// both: that transport alone, as the preferred one.
  Status Install(const std::string& protocol, const std::vector<std::string>& only,
                 const std::map<std::string, std::string>& options);
  /// Starts every transport with `ctx` (each with its own options); an error names the transport.
  Status Start(TransportContext ctx, const std::map<std::string, std::string>& options);
  void Stop();

  /// The protocol string the engine publishes (the preferred transport's, else the first transport's name).
  const std::string& protocol() const { return protocol_; }
  /// The first address a transport wants advertised ("" when none does).
  std::string advertised_address() const;

  /// The best transport for moving `local` memory to/from a buffer of kind `remote` in segment `desc`:
  /// same-host-only transports first (by priority), then the preferred one, then other network transports by
  /// priority; only those that reach the peer, move this pair of kinds and did not decline the local region,
  /// minus those whose bit (see Bit) is in `exclude`. Null when none.
  Transport* Select(const SegmentDescriptor& desc, const MemoryRegion& local, MemoryKind remote,
                    uint64_t exclude = 0) const;
  /// A transport's bit in an `exclude` mask (0 beyond 64 transports).
  uint64_t Bit(const Transport* t) const;
  size_t size() const { return transports_.size(); }
  /// The transport serving the preferred protocol, or null when there is none.
  Transport* preferred() const { return preferred_.empty() ? nullptr : transports_.front().get(); }

  /// Asks every transport for its part of the registration (filled into region.transports); on a veto, the
  /// transports already asked are told to unregister and the veto is returned, naming the transport.
  Status Register(MemoryRegion& region);
  /// The region stopped accepting transfers / is gone (only transports that took part are told).
  void Withdraw(const MemoryRegion& region);
  void Unregister(const MemoryRegion& region);

  void Describe(nlohmann::json& descriptor) const;
  void ForgetPeer(const std::string& segment_name);
  /// Offers a descriptor the parser refused to each transport in turn (see Transport::CompleteForeignDescriptor).
  bool CompleteForeignDescriptor(const std::string& segment_name, nlohmann::json& descriptor) const;
  /// Per transport: its Stats() under its name; its ListenerStats() under listeners[name] when it has one.
  void AddStats(nlohmann::json& out) const;
  /// "tcp+shm"
  std::string Names() const;
  std::vector<std::string> List() const;

 private:
  std::vector<std::unique_ptr<Transport>> transports_;  // the preferred one first
  std::string preferred_;                                // its name ("" without a preference)
  std::string protocol_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_TRANSPORT_SET_H_
