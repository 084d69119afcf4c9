"""The SSD tier of the master: LOCAL_DISK replicas, offload tasks for segment owners, file-deletion notices
(see the SSD paragraph of service.py's docstring and store/README.md).

``DiskTier`` is owned by one MasterService and shares its lock and object table. Public methods (the RPC
entry points) take the service lock; the others expect it held. Durable changes (a tier mounted or unmounted,
a disk replica recorded or dropped) go through ``svc._apply`` as ops (ops.py); ``mount``, ``unmount``,
``add_replica``, ``remove_replica`` and ``drop_disk`` are what those ops' handlers run. Offload tasks and
their queues are not durable: a master that takes over starts with none (objects committed just before stay
memory-only).
"""

from __future__ import annotations

import logging

import random
from typing import TYPE_CHECKING

from mooncake.store.common.errors import ErrorCode
from mooncake.store.master import ops
from mooncake.store.master.objects import DiskClient, DiskReplica, OffloadTask, PutKind, replicas_of

if TYPE_CHECKING:
    from mooncake.store.master.service import MasterService

_log = logging.getLogger("mooncake.store.master")

OK = ErrorCode.OK
_MAX_DISK_DROPS = 1 << 16  # obsolete-file notices kept per SSD client until it acknowledges them
_MIN_COMPACT = 1024  # cancelled tasks an offload queue may carry before it is compacted


