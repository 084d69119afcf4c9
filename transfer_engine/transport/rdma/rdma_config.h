#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_CONFIG_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_CONFIG_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "transfer_engine/transport/options.h"

namespace mooncake::te::rdma {

/// The rdma transport's settings: option "rdma.<key>" of EngineOptions::transport_options, else Mooncake's
/// variable named, else the default. Plain value type.
struct RdmaConfig {
  int gid_index = -1;           ///< gid_index / MC_GID_INDEX: -1 chooses (RoCEv2 IPv4-mapped, RoCEv2, any)
  int mtu = 4096;               ///< mtu / MC_MTU: path MTU cap in bytes (256..4096), min with both ports
  int ib_port = 1;              ///< ib_port / MC_IB_PORT
  int traffic_class = -1;       ///< traffic_class / MC_IB_TC: GRH traffic class, -1 leaves 0
  int service_level = -1;       ///< service_level / MC_IB_SL: -1 leaves 0
  int pkey_index = 0;           ///< pkey_index / MC_PKEY_INDEX
  int max_wr = 256;             ///< max_wr / MC_MAX_WR: work requests in flight per QP
  int num_cq_per_ctx = 1;       ///< num_cq_per_ctx / MC_NUM_CQ_PER_CTX: CQs (each with a polling thread) per NIC
  int max_cqe = 4096;           ///< max_cqe / MC_MAX_CQE_PER_CTX: entries per CQ (bounds WRs in flight per CQ)
  size_t slice_size = 65536;    ///< slice_size / MC_SLICE_SIZE
  uint64_t max_mr_size = 0;     ///< max_mr_size / MC_MAX_MR_SIZE: registration chunk; 0: the devices' max
  int retry_count = 9;          ///< retry_cnt / MC_RETRY_CNT: NIC-pair changes per slice before it fails
  /// backoff_ms / MC_RDMA_BACKOFF_MS: a failed endpoint is not reconnected for this long, doubling per
  /// consecutive failure up to rail_pause (the circuit breaker)
  std::chrono::milliseconds backoff{100};
  std::chrono::milliseconds rail_pause{std::chrono::seconds(30)};  ///< MC_RDMA_RAIL_PAUSE_SECONDS (seconds)
  int qp_timeout = 14;          ///< qp_timeout / MC_IB_TIMEOUT: local ACK timeout exponent (4.096 us * 2^n)
  int qp_retry_cnt = 7;         ///< qp_retry / MC_IB_RETRY_CNT: transport retries before RETRY_EXC_ERR
  size_t responder_capacity = 4096;  ///< responder_capacity: responder QPs kept for peers (rdma_responder.h)

  static RdmaConfig From(const TransportOptions& options);
};

/// The IBV_MTU_* enum value for a byte count (256..4096, rounded down to a power of two).
int MtuEnum(int bytes);

}  // namespace mooncake::te::rdma

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_RDMA_CONFIG_H_
