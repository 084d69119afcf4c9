"""Object metadata: committed objects (in LRU order), puts in progress, leases, pins, held space.

Memory layout (the master must hold tens of millions of keys): a committed object is one dict entry
``key -> Replica`` (or ``key -> tuple[Replica, ...]`` for several replicas); its size is the replicas' size
and every committed memory replica is COMPLETE, so nothing else is stored per object. Leases, soft pins,
hard pins and replication tasks live in side tables that only hold the keys that have them. The ``objects``
dict doubles as the LRU list: a read moves the key to the end (``touch``), eviction walks from the front.

Lease rules (documented contract, see also service.py):
  * ``GetReplicaList`` grants or extends a read lease: deadline = max(current, now + default_kv_lease_ttl).
    The lease protects a reader's transfer: while it is live the object is not evicted, not removed without
    ``force``, not cleared, and an overwrite (upsert) keeps the old buffers until the lease ends.
  * ``ExistKey`` / ``BatchExistKey`` do not grant leases and do not touch the LRU order (unless the master
    runs with ``--exist_grants_lease``): polling for existence can never make an object unevictable
    (Mooncake#2187), nor keep it warm.
  * ``PutEnd`` grants no lease. Soft pins are set by the put and never extended by reads.

Disk replicas (SSD tier, Mooncake's LOCAL_DISK): ``disk`` maps a key to the one file that holds it in some
client's SSD tier (``DiskReplica``: owner, size, the owner's file version). An object is readable while it
has memory replicas (``objects``) or a disk replica or both; memory eviction leaves the disk replica, so the
object lives on as *disk-only* (leases and Exist/GetReplicaList work the same; it is in no LRU order).
Persistence is driven by the segment owner: committing an object with a memory replica in the segment of a
client with an SSD tier creates an ``OffloadTask`` for that client (``offloading``: key -> task, and the
owner's FIFO ``DiskClient.queue``). The owner gets it with a ping, copies the bytes from its own segment and
reports the file with the task's version; the report is accepted only while ``offloading`` still holds that
very task and the object still has that very replica (``Replica`` identity). Every change that could alter
or reuse those bytes (remove, overwrite, in-place upsert, eviction, move, unmount) either cancels the task
or replaces the replica, so a copy taken meanwhile is refused and never served.

Threading: not thread-safe; the master calls everything under its lock.
"""

from __future__ import annotations

import collections
import dataclasses
import enum

from mooncake.store.common.protocol import ReplicaStatus  # noqa: F401  (re-exported)
from mooncake.store.master.segments import Replica


@dataclasses.dataclass(frozen=True)
class PutConfig:
    """Per-object configuration (Mooncake's ReplicateConfig)."""
    replica_num: int = 1
    preferred_segments: tuple[str, ...] = ()
    with_soft_pin: bool = False
    with_hard_pin: bool = False
    soft_pin_ttl_ms: int = 0  # 0: the master's --default_kv_soft_pin_ttl


class PutKind(enum.IntEnum):
    PUT = 0  # new key
    UPSERT_IN_PLACE = 1  # overwrite in the old buffers (same size, not leased): object unreadable meanwhile
    UPSERT_REALLOC = 2  # new buffers; the old version stays readable until the end
    PROMOTE = 3  # a memory copy of a disk-only object (its disk replica stays)


class DiskClient:
    """A client with an SSD tier (MountLocalDisk): where its DiskReplicaService listens, the files the
    master found obsolete and the client did not acknowledge yet (``drops``: (number, key, seq), bounded;
    ``drops_handed``: the highest number answered in a ping) and its offload tasks not handed out yet
    (``queue``, oldest first; ``stale`` of them were cancelled meanwhile and are skipped)."""

    __slots__ = ("client_id", "endpoint", "drops", "drops_handed", "queue", "stale", "dropped")

    def __init__(self, client_id: str, endpoint: str) -> None:
        self.client_id = client_id
        self.endpoint = endpoint
        self.drops: collections.deque[tuple[int, str, int]] = collections.deque()
        self.drops_handed = 0
        self.queue: collections.deque[OffloadTask] = collections.deque()
        self.stale = 0
        self.dropped = 0  # tasks not queued because the queue was full

    @property
    def backlog(self) -> int:
        return len(self.queue) - self.stale


class OffloadTask:
    """Persist ``key``: its memory ``replica`` lies in ``owner``'s segment; ``version`` is unique per task,
    ``created`` the commit time. ``handed``: given to the owner in a ping (no longer in its queue)."""

    __slots__ = ("key", "owner", "replica", "version", "created", "handed")

    def __init__(self, key: str, owner: DiskClient, replica: Replica, version: int, created: float) -> None:
        self.key = key
        self.owner = owner
        self.replica = replica
        self.version = version
        self.created = created
        self.handed = False


class DiskReplica:
    """An object's file in ``owner``'s SSD tier: ``size`` bytes, the owner's version ``seq``."""

    __slots__ = ("owner", "size", "seq")

    def __init__(self, owner: DiskClient, size: int, seq: int) -> None:
        self.owner = owner
        self.size = size
        self.seq = seq

    def __repr__(self) -> str:
        return f"DiskReplica({self.owner.client_id}@{self.owner.endpoint}+{self.size}#{self.seq})"


