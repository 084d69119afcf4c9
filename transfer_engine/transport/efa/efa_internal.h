#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_INTERNAL_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_INTERNAL_H_

// EfaTransport's private state, shared by efa_transport.cc (life cycle, registration, peers and paths) and
// efa_submit.cc (the data path). Not for use outside the efa transport.

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/transport/efa/efa_transport.h"

namespace mooncake::te::efa {

/// A path marked down (an operation on it failed or timed out) is tried again after this long; meanwhile the
/// peer's slices take its other paths, or fail at once (kOtherPath) when none is up.
constexpr std::chrono::seconds kRetryDownPeerAfter(5);

/// What the transport keeps per registered region: its registrations, per domain and chunk.
struct EfaRegionState : TransportRegionState {
  uint64_t chunk = 0;                                        // bytes per registration
  std::vector<std::vector<std::unique_ptr<FabricMr>>> mrs;   // [rail][chunk]
};

/// One local NIC: its domain, the epoch page's registration with it and the slots epoch reads land in.
struct EfaTransport::Rail {
  std::shared_ptr<FabricDomain> domain;
  std::unique_ptr<FabricMr> epoch_mr;
  std::unique_ptr<EpochSlots> slots;
};

/// A (local rail, peer device) pair. Its fields are guarded by the peer's mu.
struct EfaTransport::Path {
  int rail = 0;
  size_t device = 0;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  bool in_av = false;
  bool down = false;
  std::string why_down;
  std::chrono::steady_clock::time_point down_until{};  // when a down path is tried again
  uint64_t in_flight = 0;                              // bytes posted and not completed
  uint64_t bytes = 0, slices = 0, errors = 0;
};

/// A peer as this transport knows it: what its descriptor says and one path per local NIC it pairs with.
struct EfaTransport::Peer {
  std::string name;
  std::string gids;  // the devices' gids, joined: a change means new addresses
  PeerFabric fabric;
  std::string host_id;
  mutable std::mutex mu;  // guards paths and the counters
  std::vector<Path> paths;
  uint64_t bytes = 0, slices = 0, errors = 0, stale = 0;
  // The epoch lease: `leased_epoch` was read back and may be relied on until `lease_until` (see Start).
  bool leased = false;
  uint64_t leased_epoch = 0;
  std::chrono::steady_clock::time_point lease_until{};
  uint64_t epoch_reads = 0, lease_hits = 0;
  // Epoch reads in flight, by the value expected: items that need the same check wait for that read.
  std::map<uint64_t, std::shared_ptr<std::vector<Item>>> reading;
};

/// What a SubmitAndDrive caller waits for: the items of its submission not finished yet.
struct DriveCount {
  std::atomic<size_t> left{0};
  std::mutex mu;           // guards the two below
  std::vector<int> rails;  // the rails posted to for it, each driven (BeginDrive) until the caller stops
  bool closed = false;     // the caller stopped driving: later posts are the progress threads'
};

/// One slice and what posting it needs (valid across retries).
struct EfaTransport::Item {
  Slice* slice = nullptr;
  RegionPin pin;  // holds the local registration
  const EfaRegionState* local = nullptr;
  uint64_t local_offset = 0;  // of slice->local in the local region
  std::shared_ptr<const RemoteKeys> keys;
  uint64_t remote_offset = 0;  // of slice->remote in the remote buffer
  std::shared_ptr<DriveCount> drive;  // SubmitAndDrive: counted down once the slice is finished; else null
  uint64_t epoch = 0;  // the peer's epoch in the descriptor the slice was checked against
  // The end of the epoch lease it is posted under (unset: no lease): its operations are not posted later.
  std::chrono::steady_clock::time_point post_by{};
};

/// One posting of an item on a path: its operations (one per chunk it touches).
struct EfaTransport::Run {
  Item item;
  std::atomic<int> left{0};
  std::mutex mu;  // guards error and late
  Status error;
  bool late = false;  // an operation was not posted within the lease (NotPostedInTime)
};

/// The items posted together on one path.
struct EfaTransport::Group {
  std::shared_ptr<Peer> peer;
  int path = 0;
  bool fence_writes = false;  // writes complete only after a trailing epoch read (no delivery-complete)
  std::vector<Item> items;
  std::atomic<size_t> remaining{0};
  std::mutex mu;                                   // guards held
  std::vector<std::shared_ptr<Run>> held;          // finished writes waiting for the fence
};

}  // namespace mooncake::te::efa

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_INTERNAL_H_