class DiskTier:
    def __init__(self, svc: "MasterService") -> None:
        self._svc = svc
        self.clients: dict[str, DiskClient] = {}
        # Offload task versions start at a random 62-bit value per master process: a report of a task a
        # previous master handed out (its copy may come from memory that master reused) never matches.
        self._offload_version = random.SystemRandom().getrandbits(62)
        self._drop_number = random.SystemRandom().getrandbits(62)  # numbers drop notices (take_disk_drops)

    # -- RPC entry points (take the service lock) -------------------------------------------------------------
    def mount_local_disk(self, client_id: str, endpoint: str) -> ErrorCode:
        """Declares the client's SSD tier, served at `endpoint` (host:port); again (e.g. after a remount) only
        updates the endpoint. Registers the client as alive, like a mount."""
        if not client_id or not endpoint:
            return ErrorCode.INVALID_PARAMS
        svc = self._svc
        with svc.lock:
            dc = self.clients.get(client_id)
            if dc is None or dc.endpoint != endpoint:
                svc._apply(ops.MountDisk(client_id, endpoint))
            else:
                svc.clients.register(client_id, svc.now())
            svc.metrics.count("mount_local_disk")
            return OK

    def unmount_local_disk(self, client_id: str) -> tuple[ErrorCode, int]:
        """Forgets the client's SSD tier and its disk replicas (objects left without a replica disappear);
        returns how many disk replicas went. Idempotent."""
        if not client_id:
            return ErrorCode.INVALID_PARAMS, 0
        svc = self._svc
        with svc.lock:
            n = svc._apply(ops.UnmountDisk(client_id, svc.now())) if client_id in self.clients else 0
            svc.metrics.count("unmount_local_disk")
            return OK, n

    def take_offload_tasks(self, client_id: str, capacity: int) -> tuple[list[tuple[str, int, int, int]], int]:
        """Up to `capacity` offload tasks of the client, oldest first, as (key, size, address, version), and
        how many stay queued (answered in its ping)."""
        if capacity <= 0 or client_id not in self.clients:  # unlocked peek: most clients have no SSD tier
            return [], 0
        svc = self._svc
        with svc.lock:
            dc = self.clients.get(client_id)
            if dc is None:
                return [], 0
            offloading, out = svc.table.offloading, []
            while dc.queue and len(out) < capacity:
                task = dc.queue.popleft()
                if offloading.get(task.key) is not task:
                    dc.stale -= 1  # cancelled meanwhile
                    continue
                task.handed = True
                out.append((task.key, task.replica.size, task.replica.address, task.version))
            return out, dc.backlog

    def notify_offload(self, client_id: str, objects: list[tuple[str, int, int, int]], reload: bool = False
                       ) -> list[ErrorCode]:
        """Records disk replicas (key, size, seq, version) of the client; per object a code (see
        NotifyOffloadRequest in the proto): a fresh file (reload False) is accepted only for the offload task
        `version` of this client while that version of the object is still in memory where the task said; a
        file found at start-up (reload True, version unused) for an absent object or one of the same size."""
        svc = self._svc
        with svc.lock:
            dc = self.clients.get(client_id)
            if dc is None:
                codes = [ErrorCode.CLIENT_NOT_FOUND] * len(objects)
            else:
                codes = [self._notify_locked(dc, k, size, seq, version, reload) for k, size, seq, version in objects]
            for c in codes:
                svc.metrics.count("notify_offload", c)
            return codes

    def _notify_locked(self, dc: DiskClient, key: str, size: int, seq: int, version: int, reload: bool
                       ) -> ErrorCode:
        svc = self._svc
        code = svc._check_key(key)
        if code != OK:
            return code
        if size <= 0:
            return ErrorCode.INVALID_PARAMS
        t = svc.table
        value = t.objects.get(key)
        d = t.disk.get(key)
        if reload:
            if d is not None and d.owner is dc and d.seq == seq and d.size == size:
                return OK  # recorded already (a re-report)
            elif value is not None:
                return ErrorCode.OBJECT_NOT_FOUND  # in memory, and maybe a newer version: the file may be stale
            elif d is None and key in t.pending:
                return ErrorCode.OBJECT_REPLICA_BUSY
            elif d is not None and d.owner is not dc:
                return ErrorCode.REPLICA_ALREADY_EXISTS
        else:
            task = t.offloading.get(key)
            if task is None or task.owner is not dc or task.version != version or task.replica.size != size \
                    or not task.handed:
                return ErrorCode.OBJECT_NOT_FOUND  # removed, overwritten or evicted since: the copy is stale
            if value is None or not any(r is task.replica for r in replicas_of(value)):
                self.cancel_offload(key)  # that replica went (moved, cleared): its bytes may be reused
                return ErrorCode.OBJECT_NOT_FOUND
            del t.offloading[key]
        svc._apply(ops.DiskReplicaAdd(key, dc.client_id, size, seq))
        return OK

    def evict_disk_replicas(self, client_id: str, objects: list[tuple[str, int]]) -> list[ErrorCode]:
        """The client deleted these files (key, seq; seq 0: any version): their records go. Per object OK or
        REPLICA_NOT_FOUND (no such record of this client)."""
        svc = self._svc
        with svc.lock:
            t, now = svc.table, svc.now()
            dc = self.clients.get(client_id)
            codes = []
            for key, seq in objects:
                d = t.disk.get(key)
                if dc is None or d is None or d.owner is not dc or (seq and d.seq != seq):
                    codes.append(ErrorCode.REPLICA_NOT_FOUND)
                    continue
                svc._apply(ops.DiskReplicaRemove(key, now))
                codes.append(OK)
            svc.metrics.count("evict_disk_replica", n=len(objects))
            return codes

    def take_disk_drops(self, client_id: str, ack: int = 0) -> tuple[list[tuple[str, int]], int]:
        """The (key, seq) files of the client found obsolete and not acknowledged yet, and the number of the
        last one (answered in its ping; 0: none). `ack` is the number the client's previous ping reply carried
        and the client handled: those drops go. Unacknowledged ones are answered again (a lost reply loses
        nothing; a notice names its file's seq, so handling one twice is harmless). Drop numbers come from a
        counter with a random start per master process: an ack meant for another master matches nothing."""
        if client_id not in self.clients:  # unlocked peek: most clients have no SSD tier
            return [], 0
        with self._svc.lock:
            dc = self.clients.get(client_id)
            if dc is None or not dc.drops:
                return [], 0
            drops = dc.drops
            if ack and drops[0][0] <= ack <= dc.drops_handed:
                while drops and drops[0][0] <= ack:
                    drops.popleft()
            if not drops:
                return [], 0
            dc.drops_handed = drops[-1][0]
            return [(k, seq) for _, k, seq in drops], dc.drops_handed

    # -- under the service lock ---------------------------------------------------------------------------------
    def queue_offload(self, key: str, replicas, now: float) -> None:
        """Queues the persistence of the just committed `key` for the owner of its first memory replica that
        lies in the segment of a client with an SSD tier (if any). Only a master serving clients queues."""
        if not self.clients or not self._svc.allocators_live:
            return
        for r in replicas:
            dc = self.clients.get(r.segment.client_id)
            if dc is not None:
                break
        else:
            return
        if dc.backlog >= self._svc.config.offloading_queue_limit:
            dc.dropped += 1
            self._svc.metrics.offload_dropped.inc()
            return
        offloading = self._svc.table.offloading
        if dc.stale >= _MIN_COMPACT and dc.stale * 2 >= len(dc.queue):
            dc.queue = type(dc.queue)(t for t in dc.queue if offloading.get(t.key) is t)
            dc.stale = 0
        self._offload_version += 1
        task = OffloadTask(key, dc, r, self._offload_version, now)
        offloading[key] = task
        dc.queue.append(task)

    def cancel_offload(self, key: str) -> None:
        """Forgets the pending offload of `key` (if any): a report of it is refused from now on."""
        task = self._svc.table.offloading.pop(key, None)
        if task is not None and not task.handed:
            task.owner.stale += 1

    # -- what the ops' handlers run (apply.py) --------------------------------------------------------------------
    def mount(self, client_id: str, endpoint: str) -> None:
        dc = self.clients.get(client_id)
        if dc is None:
            self.clients[client_id] = DiskClient(client_id, endpoint)
        else:
            dc.endpoint = endpoint

    def add_replica(self, key: str, client_id: str, size: int, seq: int) -> None:
        t = self._svc.table
        dc = self.clients[client_id]
        d = t.disk.get(key)
        if d is not None and d.owner is not dc:
            self.drop_disk(key)
        t.disk[key] = DiskReplica(dc, size, seq)

    def remove_replica(self, key: str, at: float) -> None:
        t = self._svc.table
        t.disk.pop(key, None)
        if key not in t.objects:
            self._forget_disk_only(key, at)

    def drop_disk(self, key: str) -> None:
        """Forgets the disk replica of `key` (if any) and queues its file for deletion by the owner."""
        d = self._svc.table.disk.pop(key, None)
        if d is not None and len(d.owner.drops) < _MAX_DISK_DROPS:
            self._drop_number += 1
            d.owner.drops.append((self._drop_number, key, d.seq))

    def _forget_disk_only(self, key: str, at: float) -> None:
        """`key` lost its last (disk) replica: its lease and pins go, and a promote in flight too (nothing left
        to promote; committing it would resurrect the object)."""
        t = self._svc.table
        t.drop(key)
        p = t.pending.get(key)
        if p is not None and p.kind == PutKind.PROMOTE:
            self._svc._apply(ops.PutDiscard(key, at, "removed"))

    def unmount(self, client_id: str, at: float) -> int:
        dc = self.clients.pop(client_id, None)
        if dc is None:
            return 0
        t = self._svc.table
        gone = [k for k, d in t.disk.items() if d.owner is dc]
        for k in gone:
            del t.disk[k]
            if k not in t.objects:
                self._forget_disk_only(k, at)
        for k in [k for k, task in t.offloading.items() if task.owner is dc]:
            del t.offloading[k]
        if gone:
            _log.info("client %s: %d disk replica(s) dropped with its SSD tier", client_id, len(gone))
        return len(gone)