class PendingPut:
    """A put/upsert between Start and End/Revoke: its replicas are PROCESSING."""

    __slots__ = ("client_id", "size", "replicas", "started", "config", "kind")

    def __init__(self, client_id: str, size: int, replicas: list[Replica], started: float, config: PutConfig,
                 kind: PutKind) -> None:
        self.client_id = client_id
        self.size = size
        self.replicas = replicas
        self.started = started
        self.config = config
        self.kind = kind


class Held:
    """Buffers that are no longer part of any object but cannot be reused yet.

    ``writer`` set: a discarded put whose writer might still be writing (a zombie); released at
    ``release_at`` (--put_start_release_timeout_sec), when that writer ends/revokes it, when the writer's
    client expires, or first of all under memory pressure. ``writer`` empty: an overwritten or force-removed
    version under a read lease; released when the lease ends (``release_at``), never early.
    """

    __slots__ = ("key", "replicas", "release_at", "writer", "sticky")

    def __init__(self, key: str, replicas: tuple[Replica, ...], release_at: float, writer: str = "",
                 sticky: bool = False) -> None:
        self.key = key
        self.replicas = replicas
        self.release_at = release_at
        self.writer = writer
        self.sticky = sticky  # a write into them may still land: the writer's later end/revoke does not free them


def replicas_of(value: Replica | tuple[Replica, ...]) -> tuple[Replica, ...]:
    return (value,) if isinstance(value, Replica) else value


def pack_replicas(replicas) -> Replica | tuple[Replica, ...]:
    """The compact form stored in ``ObjectTable.objects`` (a bare Replica for one replica)."""
    replicas = tuple(replicas)
    return replicas[0] if len(replicas) == 1 else replicas


class ReplicationOp:
    """A copy/move in progress (replication.py): `client_id` copies `source` into the `new` buffers; a move
    retires the source at the end. Durable (ops.ReplicationStart / ReplicationFinish)."""

    __slots__ = ("client_id", "move", "source", "new", "started")

    def __init__(self, client_id: str, move: bool, source: Replica, new: list[Replica], started: float) -> None:
        self.client_id = client_id
        self.move = move
        self.source = source
        self.new = new
        self.started = started


class ObjectTable:
    def __init__(self) -> None:
        self.objects: dict[str, Replica | tuple[Replica, ...]] = {}  # committed; LRU order, oldest first
        self.pending: dict[str, PendingPut] = {}
        self.leases: dict[str, float] = {}  # key -> lease deadline (may hold expired entries until purge)
        self.soft_pins: dict[str, float] = {}  # key -> soft pin deadline
        self.hard_pins: set[str] = set()
        self.busy: dict[str, ReplicationOp] = {}  # key -> copy/move in progress
        self.held: list[Held] = []
        self.disk: dict[str, DiskReplica] = {}  # key -> its file in a client's SSD tier
        self.offloading: dict[str, OffloadTask] = {}  # key -> its pending offload (committed, no file yet)
        # Until this time every object counts as leased (a master that took over cannot know the leases its
        # predecessor granted; durable.take_over sets it one lease TTL ahead).
        self.lease_floor = 0.0

    def touch(self, key: str) -> None:
        """Marks a committed object most recently used."""
        self.objects[key] = self.objects.pop(key)

    def grant_lease(self, key: str, now: float, ttl: float) -> float:
        deadline = now + ttl
        old = self.leases.get(key)
        if old is not None and old > deadline:
            return old
        self.leases[key] = deadline
        return deadline

    def lease_deadline(self, key: str, now: float) -> float:
        """The live lease deadline of `key`, or 0.0 when it holds none."""
        d = self.leases.get(key)
        if now < self.lease_floor:
            return max(d or 0.0, self.lease_floor)
        return d if d is not None and d > now else 0.0

    def commit(self, key: str, replicas, now: float, config: PutConfig, soft_pin_ttl: float) -> None:
        """Makes `replicas` the readable version of `key` (most recently used) and applies the pins."""
        self.objects.pop(key, None)
        self.objects[key] = pack_replicas(replicas)
        self.hard_pins.discard(key)
        self.soft_pins.pop(key, None)
        if config.with_hard_pin:
            self.hard_pins.add(key)
        if config.with_soft_pin:
            self.soft_pins[key] = now + soft_pin_ttl

    def drop(self, key: str) -> tuple[Replica, ...]:
        """Forgets a committed object and its lease/pins; returns its replicas (the caller frees them)."""
        value = self.objects.pop(key, None)
        self.leases.pop(key, None)
        self.soft_pins.pop(key, None)
        self.hard_pins.discard(key)
        return () if value is None else replicas_of(value)

    def unhold_segment(self, seg) -> None:
        """Drops the replicas on `seg` (being unmounted) from the held entries, and entries left with none: held
        entries keep replicas on mounted segments only (as snapshots do), so a ReleaseHeld names each entry (by its
        first replica) alike on every master, one restored from a snapshot included."""
        if not any(r.segment is seg for h in self.held for r in h.replicas):
            return
        kept = []
        for h in self.held:
            if any(r.segment is seg for r in h.replicas):
                h = Held(h.key, tuple(r for r in h.replicas if r.segment is not seg), h.release_at, h.writer,
                         h.sticky)
            if h.replicas:
                kept.append(h)
        self.held = kept

    def purge_expired(self, now: float) -> None:
        """Drops expired lease and soft-pin entries (O(entries); the master runs it about once a second)."""
        for table in (self.leases, self.soft_pins):
            expired = [k for k, d in table.items() if d <= now]
            for k in expired:
                del table[k]

    def live_lease_count(self, now: float) -> int:
        return sum(1 for d in self.leases.values() if d > now)
