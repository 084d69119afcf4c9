"""Prometheus metrics of the master (``prometheus-client``), one private registry per master instance.

Counters are updated by the service and the RPC layer; gauges (objects, bytes, segments, clients, leases,
tasks) are read from the service's ``snapshot()`` at scrape time, so they cost nothing between scrapes.
Names follow Mooncake's ``master_*`` style (``master_key_count``, ``master_allocated_bytes``, ...).

Threading: the metrics are thread-safe (the per-call ones are store/common/fast_metrics.py's, without
locks); ``count`` may be called with or without the master lock held. The state collector calls the snapshot function, which takes the master lock itself.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily

from mooncake.store.common.errors import code_name
from mooncake.store.common.fast_metrics import FastCounter, FastHistogram

_LATENCY_BUCKETS = (50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 1.6e-3, 3.2e-3, 6.4e-3, 12.8e-3, 25.6e-3, 51.2e-3,
                    0.1, 0.2, 0.4, 0.8, 1.6)


class MasterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # Updated on every call: per-thread cells, no lock (fast_metrics.py)
        self.requests = FastCounter("master_requests", "Store operations by kind; batch items count one by one",
                                    ["op"], registry=r)
        self.failures = FastCounter("master_request_failures", "Operations answered with an error code",
                                    ["op", "code"], registry=r)
        self.evicted_objects = Counter("master_evicted_objects", "Objects evicted", ["reason"], registry=r)
        self.evicted_bytes = Counter("master_evicted_bytes", "Pool bytes freed by eviction", ["reason"], registry=r)
        self.revoked_puts = Counter("master_revoked_puts", "Puts revoked (by the writer or automatically)",
                                    ["reason"], registry=r)
        self.leases_granted = FastCounter("master_leases_granted", "Read leases granted or extended", registry=r)
        self.offload_dropped = Counter("master_offload_dropped",
                                       "Offload tasks dropped because the owner's queue was full", registry=r)
        self.expired_clients = Counter("master_expired_clients", "Clients expired for missing pings", registry=r)
        self.rpc_latency = FastHistogram("master_rpc_latency_seconds", "Server-side RPC handling time", ["method"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self._request_children: dict[str, object] = {}

    def count(self, op: str, code: int = 0, n: int = 1) -> None:
        child = self._request_children.get(op)
        if child is None:
            child = self._request_children[op] = self.requests.labels(op=op)
        child.inc(n)
        if code:
            self.failures.labels(op=op, code=code_name(code)).inc(n)

    def counter_values(self) -> dict:
        """The counters as plain numbers, for the status page: {"requests": {op: n}, "failures": {"op code": n},
        "evicted_objects" / "evicted_bytes" / "revoked_puts": {reason: n}, "leases_granted", "expired_clients",
        "offload_dropped": n}."""
        def by(counter, *labels) -> dict:
            out = {}
            for metric in counter.collect():
                for sample in metric.samples:
                    if sample.name.endswith("_total"):
                        out[" ".join(sample.labels[k] for k in labels)] = sample.value
            return out

        return {"requests": by(self.requests, "op"), "failures": by(self.failures, "op", "code"),
                "evicted_objects": by(self.evicted_objects, "reason"),
                "evicted_bytes": by(self.evicted_bytes, "reason"), "revoked_puts": by(self.revoked_puts, "reason"),
                "leases_granted": sum(by(self.leases_granted).values()),
                "expired_clients": sum(by(self.expired_clients).values()),
                "offload_dropped": sum(by(self.offload_dropped).values())}

    def attach_state(self, snapshot: Callable[[], dict]) -> None:
        """Exports the gauges of ``snapshot()`` (see MasterService.snapshot) at every scrape."""
        self.registry.register(_StateCollector(snapshot))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self._snapshot = snapshot

    def describe(self):
        return []  # keeps registration from calling collect()

    def collect(self):
        s = self._snapshot()
        simple = (("master_key_count", "Committed objects", s["objects"]),
                  ("master_processing_key_count", "Puts in progress", s["pending_puts"]),
                  ("master_allocated_bytes", "Pool bytes allocated (all segments)", s["used_bytes"]),
                  ("master_total_capacity_bytes", "Pool capacity (all segments)", s["capacity_bytes"]),
                  ("master_held_bytes", "Bytes of discarded puts / leased old versions not yet reusable",
                   s["held_bytes"]),
                  ("master_reserved_bytes", "Bytes reserved by clients for one-round-trip puts, not yet used",
                   s["reserved_bytes"]),
                  ("master_active_clients", "Clients alive (pinging)", s["clients"]),
                  ("master_mounted_segments", "Mounted segments", len(s["segments"])),
                  ("master_active_leases", "Objects under a live read lease", s["leases"]),
                  ("master_hard_pinned_objects", "Hard-pinned objects", s["hard_pinned"]),
                  ("master_soft_pinned_objects", "Soft-pinned objects (pin may have expired)", s["soft_pinned"]),
                  ("master_is_leader", "1 while this master serves (leader or single), 0 as a standby",
                   int(s.get("role", "single") != "standby")),
                  ("master_view_version", "View version clients see (changes with every leader/restart)",
                   s["view_version"]),
                  ("master_applied_ops", "Metadata operations applied (ops.py; a standby's replay included)",
                   s.get("applied_ops", 0)),
                  ("master_oplog_lag_ops", "Standby: leader's log records not applied yet (0 on a leader)",
                   s.get("oplog_lag", 0)),
                  ("master_last_snapshot_seq", "Op number of the last snapshot written (-1: none)",
                   s.get("last_snapshot_seq", -1)),
                  ("master_last_snapshot_time_seconds", "Wall-clock time of the last snapshot (0: none)",
                   s.get("last_snapshot_time", 0.0)))
        for name, doc, value in simple:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        used = GaugeMetricFamily("master_segment_used_bytes", "Bytes allocated per segment", labels=["segment", "id"])
        cap = GaugeMetricFamily("master_segment_capacity_bytes", "Capacity per segment", labels=["segment", "id"])
        for seg in s["segments"]:
            used.add_metric([seg["name"], seg["id"]], seg["used_bytes"])
            cap.add_metric([seg["name"], seg["id"]], seg["size"])
        yield used
        yield cap
        tasks = GaugeMetricFamily("master_tasks", "Copy/move tasks by state", labels=["state"])
        for state, n in s["tasks"].items():
            tasks.add_metric([state], n)
        yield tasks
