#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_RESPONDER_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_RESPONDER_H_

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/rdma/rdma_config.h"
#include "transfer_engine/transport/rdma/rdma_nic.h"

namespace mooncake::te::rdma {

/// The passive end of the handshake: the responder QPs this engine makes for its peers' "rdma.connect"
/// requests, one per (peer instance, peer NIC, our NIC). A repeated request (same QPN and PSN) gets the same
/// reply; a new QPN for the same key replaces the old QP (the peer reconnected); a new instance under a known
/// segment name drops the old instance's QPs (the peer restarted); "rdma.close" (sent, best effort, by a
/// requester destroying its QP) drops one. At most `capacity` QPs are kept, and at most 64 x (our NICs) per peer
/// instance. When full, the oldest QP whose requester has not confirmed it ("rdma.ready") within the ready window
/// is dropped; failing that, the least recently confirmed one (its requester may be gone without a close: a
/// crashed process; a live one gets an error completion and reconnects). Only a table whose every entry is an
/// unconfirmed handshake still within its window refuses (kTooManyRequests). Every request field is peer input
/// and is validated. Thread-safe; the methods run on the engine's RPC thread and do bounded work (one QP created
/// and connected, a scan of the table), never waiting on a peer.
class Responder {
 public:
  /// `instance`: this engine's, sent in every reply (a requester holding an older descriptor of ours sees that
  /// we restarted).
  Responder(std::vector<std::shared_ptr<RdmaNic>> nics, const RdmaConfig& cfg, std::string instance = "",
            size_t capacity = 4096,
            std::chrono::milliseconds ready_window = kReadyWindow);
  ~Responder();

  /// "rdma.connect": {instance, local_nic, peer_nic, qpn, psn, gid, lid, mtu} -> our {nic, qpn, psn, gid, lid,
  /// mtu}, once our QP is RTS.
  StatusOr<std::string> Connect(const std::string& payload);
  /// "rdma.ready": {instance, local_nic, peer_nic, qpn}; kNotFound for an unknown connection.
  StatusOr<std::string> Ready(const std::string& payload);
  /// "rdma.close": {instance, local_nic, peer_nic, qpn, psn}: the requester destroyed that QP; ours goes. "{}"
  /// also when nothing matches (a repeated or late close: QPN and PSN must match, so a close overtaken by a
  /// reconnect, even one whose HCA reused the QPN, leaves the new connection alone).
  StatusOr<std::string> Close(const std::string& payload);
  /// Destroys every responder QP.
  void Clear();
  size_t size() const;

 private:
  struct Entry;
  /// How long a requester has to confirm a connection before it may be dropped to make room.
  static constexpr std::chrono::seconds kReadyWindow{10};
  Status MakeRoomLocked(const std::string& instance);

  const std::vector<std::shared_ptr<RdmaNic>> nics_;
  const RdmaConfig cfg_;
  const std::string instance_;
  const size_t capacity_;
  const std::chrono::milliseconds ready_window_;
  mutable std::mutex mu_;
  /// (peer instance, peer NIC, our NIC): a tuple, so that no peer-chosen string can alias another's key.
  using Key = std::tuple<std::string, std::string, std::string>;
  std::map<Key, std::unique_ptr<Entry>> entries_;
  uint64_t seq_ = 0;
};

}  // namespace mooncake::te::rdma

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_RESPONDER_H_
