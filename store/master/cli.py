"""``mooncake_master``: the Store master process (entry point ``mooncake.store.master.cli:main``).

Flags follow Mooncake's gflags names and defaults (reference §2.10): ``--flag=value`` or ``--flag value``;
booleans also as ``--flag``, ``--flag=true|false|1|0`` and ``--noflag``. Durations accept a unit suffix
(``--default_kv_lease_ttl=10s``; bare numbers are milliseconds there and seconds for ``--client_ttl``).
``--config_path`` reads a JSON object of flag names to values; command-line flags override it. Unknown
flags and bad values exit with status 2 and a one-line error.

On start it prints one line to stdout, ``mooncake_master listening on HOST:PORT ...`` with the bound ports
(useful with ``--port=0``), then serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading

import mooncake
from mooncake.store.master.config import MasterConfig
from mooncake.store.master.segments import ALLOCATION_STRATEGIES

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def parse_bool(text) -> bool:
    if isinstance(text, bool):
        return text
    v = str(text).strip().lower()
    if v in ("1", "true", "t", "yes", "y", "on"):
        return True
    if v in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _duration(default_unit: str, result_unit: str):
    def parse(text) -> float:
        m = _DURATION.match(str(text))
        if not m:
            raise argparse.ArgumentTypeError(f"expected a duration such as 500ms, 10s, 1m, got {text!r}")
        ms = float(m.group(1)) * _UNIT_MS[m.group(2) or default_unit]
        return ms / _UNIT_MS[result_unit]
    parse.__name__ = "duration"
    return parse


def _ranged(kind, lo=None, hi=None, lo_open=False):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if lo is not None and (v <= lo if lo_open else v < lo) or hi is not None and v > hi:
            lo_s = "none" if lo is None else (f"({lo}" if lo_open else f"[{lo}")
            raise argparse.ArgumentTypeError(f"{v} is outside {lo_s}, {'inf' if hi is None else hi}]")
        return v
    parse.__name__ = kind.__name__
    return parse


_port = _ranged(int, 0, 65535)
_ratio = _ranged(float, 0.0, 1.0, lo_open=True)
_positive_int = _ranged(int, 1)


def build_parser() -> argparse.ArgumentParser:
    d = MasterConfig()
    p = argparse.ArgumentParser(prog="mooncake_master", description="Mooncake Store master (metadata, allocation,"
                                " leases, eviction, client liveness).", allow_abbrev=False)

    def flag(name, type_, default, help_):
        p.add_argument(f"--{name}", type=type_, default=default, metavar="V", help=f"{help_} (default: {default})")

    def bool_flag(name, default, help_):
        p.add_argument(f"--{name}", type=parse_bool, nargs="?", const=True, default=default, metavar="BOOL",
                       help=f"{help_} (default: {str(default).lower()})")
        p.add_argument(f"--no{name}", dest=name, action="store_false", help=argparse.SUPPRESS)

    p.add_argument("--version", action="version", version=f"mooncake_master {mooncake.__version__}")
    flag("config_path", str, "", "JSON file of flag values (command-line flags win)")
    flag("rpc_address", str, d.rpc_address, "address the RPC server binds")
    flag("port", _port, d.port, "RPC port (0: ephemeral)")
    flag("rpc_port", _port, 0, "RPC port; 0 means use --port")
    flag("fast_rpc_port", _ranged(int, -1, 65535), d.fast_rpc_port,
         "port of the framed-protobuf RPC door store clients prefer (0: ephemeral, -1: off)")
    flag("max_threads", _positive_int, d.max_threads, "RPC worker threads")
    flag("rpc_thread_num", _ranged(int, 0), 0, "RPC worker threads; 0 means use --max_threads")
    flag("default_kv_lease_ttl", _duration("ms", "ms"), d.default_kv_lease_ttl_ms,
         "read lease granted by GetReplicaList, ms or with unit")
    flag("default_kv_soft_pin_ttl", _duration("ms", "ms"), d.default_kv_soft_pin_ttl_ms, "soft pin lifetime, ms")
    flag("max_kv_soft_pin_ttl", _duration("ms", "ms"), d.max_kv_soft_pin_ttl_ms, "longest soft pin a put may ask, ms")
    bool_flag("allow_evict_soft_pinned_objects", d.allow_evict_soft_pinned_objects,
              "evict soft-pinned objects when nothing else is left")
    flag("eviction_ratio", _ratio, d.eviction_ratio, "fraction of capacity freed per eviction round")
    flag("eviction_high_watermark_ratio", _ratio, d.eviction_high_watermark_ratio,
         "usage that triggers background eviction")
    bool_flag("exist_grants_lease", d.exist_grants_lease,
              "ExistKey grants read leases like Mooncake (lets polling block eviction)")
    flag("client_ttl", _duration("s", "s"), d.client_ttl_sec, "seconds without ping before a client expires")
    flag("put_start_discard_timeout_sec", _duration("s", "s"), d.put_start_discard_timeout_sec,
         "seconds a put may stay PROCESSING before it is revoked")
    flag("put_start_release_timeout_sec", _duration("s", "s"), d.put_start_release_timeout_sec,
         "seconds before the buffers of a revoked stuck put are reused (earlier under memory pressure)")
    flag("reservation_idle_sec", _duration("s", "s"), d.reservation_idle_sec,
         "seconds a client's reserved block (one-round-trip puts) may stay unused before it is freed; 0: no "
         "reservations (every put takes two master calls)")
    flag("max_reservation_size", _ranged(int, 0), d.max_reservation_bytes,
         "largest block (bytes) one reservation takes")
    flag("allocation_strategy", str, d.allocation_strategy, "one of " + ", ".join(ALLOCATION_STRATEGIES))
    flag("memory_allocator", str, d.memory_allocator, "segment allocator (offset)")
    flag("max_total_finished_tasks", _positive_int, d.max_total_finished_tasks, "finished tasks kept")
    flag("max_total_pending_tasks", _positive_int, d.max_total_pending_tasks, "pending tasks allowed")
    flag("max_total_processing_tasks", _positive_int, d.max_total_processing_tasks, "tasks handed out at once")
    flag("pending_task_timeout_sec", _duration("s", "s"), d.pending_task_timeout_sec, "pending task timeout")
    flag("processing_task_timeout_sec", _duration("s", "s"), d.processing_task_timeout_sec,
         "processing task timeout")
    bool_flag("enable_metric_reporting", d.enable_metric_reporting, "serve /metrics, /health, /status")
    flag("metrics_host", str, d.metrics_host, "admin/metrics HTTP address")
    flag("metrics_port", _port, d.metrics_port, "admin/metrics HTTP port (0: ephemeral)")
    bool_flag("enable_http_metadata_server", d.enable_http_metadata_server,
              "embed the Transfer Engine HTTP metadata server")
    flag("http_metadata_server_host", str, d.http_metadata_server_host, "embedded metadata server address")
    flag("http_metadata_server_port", _port, d.http_metadata_server_port, "embedded metadata server port")
    flag("cluster_id", str, d.cluster_id, "cluster id")
    flag("offloading_queue_limit", _ranged(int, 0), d.offloading_queue_limit,
         "offload tasks queued per SSD-tier owner; new ones beyond are dropped (0: persist nothing)")
    flag("monitor_interval_ms", _positive_int, d.monitor_interval_ms,
         "period of client expiry / stuck-put / watermark checks")
    bool_flag("enable_snapshot", d.enable_snapshot,
              "keep the metadata durable: periodic snapshots plus a local op log, restored at start")
    flag("snapshot_interval_seconds", _ranged(float, 0.0, lo_open=True), d.snapshot_interval_seconds,
         "seconds between snapshots")
    flag("snapshot_retention_count", _positive_int, d.snapshot_retention_count, "snapshots kept")
    flag("snapshot_dir", str, d.snapshot_dir,
         "directory of snapshots and the op log (empty: $MOONCAKE_SNAPSHOT_LOCAL_PATH or ./mooncake_master_snapshots)")
    bool_flag("enable_ha", d.enable_ha, "several masters, one leader elected through --ha_backend_type")
    flag("ha_backend_type", str, d.ha_backend_type, "etcd or redis")
    flag("ha_backend_connstring", str, d.ha_backend_connstring, "backend endpoints, 'h1:2379;h2:2379'")
    flag("etcd_endpoints", str, "", "legacy name of --ha_backend_connstring (etcd)")
    bool_flag("enable_oplog", d.enable_oplog, "HA: the leader logs every metadata change in the backend; "
              "standbys apply it (hot standby)")
    flag("ha_lease_ttl", _duration("s", "s"), d.ha_lease_ttl_sec, "HA: leader lease TTL, seconds or with unit")
    flag("oplog_poll_interval_ms", _positive_int, d.oplog_poll_interval_ms, "HA: standby op log poll period")
    flag("oplog_batch_max_entries", _positive_int, d.oplog_batch_max_entries, "HA: ops per log record at most")
    bool_flag("ha_sync_standbys", d.ha_sync_standbys, "HA: stream every op to the standbys and answer a call once "
              "every in-sync standby holds its ops in memory (else only once the backend's log has them)")
    flag("ha_sync_timeout_ms", _positive_int, d.ha_sync_timeout_ms,
         "HA: a standby that has not acknowledged streamed ops for this long leaves the sync set")
    flag("ha_sync_port", int, d.ha_sync_port, "HA: port of the standbys' stream (0: any free port)")
    flag("oplog_retain_ops", _positive_int, d.oplog_retain_ops,
         "HA: the log keeps at least this many of the newest ops (older ones are compacted away)")
    flag("oplog_compact_interval_sec", float, d.oplog_compact_interval_sec, "HA: seconds between log compactions")
    flag("log_level", str, "INFO", "DEBUG, INFO, WARNING or ERROR")
    return p


def _apply_config_file(parser: argparse.ArgumentParser, path: str) -> None:
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError) as e:
        parser.error(f"--config_path {path}: {e}")
    if not isinstance(values, dict):
        parser.error(f"--config_path {path}: expected a JSON object of flag values")
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "version")}
    defaults = {}
    for name, value in values.items():
        action = actions.get(name)
        if action is None or name == "config_path":
            parser.error(f"--config_path {path}: unknown flag {name!r}")
        try:
            defaults[name] = action.type(value if action.type is parse_bool else str(value)) \
                if action.type else value
        except argparse.ArgumentTypeError as e:
            parser.error(f"--config_path {path}: {name}: {e}")
    parser.set_defaults(**defaults)


def parse_config(argv: list[str] | None = None) -> tuple[MasterConfig, str]:
    """Parses flags into a validated MasterConfig and the log level; exits(2) with a message on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config_path:
        _apply_config_file(parser, args.config_path)
        args = parser.parse_args(argv)
    cfg = MasterConfig(
        rpc_address=args.rpc_address, port=args.rpc_port or args.port, fast_rpc_port=args.fast_rpc_port,
        max_threads=args.rpc_thread_num or args.max_threads,
        default_kv_lease_ttl_ms=int(args.default_kv_lease_ttl),
        default_kv_soft_pin_ttl_ms=int(args.default_kv_soft_pin_ttl),
        max_kv_soft_pin_ttl_ms=int(args.max_kv_soft_pin_ttl),
        allow_evict_soft_pinned_objects=args.allow_evict_soft_pinned_objects,
        eviction_ratio=args.eviction_ratio, eviction_high_watermark_ratio=args.eviction_high_watermark_ratio,
        exist_grants_lease=args.exist_grants_lease, client_ttl_sec=args.client_ttl,
        put_start_discard_timeout_sec=args.put_start_discard_timeout_sec,
        put_start_release_timeout_sec=args.put_start_release_timeout_sec,
        reservation_idle_sec=args.reservation_idle_sec, max_reservation_bytes=args.max_reservation_size,
        allocation_strategy=args.allocation_strategy, memory_allocator=args.memory_allocator,
        max_total_finished_tasks=args.max_total_finished_tasks,
        max_total_pending_tasks=args.max_total_pending_tasks,
        max_total_processing_tasks=args.max_total_processing_tasks,
        pending_task_timeout_sec=args.pending_task_timeout_sec,
        processing_task_timeout_sec=args.processing_task_timeout_sec,
        enable_metric_reporting=args.enable_metric_reporting, metrics_host=args.metrics_host,
        metrics_port=args.metrics_port, enable_http_metadata_server=args.enable_http_metadata_server,
        http_metadata_server_host=args.http_metadata_server_host,
        http_metadata_server_port=args.http_metadata_server_port, cluster_id=args.cluster_id,
        monitor_interval_ms=args.monitor_interval_ms, offloading_queue_limit=args.offloading_queue_limit,
        enable_snapshot=args.enable_snapshot, snapshot_interval_seconds=args.snapshot_interval_seconds,
        snapshot_retention_count=args.snapshot_retention_count, snapshot_dir=args.snapshot_dir,
        enable_ha=args.enable_ha, ha_backend_type=args.ha_backend_type,
        ha_backend_connstring=args.ha_backend_connstring or args.etcd_endpoints, enable_oplog=args.enable_oplog,
        ha_lease_ttl_sec=args.ha_lease_ttl, oplog_poll_interval_ms=args.oplog_poll_interval_ms,
        oplog_batch_max_entries=args.oplog_batch_max_entries, ha_sync_standbys=args.ha_sync_standbys,
        ha_sync_timeout_ms=args.ha_sync_timeout_ms, ha_sync_port=args.ha_sync_port,
        oplog_retain_ops=args.oplog_retain_ops, oplog_compact_interval_sec=args.oplog_compact_interval_sec)
    try:
        cfg.validate()
    except ValueError as e:
        parser.error(str(e))
    level = args.log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        parser.error(f"--log_level must be DEBUG, INFO, WARNING or ERROR, got {args.log_level!r}")
    return cfg, level


