#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_CONFIG_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_CONFIG_H_

#include <chrono>
#include <cstddef>
#include <string>

#include "transfer_engine/transport/options.h"

namespace mooncake::te::efa {

/// The efa transport's settings: option "efa.<key>" of EngineOptions::transport_options, else the variable
/// named, else the default. Plain value type.
struct EfaConfig {
  /// provider / FI_PROVIDER: the libfabric provider ("efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "shm", ...);
  /// empty: the first of efa, verbs;ofi_rxm that libfabric finds.
  std::string provider;
  size_t slice_size = 1 << 20;  ///< slice_size / MC_EFA_SLICE_SIZE (at most the provider's max_msg_size)
  /// max_wr / MC_MAX_WR: operations in flight per domain (at most the provider's tx_attr->size)
  int max_outstanding = 256;
  /// op_timeout_ms / MC_EFA_OP_TIMEOUT_MS: an operation not completed by then fails its slice and marks the
  /// peer down (its address is removed from the address vector)
  std::chrono::milliseconds op_timeout{10000};
  /// cq_wait / MC_EFA_CQ_WAIT: the progress thread sleeps in fi_cq_sread (1), polls (0), or sleeps only where
  /// the provider's wait object is known to wake for a peer's traffic, tcp and verbs (-1, the default)
  int cq_wait = -1;
  /// idle_poll_us / MC_EFA_IDLE_POLL_US: when polling, the nap between polls while nothing is in flight; a
  /// target's requests wait up to this long (shm: the provider needs the target's progress)
  int idle_poll_us = 1000;
  /// max_mr_size / MC_EFA_MAX_MR_SIZE: a region longer than this is registered in chunks of this size (one
  /// registration per chunk and NIC); 0: one registration per region and NIC (libfabric 1.17 does not report
  /// a provider's limit)
  uint64_t max_mr_size = 0;
  /// drive_us / MC_EFA_DRIVE_US: a synchronous transfer (SubmitAndDrive) of at most drive_max_bytes polls the
  /// completion queue on the caller's thread for up to this long before it leaves the rest to the progress
  /// thread; 0: never (every transfer is handed to the progress thread)
  int drive_us = 2000;
  /// drive_max_bytes / MC_EFA_DRIVE_MAX_BYTES: the largest synchronous submission driven on the caller's thread
  uint64_t drive_max_bytes = 1 << 20;
  /// epoch_lease_us / MC_EFA_EPOCH_LEASE_US: how long peers may rely on this engine's registration epoch
  /// without reading it again (published as efa_epoch_lease_us; they use half of it). WithdrawRegion of a
  /// remotely accessible region waits this long after moving the epoch on, so every such lease has expired
  /// when it returns. 0: peers read the epoch before every submission
  int epoch_lease_us = 1000;
  /// hmem / MC_EFA_HMEM: where the provider offers FI_HMEM and a cuda or rocm platform is usable, open the
  /// domains with it and register device memory with fi_mr_regattr (1); 0: decline device memory (the engine
  /// stages it through another transport)
  bool hmem = true;
  /// delivery_complete / MC_EFA_DELIVERY_COMPLETE: ask for FI_DELIVERY_COMPLETE writes where the provider
  /// offers them (1); 0: never, and each path's writes of a submission are confirmed by a trailing epoch read
  bool delivery_complete = true;

  static EfaConfig From(const TransportOptions& options);
};

/// The provider named by FI_PROVIDER (libfabric's own variable), or empty.
std::string ProviderFromEnv();

}  // namespace mooncake::te::efa

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_EFA_CONFIG_H_
