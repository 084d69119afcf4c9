"""Handlers of the metadata operations (ops.py): ``HANDLERS[type(op)](svc, op)`` changes the durable state of
MasterService ``svc``. Only ``MasterService._apply`` calls them, with the service lock held.

Every handler is deterministic in (state, op): it reads no clock, lease or random source (the op carries those
decisions). The ``svc._*_locked`` helpers handlers call are for handlers only. Allocator effects (freeing
buffers) take place only on a master whose allocators are live (``svc.allocators_live``; a standby rebuilds
them when it takes over). Handlers may apply nested ops (journaled as part of the outer one, never alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mooncake.store.common.errors import ErrorCode
from mooncake.store.master import ops
from mooncake.store.master.objects import Held, PendingPut, PutKind, ReplicationOp, pack_replicas, replicas_of

if TYPE_CHECKING:
    from mooncake.store.master.service import MasterService

OK = ErrorCode.OK


def _mount(svc: "MasterService", op: ops.MountSegment):
    code, seg = svc.segments.mount(op.client_id, op.seg_id, op.name, op.base, op.size, op.te_endpoint,
                                   op.protocol, op.remount)
    if code == OK:
        svc.clients.register(op.client_id, svc.now())
        for old in svc.segments.superseded_by(seg):  # a dead instance's, under this name (segments.py)
            svc._unmount_locked(old, "superseded")
    return code


def _unmount(svc, op: ops.UnmountSegment):
    seg = svc.segments.get(op.seg_id)
    if seg is not None:
        svc._unmount_locked(seg, op.reason)


def _expire(svc, op: ops.ExpireClient):
    svc._expire_client_locked(op.client_id, op.at)


def _put_start(svc, op: ops.PutStart):
    t = svc.table
    if op.kind == PutKind.UPSERT_IN_PLACE:
        # The object is unreadable until the end (its buffers are being written). drop() also forgets its
        # pins, so a revoked/expired upsert leaves no stale pin entries.
        t.drop(op.key)
        svc.disk_tier.cancel_offload(op.key)  # its bytes are about to change
    t.pending[op.key] = PendingPut(op.client_id, op.size, list(op.replicas), op.started, op.config, op.kind)


def _put_commit(svc, op: ops.PutCommit):
    t = svc.table
    p = t.pending.pop(op.key)
    if p.kind == PutKind.UPSERT_REALLOC and op.key in t.objects:
        svc._retire_locked(op.key, t.objects[op.key], op.old_hold_until)
    svc._commit_new_locked(op.key, p.replicas, op.at, p.config, p.kind != PutKind.PROMOTE)


def _put_revoke(svc, op: ops.PutRevoke):
    t = svc.table
    p = t.pending.pop(op.key)
    svc._free(p.replicas)
    if p.kind == PutKind.UPSERT_IN_PLACE:
        t.drop(op.key)  # its old bytes were partly overwritten: the object is gone


def _put_discard(svc, op: ops.PutDiscard):
    t = svc.table
    p = t.pending.pop(op.key)
    if p.kind == PutKind.UPSERT_IN_PLACE:
        t.drop(op.key)
    t.held.append(Held(op.key, tuple(p.replicas), op.at + svc.config.put_start_release_timeout_sec, p.client_id,
                       sticky=op.reason == "writer_failed"))
    svc.metrics.revoked_puts.labels(reason=op.reason).inc()


def _remove(svc, op: ops.Remove):
    t = svc.table
    key = op.key
    value = t.objects.get(key)
    if value is not None:
        svc._retire_locked(key, value, op.hold_until)
    t.drop(key)
    svc.disk_tier.drop_disk(key)
    svc.disk_tier.cancel_offload(key)
    p = t.pending.get(key)
    if p is not None and p.kind == PutKind.UPSERT_REALLOC:
        p.kind = PutKind.PUT  # the upsert in flight now creates the key afresh
    elif p is not None and p.kind == PutKind.PROMOTE:
        svc._apply(ops.PutDiscard(key, op.at, "removed"))  # nothing left to promote


def _evict(svc, op: ops.Evict):
    freed = 0
    for key in op.keys:
        svc.disk_tier.cancel_offload(key)
        reps = svc.table.drop(key)
        freed += sum(r.segment.allocator.rounded(r.size) for r in reps)
        svc._free(reps)
    return freed


def _set_replicas(svc, op: ops.SetReplicas):
    t = svc.table
    key = op.key
    task = t.offloading.get(key)
    if task is not None and any(r is task.replica for r in op.retired):
        svc.disk_tier.cancel_offload(key)  # its bytes may be reused: no copy of them stands
    if op.replicas:
        t.objects[key] = pack_replicas(op.replicas)  # keeps the object's LRU position
    else:
        t.drop(key)
        if op.drop_disk:
            svc.disk_tier.drop_disk(key)
    if op.hold_until:
        t.held.append(Held(key, tuple(op.retired), op.hold_until))
    else:
        svc._free(op.retired)


def _replication_start(svc, op: ops.ReplicationStart):
    svc.table.busy[op.key] = ReplicationOp(op.client_id, op.move, op.source[0], list(op.replicas), op.started)


def _replication_finish(svc, op: ops.ReplicationFinish):
    """Returns OK, or OBJECT_NOT_FOUND for an "end" whose object lost every replica meanwhile."""
    t = svc.table
    r = t.busy.pop(op.key)
    if op.outcome == "revoke":
        svc._free(r.new)
    elif op.outcome == "abandon":
        t.held.append(Held(op.key, tuple(r.new), op.at + svc.config.put_start_release_timeout_sec, r.client_id,
                           sticky=True))
    elif op.outcome == "end":
        value = t.objects.get(op.key)
        if value is None:  # every replica went meanwhile (a segment unmounted)
            svc._free(r.new)
            return ErrorCode.OBJECT_NOT_FOUND
        if not r.new:  # every target segment went meanwhile: nothing was copied, the object stays as it is
            return ErrorCode.REPLICA_NOT_FOUND
        reps = list(replicas_of(value))
        src = r.source  # matched by place: a replayed op's replicas are new objects
        retired = tuple(x for x in reps if r.move and x.segment is src.segment and x.offset == src.offset)
        reps = [x for x in reps if x not in retired] + r.new
        svc._apply(ops.SetReplicas(op.key, tuple(reps), retired, op.hold_until if retired else 0.0))
    else:
        raise ValueError(f"unknown copy/move outcome {op.outcome!r}")
    return OK


def _release_held(svc, op: ops.ReleaseHeld):
    names = set(op.entries)
    keep = []
    for h in svc.table.held:
        if held_entry(h) in names:
            svc._free(h.replicas)
        else:
            keep.append(h)
    svc.table.held = keep


def _mount_disk(svc, op: ops.MountDisk):
    svc.clients.register(op.client_id, svc.now())
    svc.disk_tier.mount(op.client_id, op.endpoint)


def _unmount_disk(svc, op: ops.UnmountDisk):
    return svc.disk_tier.unmount(op.client_id, op.at)


def _disk_add(svc, op: ops.DiskReplicaAdd):
    svc.disk_tier.add_replica(op.key, op.client_id, op.size, op.seq)


def _disk_remove(svc, op: ops.DiskReplicaRemove):
    svc.disk_tier.remove_replica(op.key, op.at)


def _reserve(svc, op: ops.Reserve):
    svc.reservation_pool.add(op.rid, op.client_id, svc.segments.get(op.seg_id), op.start, op.end, op.at)


def _reserved_commit(svc, op: ops.ReservedCommit):
    svc.reservation_pool.carve(op)


def _release_reservation(svc, op: ops.ReleaseReservation):
    svc.reservation_pool.free(op.rid, op.hold_until)


HANDLERS = {
    ops.MountSegment: _mount, ops.UnmountSegment: _unmount, ops.ExpireClient: _expire,
    ops.PutStart: _put_start, ops.PutCommit: _put_commit, ops.PutRevoke: _put_revoke,
    ops.PutDiscard: _put_discard, ops.Remove: _remove, ops.Evict: _evict, ops.SetReplicas: _set_replicas,
    ops.ReleaseHeld: _release_held, ops.MountDisk: _mount_disk, ops.UnmountDisk: _unmount_disk,
    ops.DiskReplicaAdd: _disk_add, ops.DiskReplicaRemove: _disk_remove, ops.Reserve: _reserve,
    ops.ReservedCommit: _reserved_commit, ops.ReleaseReservation: _release_reservation,
    ops.ReplicationStart: _replication_start, ops.ReplicationFinish: _replication_finish,
}
assert set(HANDLERS) == set(ops.OPS)


def held_entry(h: Held) -> tuple[str, str, int]:
    """The name of a held entry in a ReleaseHeld op."""
    if not h.replicas:
        return h.key, "", 0
    first = h.replicas[0]
    return h.key, first.segment.id, first.offset


__all__ = ["HANDLERS", "held_entry", "replicas_of"]
