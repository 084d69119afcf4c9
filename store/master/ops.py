"""The master's metadata operations: every change of durable state is one of these, applied by
``MasterService.apply`` (the only place where that state changes; handlers in apply.py).

Durable state: mounted segments, committed objects (replicas, pins), puts in progress, buffers held back from
reuse, reserved blocks, SSD-tier clients and their disk replicas. Not durable (rebuilt or re-learnt after a
restart or failover): read leases, the LRU order, client liveness, offload task queues, copy/move tasks not yet
started by their executor, metrics. Copy/move operations in flight are durable (their new buffers are live space
a master that takes over must not hand out while the executor may still write them). Allocator state is derived: a master that takes over rebuilds every segment's free space from
the durable state (``MasterService.rebuild_allocators``).

Contract of an op: it carries every decision a handler would otherwise take from non-durable state (leases, the
clock, random placement), so applying the same ops in the same order to the same state gives the same state on
any master. Times inside ops are the deciding master's clock on the leader; ``encode`` writes them as wall-clock
seconds and ``decode`` maps them to the reader's clock, so a log moves between processes.

Encoding: ``encode(op, to_wall)`` -> JSON-able dict; ``decode(d, segments, from_wall)`` -> op, resolving segment
ids to the reader's ``Segment`` objects (a replica on a segment it does not know raises ``KeyError``: the log
and the state disagree, a bug or a lost record). Ops are immutable once built.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from mooncake.store.master.objects import PutConfig, PutKind
from mooncake.store.master.segments import Replica

Clock = Callable[[float], float]


@dataclasses.dataclass(frozen=True)
class MountSegment:
    client_id: str
    seg_id: str
    name: str
    base: int
    size: int
    te_endpoint: str
    protocol: str
    remount: bool = False


@dataclasses.dataclass(frozen=True)
class UnmountSegment:
    seg_id: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ExpireClient:
    """A client's liveness ran out: its segments, puts, reservations and SSD tier go."""
    client_id: str
    at: float


@dataclasses.dataclass(frozen=True)
class PutStart:
    key: str
    client_id: str
    size: int
    replicas: tuple[Replica, ...]
    started: float
    config: PutConfig
    kind: PutKind


@dataclasses.dataclass(frozen=True)
class PutCommit:
    """The put of `key` by `client_id` becomes readable at `at`; a replaced version's buffers are held until
    `old_hold_until` (0: freed now)."""
    key: str
    client_id: str
    at: float
    old_hold_until: float = 0.0


@dataclasses.dataclass(frozen=True)
class PutRevoke:
    """The writer gave up its put: the buffers are freed now."""
    key: str


@dataclasses.dataclass(frozen=True)
class PutDiscard:
    """A put revoked by the master (stuck, forced, nothing left to promote): the key goes now, its buffers are
    held until `at` + --put_start_release_timeout_sec."""
    key: str
    at: float
    reason: str


@dataclasses.dataclass(frozen=True)
class Remove:
    """A committed object goes (memory and disk replicas); its buffers are held until `hold_until` (a reader's
    lease; 0: freed now)."""
    key: str
    at: float
    hold_until: float = 0.0


@dataclasses.dataclass(frozen=True)
class Evict:
    keys: tuple[str, ...]
    reason: str


@dataclasses.dataclass(frozen=True)
class SetReplicas:
    """A committed object's memory replicas become `replicas` (copy/move end, replica clear; empty: the object
    loses its memory copy, and its disk replica too when `drop_disk`). `retired` replicas are held until
    `hold_until` (0: freed now)."""
    key: str
    replicas: tuple[Replica, ...]
    retired: tuple[Replica, ...]
    hold_until: float = 0.0
    drop_disk: bool = False


@dataclasses.dataclass(frozen=True)
class ReplicationStart:
    """`client_id` starts copying committed `key` from `source` (one replica) into the new buffers `replicas`
    (allocated by the deciding master); a `move` retires the source at the end."""
    key: str
    client_id: str
    move: bool
    source: tuple[Replica, ...]
    replicas: tuple[Replica, ...]
    started: float


@dataclasses.dataclass(frozen=True)
class ReplicationFinish:
    """The copy/move of `key` ends. `outcome`: "end" (the new buffers join the object; a move's source is held
    until `hold_until`, 0: freed), "revoke" (the executor gave up: new buffers freed), "abandon" (timed out or
    cancelled by a forced remove: the executor may still write, so the new buffers are held until
    `at` + --put_start_release_timeout_sec)."""
    key: str
    outcome: str
    at: float
    hold_until: float = 0.0


@dataclasses.dataclass(frozen=True)
class ReleaseHeld:
    """Held buffers become free: each entry (key, segment id, offset) names a held entry by its first replica."""
    entries: tuple[tuple[str, str, int], ...]


@dataclasses.dataclass(frozen=True)
class MountDisk:
    client_id: str
    endpoint: str


@dataclasses.dataclass(frozen=True)
class UnmountDisk:
    client_id: str
    at: float


@dataclasses.dataclass(frozen=True)
class DiskReplicaAdd:
    key: str
    client_id: str
    size: int
    seq: int


