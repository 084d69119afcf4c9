"""Replica copy/move operations, copy/move tasks, and batch replica clear (an extension of MasterService).

Copy: ``start`` allocates one new PROCESSING buffer on each target segment (by segment name) and returns the
source replica to read and the new buffers to write -> the client transfers with the Transfer Engine ->
``end`` adds the new replicas (COMPLETE) to the object, or ``revoke`` frees them. Move is a copy to one
target whose ``end`` also drops the source replica (its buffers are held while a reader's lease lasts).
While an operation runs the object is *busy*: not evicted, Remove answers OBJECT_HAS_REPLICATION_TASK
(``force`` cancels the operation), and a second copy/move is refused the same way. Operations follow the
put rules for crashed executors: revoked after --put_start_discard_timeout_sec (buffers held as for a
stuck put), or at once when the executing client expires or a segment involved is unmounted.

Tasks (tasks.py) are the asynchronous form: the master records the plan and assigns it to the client that
owns the (first) target segment, which fetches it, runs start/end and reports completion.

Durability: an operation in flight is durable (ops.ReplicationStart when it starts, ops.ReplicationFinish when
it ends, is revoked or abandoned): a master that takes over (failover, restart with a snapshot) knows its new
buffers, never hands them out while the executor may still write them, and accepts the executor's end or
revoke. ``batch_clear`` changes objects through ops.SetReplicas. Tasks not yet started by their executor are
not durable (tasks.py): a task lost at a failover is simply not run.

Threading: every public method takes the service lock; ``on_*``, ``expire`` and ``cancel`` expect it held.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from mooncake.store.common.errors import ErrorCode
from mooncake.store.master import ops
from mooncake.store.master.objects import Held, replicas_of
from mooncake.store.master.segments import Replica, Segment
from mooncake.store.master.tasks import TaskType

if TYPE_CHECKING:
    from mooncake.store.master.service import MasterService

OK = ErrorCode.OK


class Replicator:
    def __init__(self, service: "MasterService") -> None:
        self._svc = service

    # -- the RPC entry points (delegated by MasterService under these names) ---------------------------------
    def copy_start(self, client_id, key, source, targets):
        return self.start(client_id, key, source, tuple(targets), move=False)

    def move_start(self, client_id, key, source, target):
        return self.start(client_id, key, source, (target,) if target else (), move=True)

    def copy_end(self, client_id, key):
        return self.end(client_id, key, move=False)

    def move_end(self, client_id, key):
        return self.end(client_id, key, move=True)

    def copy_revoke(self, client_id, key):
        return self.revoke(client_id, key, move=False)

    def move_revoke(self, client_id, key):
        return self.revoke(client_id, key, move=True)

    def create_copy_task(self, key, targets):
        return self.create_task(key, "", tuple(targets), move=False)

    def create_move_task(self, key, source, target):
        return self.create_task(key, source, (target,) if target else (), move=True)

    def query_task(self, task_id):
        """A copy of the task (None if unknown): the monitor may finish the task while the caller reads it."""
        svc = self._svc
        with svc.lock:
            task = svc.tasks.get(task_id)
            return copy.copy(task) if task is not None else None

    def fetch_tasks(self, client_id: str, batch: int):
        svc = self._svc
        with svc.lock:
            return [copy.copy(t) for t in svc.tasks.fetch(client_id, max(0, batch), svc.now())]

    def mark_task_complete(self, client_id: str, task_id: str, success: bool, message: str = "") -> ErrorCode:
        svc = self._svc
        with svc.lock:
            return svc.tasks.complete(client_id, task_id, success, message, svc.now())

    def batch_replica_clear(self, client_id: str, keys: list[str], segment_name: str = ""):
        return self.batch_clear(client_id, keys, segment_name)

    # -- synchronous operations (executed by a client) -------------------------------------------------------
    def start(self, client_id: str, key: str, source: str, targets: tuple[str, ...], move: bool
              ) -> tuple[ErrorCode, Replica | None, list[Replica]]:
        """(code, source replica, new target buffers)."""
        svc = self._svc
        with svc.lock:
            code, src, new = self._start_checked(client_id, key, source, targets, move, svc.now())
            svc.metrics.count("move_start" if move else "copy_start", code)
            return code, src, new

    def _start_checked(self, client_id, key, source, targets, move, now):
        svc, t = self._svc, self._svc.table
        if not client_id or not key or not targets or (move and len(targets) != 1):
            return ErrorCode.INVALID_PARAMS, None, []
        code, value = self._committed(key)
        if code != OK:
            return code, None, []
        if key in t.busy:
            return ErrorCode.OBJECT_HAS_REPLICATION_TASK, None, []
        if key in t.pending:  # an upsert in progress would commit a new version under the copy
            return ErrorCode.OBJECT_REPLICA_BUSY, None, []
        reps = replicas_of(value)
        code, src = self._source_replica(reps, source)
        if code != OK:
            return code, None, []
        code = self._check_targets(reps, targets, src if move else None)
        if code != OK:
            return code, None, []
        new: list[Replica] = []
        exclude = {r.segment.id for r in reps}
        for name in targets:
            r = svc.segments.allocate_on(name, src.size, exclude)
            if r is None:
                svc._free(new)
                return ErrorCode.NO_AVAILABLE_HANDLE, None, []
            exclude.add(r.segment.id)
            new.append(r)
        svc._apply(ops.ReplicationStart(key, client_id, move, (src,), tuple(new), now))
        return OK, src, new

    def end(self, client_id: str, key: str, move: bool) -> ErrorCode:
        svc = self._svc
        with svc.lock:
            code = self._check_owner(client_id, key, move)
            if code == OK:
                now = svc.now()
                hold = svc.table.lease_deadline(key, now) if move else 0.0  # the source's readers
                code = svc._apply(ops.ReplicationFinish(key, "end", now, hold))
            svc.metrics.count("move_end" if move else "copy_end", code)
            return code

    def revoke(self, client_id: str, key: str, move: bool) -> ErrorCode:
        svc = self._svc
        with svc.lock:
            code = self._check_owner(client_id, key, move)
            if code == OK:
                svc._apply(ops.ReplicationFinish(key, "revoke", svc.now()))
            svc.metrics.count("move_revoke" if move else "copy_revoke", code)
            return code

    def _check_owner(self, client_id: str, key: str, move: bool) -> ErrorCode:
        """Whether `client_id` runs the copy (move) of `key`: OK, or why not."""
        op = self._svc.table.busy.get(key)
        if op is None:
            return ErrorCode.OBJECT_NO_REPLICATION_TASK
        if op.client_id != client_id:
            return ErrorCode.ILLEGAL_CLIENT
        if op.move != move:
            return ErrorCode.INVALID_PARAMS
        return OK

    # -- tasks -----------------------------------------------------------------------------------------------
    def create_task(self, key: str, source: str, targets: tuple[str, ...], move: bool) -> tuple[ErrorCode, str]:
        """Validates the plan now (object, source replica, target segments) and queues it; (code, task id)."""
        svc = self._svc
        with svc.lock:
            if not key or not targets or (move and len(targets) != 1):
                return ErrorCode.INVALID_PARAMS, ""
            code, value = self._committed(key)
            if code != OK:
                return code, ""
            if key in svc.table.busy:
                return ErrorCode.OBJECT_HAS_REPLICATION_TASK, ""
            reps = replicas_of(value)
            code, src = self._source_replica(reps, source)
            if code == OK:
                code = self._check_targets(reps, targets, src if move else None)
            if code != OK:
                return code, ""
            executor = svc.segments.by_name(targets[0])[0].client_id
            code, task_id = svc.tasks.create(TaskType.MOVE if move else TaskType.COPY, key, src.segment.name,
                                             targets, executor, svc.now())
            svc.metrics.count("create_move_task" if move else "create_copy_task", code)
            return code, task_id

    # -- replica clear ---------------------------------------------------------------------------------------
    def batch_clear(self, client_id: str, keys: list[str], segment_name: str) -> tuple[ErrorCode, list[str]]:
        """Drops the replicas of `keys` on segments named `segment_name` (all replicas, the disk one included,
        when empty; an object left without replicas is removed). Leased, busy and in-progress keys are
        skipped. Returns the keys that were cleared."""
        svc = self._svc
        with svc.lock:
            if not client_id:
                return ErrorCode.INVALID_PARAMS, []
            now, t = svc.now(), svc.table
            cleared: list[str] = []
            for key in keys:
                value = t.objects.get(key)
                if value is None or key in t.busy or t.lease_deadline(key, now):
                    continue
                reps = replicas_of(value)
                gone = [r for r in reps if not segment_name or r.segment.name == segment_name]
                if not gone:
                    continue
                # Every replica gone: the disk one too unless a segment was named (it lives on disk-only).
                svc._apply(ops.SetReplicas(key, tuple(r for r in reps if r not in gone), tuple(gone),
                                           drop_disk=not segment_name))
                cleared.append(key)
            svc.metrics.count("batch_replica_clear", n=len(keys))
            return OK, cleared

    # -- hooks called by the service with its lock held --------------------------------------------------------
    def cancel(self, key: str) -> None:
        """A forced remove of a busy object (lock held, not in a handler): the operation is abandoned; its
        executor may still write the new buffers, so they are held as a stuck put's are."""
        if key in self._svc.table.busy:
            self._svc._apply(ops.ReplicationFinish(key, "abandon", self._svc.now()))

    def on_segment_unmounted(self, seg: Segment) -> None:
        busy = self._svc.table.busy
        svc = self._svc
        for key, op in list(busy.items()):
            if op.source.segment is seg:  # nothing left to copy from: the operation is void
                del busy[key]
                # The executor may still be writing the new buffers: held as an abandoned copy's are (the op's
                # own start time, not a clock: this runs inside the unmount's handler).
                svc.table.held.append(Held(key, tuple(op.new), op.started + svc.config.put_start_release_timeout_sec,
                                           op.client_id, sticky=True))
            else:
                op.new = [r for r in op.new if r.segment is not seg]

    def on_client_expired(self, client_id: str) -> None:
        busy = self._svc.table.busy
        for key in [k for k, op in busy.items() if op.client_id == client_id]:
            self._svc._free(busy.pop(key).new)

    def expire(self, now: float) -> None:
        svc = self._svc
        busy = svc.table.busy
        timeout = svc.config.put_start_discard_timeout_sec
        for key in [k for k, op in busy.items() if now - op.started >= timeout]:
            svc._apply(ops.ReplicationFinish(key, "abandon", now))

    # -- helpers ---------------------------------------------------------------------------------------------
    def _committed(self, key: str):
        t = self._svc.table
        value = t.objects.get(key)
        if value is None:
            return (ErrorCode.REPLICA_IS_NOT_READY if key in t.pending else ErrorCode.OBJECT_NOT_FOUND), None
        return OK, value

    @staticmethod
    def _source_replica(reps: tuple[Replica, ...], source: str) -> tuple[ErrorCode, Replica | None]:
        if not source:
            return OK, reps[0]
        for r in reps:
            if r.segment.name == source:
                return OK, r
        return ErrorCode.REPLICA_NOT_FOUND, None

    def _check_targets(self, reps: tuple[Replica, ...], targets: tuple[str, ...], move_source: Replica | None
                       ) -> ErrorCode:
        if len(set(targets)) != len(targets):
            return ErrorCode.INVALID_PARAMS
        held_names = {r.segment.name for r in reps}
        for name in targets:
            if not name or not self._svc.segments.by_name(name):
                return ErrorCode.SEGMENT_NOT_FOUND
            if move_source is not None and name == move_source.segment.name:
                return ErrorCode.INVALID_PARAMS
            if name in held_names:
                return ErrorCode.REPLICA_ALREADY_EXISTS
        return OK
