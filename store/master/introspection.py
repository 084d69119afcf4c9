"""Read-only views of a MasterService for metrics and the admin HTTP server: ``snapshot`` (counts, usage, every
segment, role and log position) and ``describe_key`` (one key, no lease, no LRU touch). Both take the service
lock; the status sources (``svc.status_sources``: durable.py, ha.py) are called with it held and must not take
it."""

from __future__ import annotations

from mooncake.store.common.errors import ErrorCode
from mooncake.store.master.eviction import object_bytes
from mooncake.store.master.objects import replicas_of


def snapshot(svc) -> dict:
    with svc.lock:
        now = svc.now()
        t = svc.table
        return {
            "objects": len(t.objects), "pending_puts": len(t.pending),
            "disk_replicas": len(t.disk), "disk_clients": len(svc.disk_clients),
            "offload_pending": len(t.offloading),
            "offload_queued": sum(dc.backlog for dc in svc.disk_clients.values()),
            "offload_dropped": sum(dc.dropped for dc in svc.disk_clients.values()),
            "capacity_bytes": svc.segments.capacity, "used_bytes": svc.segments.used,
            "usage": round(svc.segments.usage(), 6),
            "held_bytes": sum(r.segment.allocator.rounded(r.size) for h in t.held for r in h.replicas
                              if r.segment.mounted),
            "reserved_bytes": svc.reserved_bytes(), "reservations": len(svc.reservations),
            "clients": len(svc.clients), "leases": t.live_lease_count(now),
            "hard_pinned": len(t.hard_pins), "soft_pinned": len(t.soft_pins),
            "segments": [s.describe() for s in svc.segments.all()],
            "tasks": svc.tasks.counts(), "view_version": svc.view_version,
            "role": svc.role, "applied_ops": svc.applied_ops, **_status_gauges(svc),
        }


def _status_gauges(svc) -> dict:
    """oplog_lag, last_snapshot_seq/time from the status sources, for /metrics."""
    out = {}
    for source in list(svc.status_sources.values()):
        try:
            d = source()
        except Exception:  # noqa: BLE001  (metrics must not fail with a source)
            continue
        for k in ("oplog_lag", "last_snapshot_seq", "last_snapshot_time"):
            if d.get(k) is not None:
                out[k] = d[k]
    return out


def describe_key(svc, key: str) -> tuple[ErrorCode, dict]:
    with svc.lock:
        now = svc.now()
        t = svc.table
        value = t.objects.get(key)
        d = t.disk.get(key)
        if value is None and d is None:
            return (ErrorCode.REPLICA_IS_NOT_READY if key in t.pending else ErrorCode.OBJECT_NOT_FOUND), {}
        reps = replicas_of(value) if value is not None else ()
        return ErrorCode.OK, {
            "key": key, "size": reps[0].size if reps else d.size,
            "bytes": object_bytes(value) if value is not None else 0,
            "disk_replica": None if d is None else {"client_id": d.owner.client_id, "endpoint": d.owner.endpoint,
                                                    "size": d.size, "seq": d.seq},
            "offload_pending": key in t.offloading,
            "lease_ms_left": int(max(0.0, t.lease_deadline(key, now) - now) * 1000),
            "hard_pinned": key in t.hard_pins, "soft_pinned": t.soft_pins.get(key, 0.0) > now,
            "replicas": [{"segment": r.segment.name, "segment_id": r.segment.id, "address": r.address,
                          "size": r.size, "transport_endpoint": r.segment.te_endpoint} for r in reps],
        }
