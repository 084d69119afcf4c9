#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_DESCRIPTOR_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_DESCRIPTOR_H_

// The efa transport's fields of a segment descriptor, in Mooncake's shape: `devices: [{name, lid: 0, gid}]`
// (gid: hex of the endpoint address, one entry per NIC) and per buffer `rkey: [..]` / `lkey: [..]`, one 64-bit
// key per device. Every engine writes that shape as `efa_devices`, `efa_rkey`, `efa_lkey` (what older engines
// of this project wrote too); one whose published protocol is "efa" also writes it under Mooncake's names, as
// Mooncake's EFA engines do (an rdma transport of the same engine may overwrite those; the efa_ names stay).
// Readers take `efa_*` where present, else Mooncake's names in a descriptor whose protocol is "efa".
//
// This engine's extras, all optional for a reader (a Mooncake peer has none of them): `provider` in each
// device (absent: "efa"); `efa_virt_addr` (absent: virtual addressing, as EFA has); the registration epoch
// `efa_epoch`, `efa_epoch_addr`, `efa_epoch_rkey` (one key per device; a single number, as older engines of
// this project wrote, is device 0's), with `efa_epoch_lease_us` (absent: 0, read the epoch before every
// submission; see EfaConfig::epoch_lease_us); and for a buffer registered in chunks (larger than one registration
// may be), `efa_mr_chunk` (bytes per chunk) and `efa_chunk_rkeys: [[key per chunk] per device]`, whose first
// column equals `rkey`.
//
// Every field is untrusted: the readers check types, counts and sizes and never throw.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/status.h"
#include "transfer_engine/core/segment_descriptor.h"

namespace mooncake::te::efa {

/// A peer's (or this engine's) NIC as the descriptor lists it.
struct FabricDevice {
  std::string name;      ///< libfabric domain name ("rdmap0s31-rdm", "e1a", "lo")
  std::string gid;       ///< hex of fi_getname
  std::string provider;  ///< "efa", "tcp;ofi_rxm", ...
};

/// What this transport reads of a peer's descriptor (top level).
struct PeerFabric {
  std::vector<FabricDevice> devices;
  bool mooncake_names = false;  ///< read from devices/rkey/lkey (else efa_devices/efa_rkey/efa_lkey)
  bool virt_addr = true;
  bool has_epoch = false;  ///< the peer publishes a readable registration epoch
  uint64_t epoch = 0;
  uint64_t epoch_addr = 0;
  std::vector<uint64_t> epoch_rkeys;  ///< per device (has_epoch)
  /// The peer waits this long in WithdrawRegion after moving its epoch on: a value read may be relied on
  /// for half of it, counted from when the read was posted (0: read it before every submission).
  uint64_t epoch_lease_us = 0;
};

/// The longest epoch lease a reader accepts (a larger one is malformed).
constexpr uint64_t kMaxEpochLeaseUs = 10'000'000;

/// The keys of one remote buffer: keys[device][chunk]; `chunk` bytes per chunk (0: one chunk, the buffer).
struct RemoteKeys {
  uint64_t chunk = 0;
  std::vector<std::vector<uint64_t>> keys;
  /// The key for byte `offset` of the buffer through `device`, and the offset inside that chunk's
  /// registration (false: out of range).
  bool Lookup(size_t device, uint64_t offset, uint64_t* key, uint64_t* chunk_offset) const;
};

/// kMalformedJson when the descriptor has no usable efa device list (devices empty, a gid not a string, more
/// than 64 devices, epoch fields of the wrong type or count).
StatusOr<PeerFabric> ReadPeerFabric(const SegmentDescriptor& d);

/// The keys `peer` published for `buffer`; nullopt when it has none (not registered for remote access) or
/// they do not fit the device list and the buffer's length.
std::optional<RemoteKeys> ReadBufferKeys(const BufferDescriptor& buffer, const PeerFabric& peer);

/// The IPv4 address (host byte order) of an endpoint address that is a sockaddr_in (tcp, verbs over IP),
/// else nullopt.
std::optional<uint32_t> GidIpv4(const std::string& gid);
/// Whether an endpoint address is an IPv4 or IPv6 loopback socket address (reaches the local host only).
bool GidIsLoopback(const std::string& gid);

/// Writes this engine's top-level fields. `epoch_rkeys` has one key per device; `epoch_lease_us` is written
/// when not 0.
void WriteFabric(nlohmann::json& d, bool mooncake_names, const std::vector<FabricDevice>& devices, bool virt_addr,
                 uint64_t epoch, uint64_t epoch_addr, const std::vector<uint64_t>& epoch_rkeys,
                 uint64_t epoch_lease_us = 0);

/// A buffer's fields: keys[device][chunk] with `chunk` bytes per chunk (ignored for one chunk); rkey only
/// when `remote`.
nlohmann::json BufferFields(bool mooncake_names, uint64_t chunk, const std::vector<std::vector<uint64_t>>& keys,
                            bool remote);

}  // namespace mooncake::te::efa

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_DESCRIPTOR_H_