def _snapshot_now(server) -> None:
    """Writes a snapshot of a master with --enable_snapshot (no HA) at once (SIGUSR1); logs and ignores
    the signal otherwise or when writing fails."""
    log = logging.getLogger("mooncake.store.master")
    d = getattr(server, "durability", None)
    if d is None or d.snapshots is None:
        log.warning("SIGUSR1 ignored: no local snapshots (--enable_snapshot without --enable_ha)")
        return
    try:
        log.info("snapshot on SIGUSR1: %s", d.snapshots.take())
    except Exception as e:  # noqa: BLE001  (the master keeps serving; the periodic snapshot goes on)
        log.error("snapshot on SIGUSR1 failed: %s: %s", type(e).__name__, e)


def main(argv: list[str] | None = None) -> int:
    cfg, level = parse_config(argv)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from mooncake.store.master.rpc_server import MasterServer  # after flag parsing: --help stays fast

    server = MasterServer(cfg)
    try:
        server.start()
    except OSError as e:
        print(f"mooncake_master: error: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    wake = threading.Event()  # set by every handled signal; the handlers only set events
    snap_now = threading.Event()  # SIGUSR1: take a snapshot now (--enable_snapshot without HA), in this thread

    def on_signal(sig, _frame) -> None:
        (snap_now if sig == signal.SIGUSR1 else stop).set()
        wake.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    extra = f" metrics {cfg.metrics_host}:{server.admin_port}" if server.admin_port else ""
    if server.metadata_port:
        extra += f" metadata {cfg.http_metadata_server_host}:{server.metadata_port}"
    print(f"mooncake_master listening on {cfg.rpc_address}:{server.port}{extra}", flush=True)
    while not stop.is_set():
        wake.wait(1.0)
        wake.clear()
        if snap_now.is_set() and not stop.is_set():
            snap_now.clear()
            _snapshot_now(server)
    server.stop()
    logging.getLogger("mooncake.store.master").info("mooncake_master stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
