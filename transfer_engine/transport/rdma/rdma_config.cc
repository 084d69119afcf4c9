#include "transfer_engine/transport/rdma/rdma_config.h"

#include <infiniband/verbs.h>

namespace mooncake::te::rdma {

int MtuEnum(int bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

RdmaConfig RdmaConfig::From(const TransportOptions& o) {
  RdmaConfig c;
  c.gid_index = static_cast<int>(o.Int("gid_index", "MC_GID_INDEX", c.gid_index, -1, 255));  // sgid_index is 8 bits
  c.mtu = static_cast<int>(o.Int("mtu", "MC_MTU", c.mtu, 256, 4096));
  c.ib_port = static_cast<int>(o.Int("ib_port", "MC_IB_PORT", c.ib_port, 1, 255));
  c.traffic_class = static_cast<int>(o.Int("traffic_class", "MC_IB_TC", c.traffic_class, -1, 255));
  c.service_level = static_cast<int>(o.Int("service_level", "MC_IB_SL", c.service_level, -1, 15));
  c.pkey_index = static_cast<int>(o.Int("pkey_index", "MC_PKEY_INDEX", c.pkey_index, 0, 65535));
  c.max_wr = static_cast<int>(o.Int("max_wr", "MC_MAX_WR", c.max_wr, 1, 8192));
  c.num_cq_per_ctx = static_cast<int>(o.Int("num_cq_per_ctx", "MC_NUM_CQ_PER_CTX", c.num_cq_per_ctx, 1, 64));
  c.max_cqe = static_cast<int>(o.Int("max_cqe", "MC_MAX_CQE_PER_CTX", c.max_cqe, 16, 1 << 20));
  c.slice_size = static_cast<size_t>(o.Int("slice_size", "MC_SLICE_SIZE", c.slice_size, 4096, 1LL << 30));
  c.max_mr_size = static_cast<uint64_t>(o.Int("max_mr_size", "MC_MAX_MR_SIZE", 0, 0, 1LL << 62));
  c.retry_count = static_cast<int>(o.Int("retry_cnt", "MC_RETRY_CNT", c.retry_count, 0, 1000));
  c.backoff = o.Millis("backoff_ms", "MC_RDMA_BACKOFF_MS", c.backoff, 1, 600000);
  c.rail_pause = std::chrono::seconds(o.Int("rail_pause_s", "MC_RDMA_RAIL_PAUSE_SECONDS", 30, 1, 3600));
  c.qp_timeout = static_cast<int>(o.Int("qp_timeout", "MC_IB_TIMEOUT", c.qp_timeout, 1, 31));
  c.qp_retry_cnt = static_cast<int>(o.Int("qp_retry", "MC_IB_RETRY_CNT", c.qp_retry_cnt, 0, 7));
  c.responder_capacity =
      static_cast<size_t>(o.Int("responder_capacity", "MC_RDMA_RESPONDER_CAPACITY", 4096, 1, 1 << 20));
  return c;
}

}  // namespace mooncake::te::rdma