@dataclasses.dataclass(frozen=True)
class DiskReplicaRemove:
    key: str
    at: float


@dataclasses.dataclass(frozen=True)
class Reserve:
    rid: int
    client_id: str
    seg_id: str
    start: int
    end: int
    at: float


@dataclasses.dataclass(frozen=True)
class ReservedCommit:
    """Objects carved off block `rid` back to back from its cursor: keys[i] (sizes[i] bytes) is committed when
    stored[i], else its space returns to the pool."""
    rid: int
    keys: tuple[str, ...]
    sizes: tuple[int, ...]
    stored: tuple[bool, ...]
    at: float
    config: PutConfig


@dataclasses.dataclass(frozen=True)
class ReleaseReservation:
    """Block `rid` goes; its part not carved yet is freed, or held until `hold_until` (a write into it may
    still land) with the block's client as the writer."""
    rid: int
    hold_until: float = 0.0


OPS = (MountSegment, UnmountSegment, ExpireClient, PutStart, PutCommit, PutRevoke, PutDiscard, Remove, Evict,
       SetReplicas, ReleaseHeld, MountDisk, UnmountDisk, DiskReplicaAdd, DiskReplicaRemove, Reserve,
       ReservedCommit, ReleaseReservation, ReplicationStart, ReplicationFinish)
_BY_NAME = {cls.__name__: cls for cls in OPS}
_TIME_FIELDS = frozenset(("started", "at", "old_hold_until", "hold_until"))
_REPLICA_FIELDS = frozenset(("replicas", "retired", "source"))


def _enc_replicas(reps) -> list:
    return [[r.segment.id, r.offset, r.size] for r in reps]


def encode_config(c: PutConfig) -> list:
    return [c.replica_num, list(c.preferred_segments), c.with_soft_pin, c.with_hard_pin, c.soft_pin_ttl_ms]


def decode_config(v) -> PutConfig:
    return PutConfig(int(v[0]), tuple(v[1]), bool(v[2]), bool(v[3]), int(v[4]))


_FIELD_KINDS: dict[type, tuple] = {}  # op class -> ((field name, how it encodes), ...): fields() is slow per call


def _field_kinds(cls) -> tuple:
    kinds = _FIELD_KINDS.get(cls)
    if kinds is None:
        def kind(name: str) -> str:
            if name in _REPLICA_FIELDS:
                return "replicas"
            if name in ("config", "kind"):
                return name
            return "time" if name in _TIME_FIELDS else "plain"
        kinds = _FIELD_KINDS[cls] = tuple((f.name, kind(f.name)) for f in dataclasses.fields(cls))
    return kinds


def encode(op, to_wall: Clock) -> dict:
    """The JSON-able form of `op` (``{"op": name, field: value...}``); times become wall-clock seconds (0 stays
    0: "none")."""
    cls = type(op)
    out = {"op": cls.__name__}  # field names never clash with "op" or a log's "lsn"
    for name, kind in _field_kinds(cls):
        v = getattr(op, name)
        if kind == "plain":
            if isinstance(v, tuple):
                v = [list(e) if isinstance(e, tuple) else e for e in v]
        elif kind == "replicas":
            v = _enc_replicas(v)
        elif kind == "config":
            v = encode_config(v)
        elif kind == "kind":
            v = int(v)
        else:
            v = to_wall(v) if v else 0.0
        out[name] = v
    return out


def decode(d: dict, segment_of: Callable[[str], object], from_wall: Clock):
    """The op `d` encodes (see encode). `segment_of(seg_id)` gives the reader's Segment or None. Raises
    ValueError for an unknown op or a malformed record, KeyError for a replica on an unknown segment."""
    if not isinstance(d, dict):
        raise ValueError(f"op record is not an object: {d!r}")
    cls = _BY_NAME.get(d.get("op"))
    if cls is None:
        raise ValueError(f"unknown op {d.get('op')!r}")
    kw = {}
    try:
        for f in dataclasses.fields(cls):
            if f.name not in d:
                if f.default is dataclasses.MISSING:
                    raise ValueError(f"{cls.__name__}: missing field {f.name!r}")
                continue
            v = d[f.name]
            if f.name in _REPLICA_FIELDS:
                reps = []
                for seg_id, offset, size in v:
                    seg = segment_of(seg_id)
                    if seg is None:
                        raise KeyError(f"{cls.__name__} of {d.get('key')!r}: unknown segment {seg_id!r}")
                    reps.append(Replica(seg, int(offset), int(size)))
                v = tuple(reps)
            elif f.name == "config":
                v = decode_config(v)
            elif f.name == "kind":
                v = PutKind(int(v))
            elif f.name in _TIME_FIELDS:
                v = from_wall(float(v)) if v else 0.0
            elif f.name == "entries":
                v = tuple((str(k), str(s), int(o)) for k, s, o in v)
            elif f.name in ("keys",):
                v = tuple(str(k) for k in v)
            elif f.name in ("sizes",):
                v = tuple(int(n) for n in v)
            elif f.name == "stored":
                v = tuple(bool(b) for b in v)
            kw[f.name] = v
        return cls(**kw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"malformed {cls.__name__} record: {e}") from None
