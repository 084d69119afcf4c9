#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_CONFIG_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_CONFIG_H_

#include <chrono>
#include <cstddef>
#include <string>

#include "transfer_engine/transport/options.h"

namespace mooncake::te::tcp {

/// The TCP transport's settings: option "tcp.<key>" of EngineOptions::transport_options, else the MC_TCP_*
/// variable (Mooncake's names), else the default. Plain value type.
struct TcpConfig {
  size_t slice_size = 1 << 20;   ///< slice_size / MC_TCP_SLICE_SIZE (at most max_frame)
  int io_threads = 2;            ///< io_threads / MC_TCP_IO_THREADS: epoll loops
  int lanes_per_peer = 2;        ///< lanes_per_peer / MC_TCP_LANES_PER_PEER: connections per path
  size_t max_frame = 64 << 20;   ///< max_frame / MC_TCP_MAX_FRAME: largest payload one frame may carry
  std::string bind_address;      ///< bind_address / MC_TCP_BIND_ADDRESS: data listener and advertised address
  std::chrono::milliseconds stall_timeout{3000};  ///< stall_timeout_ms / MC_TCP_STALL_TIMEOUT_MS: failover
  std::chrono::milliseconds probe_interval{500};  ///< probe_interval_ms / MC_TCP_PROBE_INTERVAL_MS
  size_t lane_window = 4 << 20;  ///< lane_window / MC_TCP_LANE_WINDOW: bytes in flight per connection
  /// recv_spin_us / MC_TCP_RECV_SPIN_US: a caller receiving a large READ payload keeps its core this long
  /// between bursts before sleeping in poll (0: always sleep)
  std::chrono::microseconds recv_spin{50};
  /// staging_pool_bytes / MC_TCP_STAGING_POOL_BYTES: the pinned host memory (per device platform) that device
  /// memory is staged through: allocated once when the first device region is registered, half for this engine's
  /// own transfers and half for its peers', in chunks of slice_size; transfers beyond it wait for their turn
  static constexpr size_t kMinStagingPoolBytes = 128 << 10;
  size_t staging_pool_bytes = 128 << 20;
  /// staging_streams / MC_TCP_STAGING_STREAMS: copy streams per device for staging copies (1 .. 64)
  int staging_streams = 4;
  /// The engine's handshake connect timeout (MC_HANDSHAKE_CONNECT_TIMEOUT), set at Start.
  std::chrono::milliseconds connect_timeout{5000};

  static TcpConfig From(const TransportOptions& options);
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_CONFIG_H_
