#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_RESPONDER_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_RESPONDER_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/rdma/rdma_config.h"
#include "transfer_engine/transport/rdma/rdma_nic.h"

namespace mooncake::te::rdma {

/// The passive end of the handshake: the responder QPs this engine makes for its peers' "rdma.connect"
/// requests, one per (peer instance, peer NIC, our NIC). A repeated request (same QPN) gets the same reply; a new
/// QPN for the same key replaces the old QP (the peer reconnected). At most `capacity` QPs are kept; when full,
/// the oldest is dropped (peers that restarted leave theirs behind). Every request field is peer input and is
/// validated. Thread-safe; the methods run on the engine's RPC thread and are quick.
class Responder {
 public:
  Responder(std::vector<std::shared_ptr<RdmaNic>> nics, const RdmaConfig& cfg, size_t capacity = 4096);
  ~Responder();

  /// "rdma.connect": {instance, local_nic, peer_nic, qpn, psn, gid, lid, mtu} -> our {nic, qpn, psn, gid, lid,
  /// mtu}, once our QP is RTS.
  StatusOr<std::string> Connect(const std::string& payload);
  /// "rdma.ready": {instance, local_nic, peer_nic, qpn}; kNotFound for an unknown connection.
  StatusOr<std::string> Ready(const std::string& payload);
  /// Destroys every responder QP.
  void Clear();
  size_t size() const;

 private:
  struct Entry;

  const std::vector<std::shared_ptr<RdmaNic>> nics_;
  const RdmaConfig cfg_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_;
  uint64_t seq_ = 0;
};

}  // namespace mooncake::te::rdma

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_RESPONDER_H_
