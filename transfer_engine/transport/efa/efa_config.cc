#include "transfer_engine/transport/efa/efa_config.h"

#include <cstdlib>

namespace mooncake::te::efa {

std::string ProviderFromEnv() {
  const char* p = getenv("FI_PROVIDER");
  return p != nullptr ? std::string(p) : std::string();
}

EfaConfig EfaConfig::From(const TransportOptions& o) {
  EfaConfig c;
  c.provider = o.String("provider", "FI_PROVIDER", "");
  c.slice_size = static_cast<size_t>(o.Int("slice_size", "MC_EFA_SLICE_SIZE", c.slice_size, 4096, 1LL << 30));
  c.max_outstanding = static_cast<int>(o.Int("max_wr", "MC_MAX_WR", c.max_outstanding, 1, 1 << 16));
  c.op_timeout = o.Millis("op_timeout_ms", "MC_EFA_OP_TIMEOUT_MS", c.op_timeout, 100, 3600 * 1000);
  c.cq_wait = static_cast<int>(o.Int("cq_wait", "MC_EFA_CQ_WAIT", c.cq_wait, -1, 1));
  c.idle_poll_us = static_cast<int>(o.Int("idle_poll_us", "MC_EFA_IDLE_POLL_US", c.idle_poll_us, 0, 100000));
  c.max_mr_size = static_cast<uint64_t>(o.Int("max_mr_size", "MC_EFA_MAX_MR_SIZE", 0, 0, 1LL << 50));
  c.drive_us = static_cast<int>(o.Int("drive_us", "MC_EFA_DRIVE_US", c.drive_us, 0, 1000000));
  c.drive_max_bytes = static_cast<uint64_t>(
      o.Int("drive_max_bytes", "MC_EFA_DRIVE_MAX_BYTES", static_cast<long long>(c.drive_max_bytes), 0, 1LL << 30));
  c.epoch_lease_us = static_cast<int>(o.Int("epoch_lease_us", "MC_EFA_EPOCH_LEASE_US", c.epoch_lease_us, 0, 1000000));
  c.hmem = o.Bool("hmem", "MC_EFA_HMEM", c.hmem);
  c.delivery_complete = o.Bool("delivery_complete", "MC_EFA_DELIVERY_COMPLETE", c.delivery_complete);
  if (c.max_mr_size != 0 && c.max_mr_size < 4096) c.max_mr_size = 4096;
  return c;
}

}  // namespace mooncake::te::efa
