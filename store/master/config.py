"""Master configuration: every tunable with Mooncake's default (reference §2.10), validated in one place."""

from __future__ import annotations

import dataclasses
import os

from mooncake.store.master.segments import ALLOCATION_STRATEGIES

from mooncake.store.common.protocol import (  # noqa: F401  (re-exported)
    GRPC_OPTIONS, MAX_KEY_BYTES, MAX_MESSAGE_BYTES, MAX_REPLICA_NUM, MAX_REQUEST_BYTES)

# The master's gRPC server: requests up to MAX_REQUEST_BYTES, at most 64 calls in progress per connection and
# 1024 connections (a request being received holds at most its own size: gRPC reads it as it arrives).
GRPC_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_concurrent_streams", 64),
    ("grpc.max_allowed_incoming_connections", 1024),
]


@dataclasses.dataclass
class MasterConfig:
    # RPC
    rpc_address: str = "0.0.0.0"
    port: int = 50051
    fast_rpc_port: int = 0  # framed-protobuf door (fast_rpc.py) on rpc_address: 0 ephemeral, -1 off
    max_threads: int = 16
    # Leases, pins, eviction
    default_kv_lease_ttl_ms: int = 10_000
    default_kv_soft_pin_ttl_ms: int = 30 * 60 * 1000
    max_kv_soft_pin_ttl_ms: int = 24 * 3600 * 1000
    allow_evict_soft_pinned_objects: bool = True
    eviction_ratio: float = 0.05
    eviction_high_watermark_ratio: float = 0.90
    exist_grants_lease: bool = False  # Mooncake's ExistKey leases; off here (see objects.py, lease rules)
    # Liveness and crashed writers
    client_ttl_sec: float = 10.0
    put_start_discard_timeout_sec: float = 30.0
    put_start_release_timeout_sec: float = 600.0
    # One-round-trip puts (reservations.py): a client's reserved block is freed after this long unused (0: no
    # reservations); one block is at most this large
    reservation_idle_sec: float = 10.0
    max_reservation_bytes: int = 64 << 20
    # Allocation
    allocation_strategy: str = "random"
    memory_allocator: str = "offset"
    # Copy/move tasks
    max_total_finished_tasks: int = 10_000
    max_total_pending_tasks: int = 10_000
    max_total_processing_tasks: int = 10_000
    pending_task_timeout_sec: float = 300.0
    processing_task_timeout_sec: float = 300.0
    # Admin / metrics HTTP, embedded metadata server
    enable_metric_reporting: bool = True
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9003
    enable_http_metadata_server: bool = False
    http_metadata_server_host: str = "0.0.0.0"
    http_metadata_server_port: int = 8080
    cluster_id: str = "mooncake_cluster"
    # SSD tier: offload tasks queued per owner (segment owner with a disk tier) beyond which new ones are
    # dropped (counted); the object then stays memory-only
    offloading_queue_limit: int = 50_000
    # Background monitor period (client expiry, put timeouts, watermark eviction)
    monitor_interval_ms: int = 100
    # Durable metadata (durable.py): snapshots plus the local op log in snapshot_dir ("" = the environment's
    # MOONCAKE_SNAPSHOT_LOCAL_PATH, else ./mooncake_master_snapshots); a restarted master restores from them
    enable_snapshot: bool = False
    snapshot_interval_seconds: float = 600.0
    snapshot_retention_count: int = 2
    snapshot_dir: str = ""
    # High availability (ha.py): leader election through a lease in etcd or Redis; the leader's op log in the
    # backend (enable_oplog) feeds hot standbys. ha_lease_ttl_sec: the election lease; a leader that could not
    # renew it for ha_lease_ttl_sec/2 stops serving writes (fencing) before any other can be elected.
    enable_ha: bool = False
    ha_backend_type: str = "etcd"
    ha_backend_connstring: str = ""
    enable_oplog: bool = False
    ha_lease_ttl_sec: float = 5.0
    oplog_poll_interval_ms: int = 100
    oplog_batch_max_entries: int = 1024
    # Synchronous replication to the standbys' memory (standby_sync.py): calls are answered once every in-sync
    # standby holds their ops (or the log does); a standby silent for ha_sync_timeout_ms leaves the sync set.
    ha_sync_standbys: bool = True
    ha_sync_timeout_ms: int = 500
    ha_sync_port: int = 0
    # Log compaction (ha.py): every oplog_compact_interval_sec the leader deletes the log's batches before the
    # newest oplog_retain_ops ops that no standby's stream still needs; a standby left behind takes a snapshot.
    oplog_retain_ops: int = 100_000
    oplog_compact_interval_sec: float = 10.0

    def snapshot_path(self) -> str:
        return self.snapshot_dir or os.environ.get("MOONCAKE_SNAPSHOT_LOCAL_PATH") or "./mooncake_master_snapshots"

    def validate(self) -> None:
        """Raises ValueError naming the first bad setting."""
        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        for name in ("port", "metrics_port", "http_metadata_server_port"):
            v = getattr(self, name)
            check(0 <= v <= 65535, f"--{name} must be in [0, 65535], got {v}")
        check(-1 <= self.fast_rpc_port <= 65535, f"--fast_rpc_port must be in [-1, 65535], got {self.fast_rpc_port}")
        check(self.max_threads >= 1, f"--max_threads must be >= 1, got {self.max_threads}")
        check(self.default_kv_lease_ttl_ms >= 0, f"--default_kv_lease_ttl must be >= 0, got {self.default_kv_lease_ttl_ms}")
        check(self.default_kv_soft_pin_ttl_ms > 0, "--default_kv_soft_pin_ttl must be > 0")
        check(self.max_kv_soft_pin_ttl_ms >= self.default_kv_soft_pin_ttl_ms,
              "--max_kv_soft_pin_ttl must be >= --default_kv_soft_pin_ttl")
        check(0.0 < self.eviction_ratio <= 1.0, f"--eviction_ratio must be in (0, 1], got {self.eviction_ratio}")
        check(0.0 < self.eviction_high_watermark_ratio <= 1.0,
              f"--eviction_high_watermark_ratio must be in (0, 1], got {self.eviction_high_watermark_ratio}")
        check(self.client_ttl_sec > 0, f"--client_ttl must be > 0, got {self.client_ttl_sec}")
        check(self.put_start_discard_timeout_sec > 0, "--put_start_discard_timeout_sec must be > 0")
        check(self.reservation_idle_sec >= 0, "--reservation_idle_sec must be >= 0")
        check(self.max_reservation_bytes >= 0, "--max_reservation_size must be >= 0")
        check(self.put_start_release_timeout_sec >= self.put_start_discard_timeout_sec,
              "--put_start_release_timeout_sec must be >= --put_start_discard_timeout_sec")
        check(self.allocation_strategy in ALLOCATION_STRATEGIES,
              f"--allocation_strategy must be one of {', '.join(ALLOCATION_STRATEGIES)}, got {self.allocation_strategy!r}")
        check(self.memory_allocator == "offset",
              f"--memory_allocator: only 'offset' is implemented, got {self.memory_allocator!r}")
        for name in ("max_total_finished_tasks", "max_total_pending_tasks", "max_total_processing_tasks"):
            check(getattr(self, name) >= 1, f"--{name} must be >= 1")
        check(self.pending_task_timeout_sec > 0 and self.processing_task_timeout_sec > 0,
              "task timeouts must be > 0")
        check(self.monitor_interval_ms >= 1, "--monitor_interval_ms must be >= 1")
        check(self.snapshot_interval_seconds > 0, "--snapshot_interval_seconds must be > 0")
        check(self.snapshot_retention_count >= 1, "--snapshot_retention_count must be >= 1")
        check(self.ha_backend_type in ("etcd", "redis"),
              f"--ha_backend_type must be etcd or redis, got {self.ha_backend_type!r}")
        check(not self.enable_ha or self.ha_backend_connstring,
              "--enable_ha needs --ha_backend_connstring (or --etcd_endpoints)")
        check(self.ha_lease_ttl_sec >= 1.0, f"--ha_lease_ttl must be >= 1 s, got {self.ha_lease_ttl_sec}")
        check(0 <= self.ha_sync_port <= 65535, f"--ha_sync_port must be in [0, 65535], got {self.ha_sync_port}")
        check(self.ha_sync_timeout_ms >= 1, "--ha_sync_timeout_ms must be >= 1")
        check(self.oplog_retain_ops >= 1 and self.oplog_compact_interval_sec > 0,
              "--oplog_retain_ops must be >= 1 and --oplog_compact_interval_sec > 0")
        check(self.oplog_poll_interval_ms >= 1 and self.oplog_batch_max_entries >= 1,
              "--oplog_poll_interval_ms and --oplog_batch_max_entries must be >= 1")
        check(self.offloading_queue_limit >= 0,
              f"--offloading_queue_limit must be >= 0, got {self.offloading_queue_limit}")
