#include "transfer_engine/transport/tcp/tcp_config.h"

#include <algorithm>

namespace mooncake::te::tcp {

TcpConfig TcpConfig::From(const TransportOptions& o) {
  TcpConfig c;
  c.max_frame = static_cast<size_t>(o.Int("max_frame", "MC_TCP_MAX_FRAME", c.max_frame, 4096, 1LL << 31));
  c.slice_size = static_cast<size_t>(o.Int("slice_size", "MC_TCP_SLICE_SIZE", c.slice_size, 4096, 1LL << 30));
  c.slice_size = std::min(c.slice_size, c.max_frame);
  c.io_threads = static_cast<int>(o.Int("io_threads", "MC_TCP_IO_THREADS", c.io_threads, 1, 64));
  c.lanes_per_peer = static_cast<int>(o.Int("lanes_per_peer", "MC_TCP_LANES_PER_PEER", c.lanes_per_peer, 1, 64));
  c.bind_address = o.String("bind_address", "MC_TCP_BIND_ADDRESS");
  c.stall_timeout = o.Millis("stall_timeout_ms", "MC_TCP_STALL_TIMEOUT_MS", c.stall_timeout, 100, 3600000);
  c.probe_interval = o.Millis("probe_interval_ms", "MC_TCP_PROBE_INTERVAL_MS", c.probe_interval, 10, 3600000);
  c.lane_window = static_cast<size_t>(o.Int("lane_window", "MC_TCP_LANE_WINDOW", c.lane_window, 4096, 1LL << 34));
  c.recv_spin = std::chrono::microseconds(o.Int("recv_spin_us", "MC_TCP_RECV_SPIN_US", c.recv_spin.count(), 0, 10000));
  c.staging_pool_bytes = static_cast<size_t>(o.Int("staging_pool_bytes", "MC_TCP_STAGING_POOL_BYTES",
                                                   c.staging_pool_bytes, kMinStagingPoolBytes, 1LL << 40));
  c.staging_streams = static_cast<int>(o.Int("staging_streams", "MC_TCP_STAGING_STREAMS", c.staging_streams, 1, 64));
  return c;
}

}  // namespace mooncake::te::tcp
