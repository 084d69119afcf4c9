"""The master's core: segments, objects, leases, eviction, liveness and crashed-put recovery.

Every public method is thread-safe: it takes the service lock for its whole duration (batch forms take it
once for all items), so concurrent RPCs see a serial order. Methods never raise for bad input: they return
an ErrorCode (reference §2.4). They return plain Python values; ``Replica`` objects handed out are
immutable and may be read after the lock is released.

Put protocol: ``put_start`` allocates one buffer per replica (PROCESSING; the key is not readable) ->
the client writes them with the Transfer Engine -> ``put_end`` commits (COMPLETE, readable) or
``put_revoke`` frees them. Objects are immutable: ``put_start`` on a committed key is OBJECT_ALREADY_EXISTS
(the client reports success); ``upsert_start`` overwrites (in place when the size and replica count are
unchanged and no reader holds a lease, else in new buffers while the old version stays readable).

Crashed or stuck writers (Mooncake#974): a put still PROCESSING after --put_start_discard_timeout_sec is
revoked by the monitor: the key disappears at once (new puts may proceed) and its buffers are *held* until
--put_start_release_timeout_sec, until the writer ends/revokes it, until the writer's client expires, or
until the pool needs the space, whichever comes first (a late writer must not scribble over buffers that
already belong to another object while that can be avoided). Puts of an expired client are revoked and
freed at once.

SSD tier (disk_tier.py; state in objects.py, "Disk replicas"): a client with an SSD tier mounts it
(``mount_local_disk``, with the endpoint where it serves its files). Persistence is owner-driven, as in Mooncake:
committing an object with a memory replica in that client's segment (whoever wrote it) queues an offload task for
it (at most --offloading_queue_limit queued per owner; beyond, the task is dropped and counted); the owner takes
its tasks with its pings (``take_offload_tasks``), copies the bytes from its own memory into a file and reports
it (``notify_offload`` with the task's version; its whole tier again after a restart or a remount), and reports
the files it deleted (``evict_disk_replicas``). Readers get the LOCAL_DISK replica with the memory ones; memory
eviction keeps it, and spares fresh objects whose file is pending while it can (an object evicted before its
owner persisted it is gone). Removing or overwriting an object drops its disk replica and queues the file for
deletion by its owner (``take_disk_drops``, answered in the owner's pings until it acknowledges them; offload
tasks are handed out once); an owner that unmounts or expires loses all its disk replicas and tasks.
``put_start(promote=True)`` gives a disk-only object a memory replica again (a hot object; the disk replica
stays).

Durable state changes only in ``apply`` (ops.py lists the operations, apply.py their handlers): a public
method validates and decides (placement, leases, the clock), then applies the op that carries the decision;
``journal`` (durable.py, ha.py) records each one, and a standby or a restarted master applies the same ops to
get the same state. The SSD tier (disk_tier.DiskTier) and reserved blocks (reservations.ReservationPool) are
composed parts sharing the lock, as are copy/move operations and tasks (replication.Replicator); their RPC
entry points are delegated under the names below.

The monitor (``tick``, run by ``start_monitor`` every --monitor_interval_ms) expires silent clients,
revokes stuck puts and copy/move operations, releases held buffers, fails overdue tasks, purges expired
lease entries and evicts when usage reaches the high watermark (a round that finds nothing evictable, e.g.
everything leased or pinned, is retried after 1 s rather than every period).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable

from mooncake.store.master.config import MAX_KEY_BYTES, MAX_REPLICA_NUM, MasterConfig
from mooncake.store.common.errors import ErrorCode
from mooncake.store.master.eviction import select_victims
from mooncake.store.master.key_pattern import KeyPattern
from mooncake.store.master.liveness import ClientRegistry
from mooncake.store.master.metrics import MasterMetrics
from mooncake.store.master import introspection, ops
from mooncake.store.master.apply import HANDLERS, held_entry
from mooncake.store.master.disk_tier import DiskTier
from mooncake.store.master.objects import Held, ObjectTable, PendingPut, PutConfig, PutKind, replicas_of
from mooncake.store.master.replication import Replicator
from mooncake.store.master.reservations import ReservationPool
from mooncake.store.master.segments import Replica, Segment, SegmentRegistry, SegmentSpec  # noqa: F401
from mooncake.store.master.tasks import TaskManager

_log = logging.getLogger("mooncake.store.master")

OK = ErrorCode.OK
_PURGE_PERIOD_SEC = 1.0
_EVICT_BACKOFF_SEC = 1.0  # after a watermark round that found nothing to evict (scans cost O(objects))
_MAX_SHARED_SIZES = 4096  # distinct object sizes whose int objects are shared (28 B saved per object)
_SCAN_CHUNK = 1024  # keys a regex call acts on per lock hold
# After restoring durable state (restart, failover), a PutEnd of a committed key answers OK for this long: its
# writer retries a call the previous master ran (clients retry within MC_RPC_TIMEOUT_MS, 30 s by default).
RETRY_WINDOW_SEC = 30.0


def _key_pattern(pattern: str, what: str) -> KeyPattern | None:
    """The compiled pattern of a regex call, or None (logged) when KeyPattern refuses it."""
    try:
        return KeyPattern(pattern)
    except ValueError as e:
        _log.warning("%s: pattern refused: %s", what, e)
        return None


class MasterService:
    def __init__(self, config: MasterConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 metrics: MasterMetrics | None = None, rng: random.Random | None = None) -> None:
        self.config = config = config or MasterConfig()
        config.validate()
        self._clock = clock
        self._lock = threading.Lock()
        self.metrics = metrics or MasterMetrics()
        self._rng = rng
        # A fresh random view version per master process: clients see a restart as a version change (with HA:
        # the leader's view number, ha.py).
        self.view_version = random.SystemRandom().getrandbits(63) or 1
        self.lease_ttl = config.default_kv_lease_ttl_ms / 1000.0
        # Durable changes (ops.py): `journal` (None or an object with append(op)) gets every top-level op
        # applied, in order; `applied_ops` counts them. A standby applies ops with its allocators not live (it
        # frees nothing) and rebuilds them when it takes over (durable.rebuild_allocators).
        self.journal = None
        self._calls = threading.local()
        self.gate = None  # ha.Gate with HA: the RPC layer asks it whether to serve, and waits for the log
        self.reset_state()
        # Role and HA/durability status for /health, /role, /ha_status (name -> callable giving a dict)
        self.role = "single"  # "leader" or "standby" with HA (ha.py)
        self.status_sources: dict[str, Callable[[], dict]] = {}
        self.wall = time.time  # wall clock: op logs and snapshots carry wall-clock times (ops.py)
        self._monitor: threading.Thread | None = None
        self._stop = threading.Event()
        self.metrics.attach_state(self.snapshot)

    def reset_state(self) -> None:
        """(Re)creates empty metadata: at construction, and for a master that lost leadership (ha.py; lock held)."""
        config, clock = self.config, self._clock
        self.segments = SegmentRegistry(config.allocation_strategy, self._rng, clock,
                                        config.default_kv_lease_ttl_ms / 1000.0)
        self.table = ObjectTable()
        self.clients = ClientRegistry(config.client_ttl_sec)
        self.tasks = TaskManager(config.max_total_pending_tasks, config.max_total_processing_tasks,
                                 config.max_total_finished_tasks, config.pending_task_timeout_sec,
                                 config.processing_task_timeout_sec)
        self.replicator = Replicator(self)
        self._next_purge = 0.0
        self._next_watermark_evict = 0.0
        self._sizes: dict[int, int] = {}
        self.disk_tier = DiskTier(self)
        self.reservation_pool = ReservationPool(self)
        self.applied_ops = 0
        self.allocators_live = True
        self._apply_depth = 0
        self.taken_over_at = None  # when this master restored/took over durable state (durable.take_over)

    # -- locking helpers used by replication.py ---------------------------------------------------------------
    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def now(self) -> float:
        return self._clock()

    # -- composed parts, under the names the RPC layer and tests use ----------------------------------------------
    @property
    def disk_clients(self):
        return self.disk_tier.clients

    @property
    def reservations(self):
        return self.reservation_pool.blocks

    # ======================================================================================================
    # The one place where durable state changes (ops.py, apply.py)
    # ======================================================================================================
    def apply(self, op):
        """Applies `op` (a standby replaying the leader's log, a restore); takes the lock. Returns the
        handler's result. Raises what the handler raises for an op that does not fit the state (KeyError:
        e.g. a commit of an unknown put), leaving the state as far as the handler got."""
        with self._lock:
            return self._apply(op)

    def _apply(self, op):
        top = self._apply_depth == 0
        self._apply_depth += 1
        try:
            result = HANDLERS[type(op)](self, op)
        finally:
            self._apply_depth -= 1
        if top:
            self.applied_ops += 1
            self._calls.lsn = self.applied_ops
            if self.journal is not None:
                self.journal.append(op)
        return result

    def begin_call(self) -> None:
        self._calls.lsn = 0

    def call_lsn(self) -> int:
        """The last op the calling thread applied since begin_call, else the last op anyone applied (what the
        call may have seen): its reply waits until the log holds it (ha.py)."""
        return getattr(self._calls, "lsn", 0) or self.applied_ops

    # ======================================================================================================
    # Segments and clients
    # ======================================================================================================
    def mount_segment(self, client_id: str, spec: SegmentSpec) -> ErrorCode:
        with self._lock:
            code = self._mount_locked(client_id, spec)
            self.metrics.count("mount_segment", code)
            return code

    def remount_segments(self, client_id: str, specs: list[SegmentSpec]) -> ErrorCode:
        """Registers the client as alive and mounts all `specs` (already mounted ones are fine). Returns the
        first error, after trying every segment."""
        with self._lock:
            if not client_id:
                return ErrorCode.INVALID_PARAMS
            self.clients.register(client_id, self._clock())
            first = OK
            for spec in specs:
                code = self._mount_locked(client_id, spec, remount=True)
                if code != OK and first == OK:
                    first = code
            self.metrics.count("remount_segment", first)
            return first

    def unmount_segment(self, client_id: str, segment_id: str) -> ErrorCode:
        """Idempotent (unknown id: OK). ILLEGAL_CLIENT when another client owns the segment."""
        with self._lock:
            seg = self.segments.get(segment_id)
            if seg is None:
                code = OK if client_id and segment_id else ErrorCode.INVALID_PARAMS
            elif seg.client_id != client_id:
                code = ErrorCode.ILLEGAL_CLIENT
            else:
                self._apply(ops.UnmountSegment(seg.id, "unmount"))
                code = OK
            self.metrics.count("unmount_segment", code)
            return code

    def ping(self, client_id: str) -> tuple[ErrorCode, bool]:
        """(OK, alive). alive False means NEED_REMOUNT (see liveness.py)."""
        if not client_id:
            return ErrorCode.INVALID_PARAMS, False
        with self._lock:
            return OK, self.clients.ping(client_id, self._clock())

    def _mount_locked(self, client_id: str, spec: SegmentSpec, remount: bool = False) -> ErrorCode:
        code = self.segments.check_mount(client_id, spec.id, spec.name, spec.base, spec.size, spec.te_endpoint,
                                         spec.protocol)
        if code != OK:
            return code
        if self.segments.get(spec.id) is not None:  # mounted already with these parameters
            self.clients.register(client_id, self._clock())
            return OK
        return self._apply(ops.MountSegment(client_id, spec.id, spec.name, spec.base, spec.size, spec.te_endpoint,
                                            spec.protocol, remount))

    def _unmount_locked(self, seg: Segment, reason: str) -> None:
        """Unmounts `seg` and drops every replica on it; objects left without replicas disappear (handlers)."""
        had_data = seg.allocator.used_bytes > 0 or not self.allocators_live
        self.reservation_pool.drop(segment=seg)
        self.segments.unmount(seg.id)
        if not had_data:
            return
        objects = self.table.objects
        for key, value in list(objects.items()):
            reps = replicas_of(value)
            if not any(r.segment is seg for r in reps):
                continue
            task = self.table.offloading.get(key)
            if task is not None and task.replica.segment is seg:
                self.disk_tier.cancel_offload(key)
            remaining = tuple(r for r in reps if r.segment is not seg)
            if remaining:
                objects[key] = remaining[0] if len(remaining) == 1 else remaining
            else:
                self.table.drop(key)
        for key, p in list(self.table.pending.items()):
            p.replicas = [r for r in p.replicas if r.segment is not seg]
            if not p.replicas:
                del self.table.pending[key]
                self.metrics.revoked_puts.labels(reason=reason).inc()
        self.table.unhold_segment(seg)
        self.replicator.on_segment_unmounted(seg)
        _log.info("segment %s (%s) of client %s unmounted (%s)", seg.id, seg.name, seg.client_id, reason)

    def _expire_client_locked(self, client_id: str, at: float) -> None:
        """The ExpireClient handler's work (apply.py)."""
        for seg in self.segments.of_client(client_id):
            self._unmount_locked(seg, "client_expired")
        for key, p in list(self.table.pending.items()):
            if p.client_id == client_id:
                del self.table.pending[key]
                self._free(p.replicas)
                self.metrics.revoked_puts.labels(reason="client_expired").inc()
        self._release_held(lambda h: h.writer == client_id)
        self.reservation_pool.drop(client_id=client_id)
        self.disk_tier.unmount(client_id, at)
        self.replicator.on_client_expired(client_id)
        self.clients.forget(client_id)
        self.metrics.expired_clients.inc()
        _log.warning("client %s expired (no ping for %.1f s): its segments were unmounted", client_id,
                     self.clients.ttl)

    # ======================================================================================================
    # Put / upsert
    # ======================================================================================================
    def put_start(self, client_id: str, key: str, size: int, config: PutConfig = PutConfig(),
                  promote: bool = False) -> tuple[ErrorCode, list[Replica]]:
        """promote: memory for an object that only has a disk replica of `size` bytes (OBJECT_NOT_FOUND
        without one, OBJECT_ALREADY_EXISTS when it has memory replicas, INVALID_PARAMS for another size)."""
        with self._lock:
            return self._start_locked(client_id, key, size, config, False, self._clock(), promote)

    def batch_put_start(self, client_id: str, keys: list[str], sizes: list[int], config: PutConfig = PutConfig(),
                        promote: bool = False) -> list[tuple[ErrorCode, list[Replica]]]:
        """One result per key; mismatched lengths give INVALID_PARAMS for every key."""
        return self._batch_start(client_id, keys, sizes, config, False, promote)

    def upsert_start(self, client_id: str, key: str, size: int, config: PutConfig = PutConfig()
                     ) -> tuple[ErrorCode, list[Replica]]:
        with self._lock:
            return self._start_locked(client_id, key, size, config, True, self._clock())

    def batch_upsert_start(self, client_id: str, keys: list[str], sizes: list[int], config: PutConfig = PutConfig()
                           ) -> list[tuple[ErrorCode, list[Replica]]]:
        return self._batch_start(client_id, keys, sizes, config, True)

    def _batch_start(self, client_id, keys, sizes, config, upsert, promote=False
                     ) -> list[tuple[ErrorCode, list[Replica]]]:
        if len(keys) != len(sizes):
            return [(ErrorCode.INVALID_PARAMS, [])] * len(keys)
        with self._lock:
            now = self._clock()
            return [self._start_locked(client_id, k, s, config, upsert, now, promote) for k, s in zip(keys, sizes)]

    def put_end(self, client_id: str, key: str) -> ErrorCode:
        """Commits the put/upsert of `key` (the same call ends an upsert)."""
        with self._lock:
            return self._end_locked(client_id, key, self._clock())

    def put_revoke(self, client_id: str, key: str) -> ErrorCode:
        with self._lock:
            return self._revoke_locked(client_id, key, self._clock())

    def batch_put_end(self, client_id: str, keys: list[str]) -> list[ErrorCode]:
        with self._lock:
            now = self._clock()
            return [self._end_locked(client_id, k, now) for k in keys]

    def batch_put_revoke(self, client_id: str, keys: list[str], unsettled: bool = False) -> list[ErrorCode]:
        """The writer gives its puts up. `unsettled`: its writes failed in a way that may still land (a
        timeout), so each key goes as a discarded put does: its buffers are held, not freed for reuse."""
        with self._lock:
            now = self._clock()
            return [self._revoke_locked(client_id, k, now, unsettled) for k in keys]

    def _check_key(self, key: str) -> ErrorCode:
        if not key:
            return ErrorCode.INVALID_PARAMS
        if len(key) > MAX_KEY_BYTES // 4 and len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            return ErrorCode.INVALID_KEY  # the limit is in UTF-8 bytes (a char is 1..4 of them)
        return OK

    def _start_locked(self, client_id: str, key: str, size: int, cfg: PutConfig, upsert: bool, now: float,
                      promote: bool = False) -> tuple[ErrorCode, list[Replica]]:
        op = "upsert_start" if upsert else "promote_start" if promote else "put_start"
        code, replicas = self._start_checked(client_id, key, size, cfg, upsert, now, promote)
        self.metrics.count(op, code)
        return code, replicas

    def _start_checked(self, client_id, key, size, cfg, upsert, now, promote=False
                       ) -> tuple[ErrorCode, list[Replica]]:
        code = self._check_key(key)
        if code != OK:
            return code, []
        if not client_id or size <= 0 or not 1 <= cfg.replica_num <= MAX_REPLICA_NUM:
            return ErrorCode.INVALID_PARAMS, []
        t = self.table
        p = t.pending.get(key)
        if (p is not None and self.taken_over_at is not None and p.started <= self.taken_over_at
                and p.client_id == client_id and p.size == size and len(p.replicas) <= cfg.replica_num):
            # Its writer retries a PutStart the previous master answered (or not) before it went: the same
            # buffers, which the writer may have written already.
            return OK, list(p.replicas)
        if self._put_in_progress_locked(key, now):
            return (ErrorCode.OBJECT_REPLICA_BUSY if upsert else ErrorCode.OBJECT_ALREADY_EXISTS), []
        old = t.objects.get(key)
        kind = PutKind.PUT
        if promote and not upsert:
            if old is not None:
                return ErrorCode.OBJECT_ALREADY_EXISTS, []
            d = t.disk.get(key)
            if d is None:
                return ErrorCode.OBJECT_NOT_FOUND, []
            if d.size != size:
                return ErrorCode.INVALID_PARAMS, []
            kind = PutKind.PROMOTE
        elif old is None and not upsert and key in t.disk:
            return ErrorCode.OBJECT_ALREADY_EXISTS, []  # a disk-only object exists like any other
        if old is not None:
            if not upsert:
                return ErrorCode.OBJECT_ALREADY_EXISTS, []
            if key in t.busy or self.tasks.has_task(key):
                return ErrorCode.OBJECT_HAS_REPLICATION_TASK, []
            old_reps = replicas_of(old)
            if (old_reps[0].size == size and len(old_reps) == cfg.replica_num
                    and not t.lease_deadline(key, now)):
                # Overwrite in place (apply.py: the object is unreadable until the end).
                self._apply(ops.PutStart(key, client_id, size, tuple(old_reps), now, cfg, PutKind.UPSERT_IN_PLACE))
                return OK, list(old_reps)
            kind = PutKind.UPSERT_REALLOC
        size = self._shared_size(size)
        replicas = self._allocate_locked(size, cfg.replica_num, cfg.preferred_segments, now)
        if not replicas:
            return ErrorCode.NO_AVAILABLE_HANDLE, []
        self._apply(ops.PutStart(key, client_id, size, tuple(replicas), now, cfg, kind))
        return OK, replicas

    def _put_in_progress_locked(self, key: str, now: float) -> bool:
        """Whether another put of `key` is in progress; one stuck for put_start_discard_timeout_sec is revoked
        instead (a new writer pre-empts it)."""
        p = self.table.pending.get(key)
        if p is None:
            return False
        if now - p.started < self.config.put_start_discard_timeout_sec:
            return True
        self._discard_locked(key, p, now, "timeout")
        return False

    def _end_locked(self, client_id: str, key: str, now: float) -> ErrorCode:
        code = self._end_checked(client_id, key, now)
        self.metrics.count("put_end", code)
        return code

    def _end_checked(self, client_id: str, key: str, now: float) -> ErrorCode:
        if not key:  # held reservation rests have the empty key: never released by a put's end
            return ErrorCode.INVALID_PARAMS
        t = self.table
        p = t.pending.get(key)
        if p is None or p.client_id != client_id:
            if self._release_held(lambda h: h.key == key and h.writer == client_id and not h.sticky):
                return ErrorCode.OBJECT_NOT_FOUND  # its put was revoked; the late writer's buffers are freed now
            if p is not None:
                return ErrorCode.ILLEGAL_CLIENT
            if key in t.objects and self.taken_over_at is not None and now - self.taken_over_at < RETRY_WINDOW_SEC:
                return OK  # a PutEnd retried after a restart/failover: the previous master committed it
            return ErrorCode.INVALID_WRITE if key in t.objects else ErrorCode.OBJECT_NOT_FOUND
        hold = t.lease_deadline(key, now) if p.kind == PutKind.UPSERT_REALLOC and key in t.objects else 0.0
        self._apply(ops.PutCommit(key, client_id, now, hold))
        return OK

    def _commit_new_locked(self, key: str, replicas, now: float, cfg: PutConfig, new_version: bool = True) -> None:
        """Makes `replicas` the readable version of `key` with cfg's pins."""
        ttl_ms = min(cfg.soft_pin_ttl_ms or self.config.default_kv_soft_pin_ttl_ms, self.config.max_kv_soft_pin_ttl_ms)
        self.table.commit(key, replicas, now, cfg, ttl_ms / 1000.0)
        if new_version:
            # A new version: an older file of the key is obsolete; the owner of its memory (if it has an SSD
            # tier) is to persist this one.
            self.disk_tier.drop_disk(key)
            self.disk_tier.cancel_offload(key)
            self.disk_tier.queue_offload(key, replicas, now)

    def _shared_size(self, size: int) -> int:
        """KV caches use few distinct sizes: objects share the int objects of the first _MAX_SHARED_SIZES."""
        if len(self._sizes) < _MAX_SHARED_SIZES:
            size = self._sizes.setdefault(size, size)
        return size

    def _revoke_locked(self, client_id: str, key: str, now: float, unsettled: bool = False) -> ErrorCode:
        if not key:  # as in _end_checked
            self.metrics.count("put_revoke", ErrorCode.INVALID_PARAMS)
            return ErrorCode.INVALID_PARAMS
        t = self.table
        p = t.pending.get(key)
        if p is None or p.client_id != client_id:
            if not unsettled and self._release_held(lambda h: h.key == key and h.writer == client_id and
                                                    not h.sticky):
                code = OK  # its put was revoked already; the late writer's buffers are freed now
            else:
                code = ErrorCode.OBJECT_NOT_FOUND if p is None else ErrorCode.ILLEGAL_CLIENT
        elif unsettled:  # its writes may still land: the key goes, its buffers are held (sticky)
            self._discard_locked(key, p, now, "writer_failed")
            code = OK
        else:
            self._apply(ops.PutRevoke(key))
            self.metrics.revoked_puts.labels(reason="client").inc()
            code = OK
        self.metrics.count("put_revoke", code)
        return code

    def _discard_locked(self, key: str, p: PendingPut, now: float, reason: str) -> None:
        """Revokes a stuck put: the key goes now, its buffers are held (see module docstring)."""
        self._apply(ops.PutDiscard(key, now, reason))
        _log.log(logging.WARNING if reason == "timeout" else logging.INFO,
                 "put of %r by client %s revoked (%s) after %.1f s in PROCESSING", key, p.client_id, reason,
                 now - p.started)

    def _retire_locked(self, key: str, value, hold_until: float) -> None:
        """Frees the buffers of a replaced/removed version, or holds them until `hold_until` (a reader's lease;
        the op's decision). For handlers."""
        if hold_until:
            self.table.held.append(Held(key, replicas_of(value), hold_until))
        else:
            self._free(replicas_of(value))

    # -- allocation and eviction ----------------------------------------------------------------------------
    def _allocate_locked(self, size: int, replica_num: int, preferred, now: float,
                         exclude: frozenset[str] | set[str] = frozenset()) -> list[Replica]:
        replicas = self.segments.allocate(size, replica_num, preferred, exclude)
        if replicas or not self._fits_somewhere(size):
            return replicas
        # Out of room: reclaim held buffers of discarded puts first, then evict (LRU) and try once more.
        if self._release_held(lambda h: bool(h.writer)):
            replicas = self.segments.allocate(size, replica_num, preferred, exclude)
            if replicas:
                return replicas
        need = max(int(self.config.eviction_ratio * self.segments.capacity), size * replica_num)
        self._evict_locked(need, now, "alloc_failure")
        return self.segments.allocate(size, replica_num, preferred, exclude)

    def _fits_somewhere(self, size: int) -> bool:
        return any(seg.allocator.capacity >= size for seg in self.segments.all())

    def _evict_locked(self, target: int, now: float, reason: str) -> int:
        victims, _ = select_victims(self.table, now, target, self.config.allow_evict_soft_pinned_objects)
        if victims:
            freed = self._apply(ops.Evict(tuple(victims), reason))
            self.metrics.evicted_objects.labels(reason=reason).inc(len(victims))
            self.metrics.evicted_bytes.labels(reason=reason).inc(freed)
            _log.info("evicted %d objects (%d bytes, %s)", len(victims), freed, reason)
        return len(victims)

    def _free(self, replicas) -> None:
        """Returns buffers to their segments' allocators (nothing on a standby: its allocators are rebuilt)."""
        if self.allocators_live:
            for r in replicas:
                self.segments.release(r)

    def _release_held(self, match: Callable[[Held], bool]) -> int:
        """Frees every held entry for which `match` is true (one ReleaseHeld op); returns how many."""
        entries = tuple(held_entry(h) for h in self.table.held if match(h))
        if entries:
            self._apply(ops.ReleaseHeld(entries))
        return len(entries)

    # ======================================================================================================
    # Reads
    # ======================================================================================================
    def exist(self, key: str) -> tuple[ErrorCode, bool]:
        with self._lock:
            return self._exist_locked(key, self._clock())

    def batch_exist(self, keys: list[str]) -> list[tuple[ErrorCode, bool]]:
        with self._lock:
            now = self._clock()
            return [self._exist_locked(k, now) for k in keys]

    def _exist_locked(self, key: str, now: float) -> tuple[ErrorCode, bool]:
        code = self._check_key(key)
        self.metrics.count("exist", code)
        if code != OK:
            return code, False
        found = key in self.table.objects or key in self.table.disk
        if found and self.config.exist_grants_lease:
            self.table.grant_lease(key, now, self.lease_ttl)
        return OK, found

    def get_replica_list(self, key: str) -> tuple[ErrorCode, list, int]:
        """(code, COMPLETE replicas, lease ms left). Grants a read lease and marks the object recently used.
        The replicas are the memory ones (``Replica``) then the disk one (``DiskReplica``) if any.
        REPLICA_IS_NOT_READY while the first put is in progress; OBJECT_NOT_FOUND if absent."""
        with self._lock:
            return self._get_locked(key, self._clock())

    def batch_get_replica_list(self, keys: list[str]) -> list[tuple[ErrorCode, list[Replica], int]]:
        with self._lock:
            now = self._clock()
            return [self._get_locked(k, now) for k in keys]

    def get_replica_list_by_regex(self, pattern: str) -> tuple[ErrorCode, dict[str, tuple[list[Replica], int]]]:
        """Every committed key matching `pattern` (key_pattern.py: RE2 syntax, searched anywhere in the key),
        each leased. INVALID_PARAMS for a pattern KeyPattern refuses. The keys are matched outside the lock
        (see _matching_keys); a key removed meanwhile is left out."""
        rx = _key_pattern(pattern, "get_replica_list_by_regex")
        if rx is None:
            return ErrorCode.INVALID_PARAMS, {}
        out = {}
        for chunk in self._matching_keys(rx):
            with self._lock:
                now = self._clock()
                t = self.table
                for k in chunk:
                    if k in t.objects or k in t.disk:
                        _, reps, lease_ms = self._get_locked(k, now)
                        out[k] = (reps, lease_ms)
        return OK, out

    def _get_locked(self, key: str, now: float) -> tuple[ErrorCode, list, int]:
        t = self.table
        value = t.objects.get(key)
        d = t.disk.get(key)
        if value is None and d is None:
            code = self._check_key(key)
            if code == OK:
                code = ErrorCode.REPLICA_IS_NOT_READY if key in t.pending else ErrorCode.OBJECT_NOT_FOUND
            self.metrics.count("get_replica_list", code)
            return code, [], 0
        reps = []
        if value is not None:
            t.touch(key)
            reps = list(replicas_of(value))
        if d is not None:
            reps.append(d)
        deadline = t.grant_lease(key, now, self.lease_ttl)
        self.metrics.count("get_replica_list")
        self.metrics.leases_granted.inc()
        return OK, reps, int((deadline - now) * 1000)

    def _all_keys(self) -> list[str]:
        """Every readable key: memory objects, then disk-only ones."""
        t = self.table
        return list(t.objects) + [k for k in t.disk if k not in t.objects]

    def _matching_keys(self, rx: KeyPattern):
        """Yields the readable keys matching `rx`, in lists of at most _SCAN_CHUNK.

        Only the snapshot of the key list takes the lock; matching runs without it (RE2 also releases the
        GIL), so an expensive pattern over many keys delays no other call. The caller takes the lock per
        chunk to act on it and must skip keys gone meanwhile."""
        with self._lock:
            keys = self._all_keys()
        chunk = []
        for k in keys:
            if rx.search(k):
                chunk.append(k)
                if len(chunk) >= _SCAN_CHUNK:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    # ======================================================================================================
    # Removal
    # ======================================================================================================
    def remove(self, key: str, force: bool = False) -> ErrorCode:
        """OBJECT_NOT_FOUND if absent, REPLICA_IS_NOT_READY while being put (force: revoke that put),
        OBJECT_HAS_LEASE while leased and OBJECT_HAS_REPLICATION_TASK during a copy/move (unless force)."""
        with self._lock:
            return self._remove_locked(key, force, self._clock())

    def batch_remove(self, keys: list[str], force: bool = False) -> list[ErrorCode]:
        with self._lock:
            now = self._clock()
            return [self._remove_locked(k, force, now) for k in keys]

    def remove_by_regex(self, pattern: str, force: bool = False) -> tuple[ErrorCode, int]:
        """Removes committed keys matching `pattern` (as in get_replica_list_by_regex), skipping leased/busy
        ones unless force; INVALID_PARAMS for a refused pattern."""
        rx = _key_pattern(pattern, "remove_by_regex")
        if rx is None:
            return ErrorCode.INVALID_PARAMS, 0
        removed = 0
        for chunk in self._matching_keys(rx):
            with self._lock:
                now = self._clock()
                t = self.table
                removed += sum(1 for k in chunk
                               if (k in t.objects or k in t.disk) and self._remove_locked(k, force, now) == OK)
        return OK, removed

    def remove_all(self, force: bool = False) -> tuple[ErrorCode, int]:
        """Removes every committed object except leased/busy ones (unless force); returns the count."""
        with self._lock:
            now = self._clock()
            keys = self._all_keys()
            return OK, sum(1 for k in keys if self._remove_locked(k, force, now) == OK)

    def _remove_locked(self, key: str, force: bool, now: float) -> ErrorCode:
        code = self._remove_checked(key, force, now)
        self.metrics.count("remove", code)
        return code

    def _remove_checked(self, key: str, force: bool, now: float) -> ErrorCode:
        code = self._check_key(key)
        if code != OK:
            return code
        t = self.table
        value = t.objects.get(key)
        if value is None and key not in t.disk:
            p = t.pending.get(key)
            if p is None:
                return ErrorCode.OBJECT_NOT_FOUND
            if not force:
                return ErrorCode.REPLICA_IS_NOT_READY
            self._discard_locked(key, p, now, "force_remove")
            return OK
        if key in t.busy:
            if not force:
                return ErrorCode.OBJECT_HAS_REPLICATION_TASK
            self.replicator.cancel(key)
        deadline = t.lease_deadline(key, now)
        if not force and deadline:
            return ErrorCode.OBJECT_HAS_LEASE
        # force on a leased object: its buffers are held until the lease ends (apply.py)
        self._apply(ops.Remove(key, now, deadline if value is not None else 0.0))
        return OK

    # ======================================================================================================
    # Monitor
    # ======================================================================================================
    def tick(self) -> None:
        """One maintenance round (see module docstring); the monitor thread calls it periodically."""
        with self._lock:
            now = self._clock()
            for client_id in self.clients.expire(now):
                self._apply(ops.ExpireClient(client_id, now))
                self.tasks.fail_client(client_id, now)
            timeout = self.config.put_start_discard_timeout_sec
            stuck = [(k, p) for k, p in self.table.pending.items() if now - p.started >= timeout]
            for key, p in stuck:
                self._discard_locked(key, p, now, "timeout")
            self._release_held(lambda h: h.release_at <= now)
            if self.reservations:
                self.reservation_pool.drop(idle_before=now - self.config.reservation_idle_sec,
                                           idle_hold_until=now + self.config.put_start_discard_timeout_sec)
            self.replicator.expire(now)
            self.tasks.expire(now)
            if now >= self._next_purge:
                self.table.purge_expired(now)
                self._next_purge = now + _PURGE_PERIOD_SEC
            cap = self.segments.capacity
            if (cap and now >= self._next_watermark_evict
                    and self.segments.used >= self.config.eviction_high_watermark_ratio * cap):
                # Everything leased/pinned/in progress: do not rescan the whole table under the lock every
                # monitor round (1 M objects take ~0.1 s), retry after a pause.
                if not self._evict_locked(int(self.config.eviction_ratio * cap), now, "watermark"):
                    self._next_watermark_evict = now + _EVICT_BACKOFF_SEC

    def start_monitor(self) -> None:
        if self._monitor is not None:
            return
        self._stop.clear()
        self._monitor = threading.Thread(target=self._monitor_loop, name="mooncake-master-monitor", daemon=True)
        self._monitor.start()

    def stop_monitor(self) -> None:
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=5)
            self._monitor = None

    def _monitor_loop(self) -> None:
        period = self.config.monitor_interval_ms / 1000.0
        while not self._stop.wait(period):
            try:
                self.tick()
            except Exception:  # keep the master alive; the failure is a bug worth a loud log line
                _log.exception("master monitor round failed")


def _delegate(part: str, name: str):
    def call(self, *args, **kwargs):
        return getattr(getattr(self, part), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``self.{part}.{name}`` (the RPC entry point of a composed part; see its docstring)."
    return call


for _name in ("mount_local_disk", "unmount_local_disk", "take_offload_tasks", "notify_offload",
              "evict_disk_replicas", "take_disk_drops"):
    setattr(MasterService, _name, _delegate("disk_tier", _name))
for _name in ("reserve_space", "put_reserved", "put_reserved_batch", "release_space", "reserved_bytes"):
    setattr(MasterService, _name, _delegate("reservation_pool", _name))
for _name in ("copy_start", "move_start", "copy_end", "move_end", "copy_revoke", "move_revoke", "create_copy_task",
              "create_move_task", "query_task", "fetch_tasks", "mark_task_complete", "batch_replica_clear"):
    setattr(MasterService, _name, _delegate("replicator", _name))
del _name
# Read-only views for metrics and the admin server (introspection.py): counts and usage; one key, no lease.
MasterService.snapshot = introspection.snapshot
MasterService.describe_key = introspection.describe_key
