"""Replica copy/move tasks: the user-facing calls (``create_copy_task``, ``create_move_task``, ``query_task``)
and the executor every client with a segment runs.

The master assigns a task to the client owning its (first) target segment. That client's ``TaskRunner``
thread polls FetchTasks every MC_STORE_TASK_POLL_MS (500) ms and runs each task: CopyStart / MoveStart (the
master allocates the new PROCESSING buffers) -> read the source replica into a staging area -> write it to
every new buffer -> CopyEnd / MoveEnd, or CopyRevoke / MoveRevoke on any failure -> MarkTaskToComplete
with the outcome. The runner stops with ``close``; a task it never finished is failed by the master's
timeouts (--processing_task_timeout_sec) or when this client expires.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time

import numpy as np

from mooncake.store.client.validate import KEY, KEYS, STR, typed
from mooncake.store.common.errors import code_name
from mooncake.store.proto import mooncake_master_pb2 as pb

_log = logging.getLogger("mooncake.store.client")


class TaskType(enum.IntEnum):
    REPLICA_COPY = 1
    REPLICA_MOVE = 2


class TaskStatus(enum.IntEnum):
    PENDING = 1
    PROCESSING = 2
    SUCCESS = 3
    FAILED = 4


class QueryTaskResponse:
    def __init__(self, info: pb.TaskInfo) -> None:
        now_ms = int(time.time() * 1000)
        self.id = info.task_id
        self.type = TaskType(info.type)
        self.status = TaskStatus(info.status)
        self.created_at_ms_epoch = now_ms - int(info.age_sec * 1000)
        self.last_updated_at_ms_epoch = now_ms
        self.assigned_client = info.assigned_client
        self.message = info.message
        self.key = info.key

    def __repr__(self) -> str:
        return (f"QueryTaskResponse(id={self.id!r}, type={self.type.name}, status={self.status.name}, "
                f"key={self.key!r}, assigned_client={self.assigned_client!r}, message={self.message!r})")


class TaskRunner:
    """Executes the copy/move tasks the master assigns to `core` (a StoreCore); one daemon thread."""

    def __init__(self, core) -> None:
        self._core = core
        self._stop = threading.Event()
        self._interval = float(os.environ.get("MC_STORE_TASK_POLL_MS", 500)) / 1000
        self._thread = threading.Thread(target=self._loop, name="store-tasks", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            reply = self._core._rpc("FetchTasks", batch_size=4)
            if isinstance(reply, int):
                continue
            for task in reply.tasks:
                ok, message = self.run(task)
                self._core._rpc("MarkTaskToComplete", task_id=task.task_id, success=ok, message=message)

    def run(self, task: pb.TaskInfo) -> tuple[bool, str]:
        move = task.type == pb.TASK_TYPE_MOVE
        prefix = "Move" if move else "Copy"
        if move:
            reply = self._core._rpc("MoveStart", key=task.key, source=task.source, target=task.targets[0])
        else:
            reply = self._core._rpc("CopyStart", key=task.key, source=task.source, targets=list(task.targets))
        if isinstance(reply, int) or reply.code != 0:
            code = reply if isinstance(reply, int) else reply.code
            return False, f"{prefix}Start failed: {code_name(code)}"
        if self._copy(reply.source, list(reply.targets)):
            end = self._core._rpc(prefix + "End", key=task.key)
            code = end if isinstance(end, int) else end.code
            return code == 0, "" if code == 0 else f"{prefix}End failed: {code}"
        self._core._rpc(prefix + "Revoke", key=task.key)
        return False, "transfer failed"

    def _copy(self, src: pb.ReplicaDescriptor, targets: list) -> bool:
        core, size = self._core, src.size
        addr = core._staging.alloc(size)
        tmp = None
        if addr is None:  # no room in the staging pool: a temporary registered buffer
            tmp = np.empty(size, dtype=np.uint8)
            addr = tmp.ctypes.data
            if core._engine.register_memory(addr, size) != 0:
                return False
        try:
            if core._transfer([(src, addr, src.address, size, 0)], write=False):
                return False
            return not core._transfer([(t, addr, t.address, size, 0) for t in targets], write=True)
        finally:
            if tmp is None:
                core._staging.free(addr)
            else:
                core._engine.unregister_memory(addr)


class TaskAPI:
    """Mixin for MooncakeDistributedStore: creating and querying copy/move tasks."""

    @typed(key=KEY, targets=KEYS)
    def create_copy_task(self, key, targets) -> tuple[str, int]:
        """(task id, 0) or ("", negative code): copy `key` to each segment in `targets`."""
        if not self._ready("create_copy_task"):
            return "", -1
        reply = self._rpc("CreateCopyTask", key=key, targets=targets)
        return ("", reply) if isinstance(reply, int) else (reply.task_id, reply.code)

    @typed(key=KEY, source=STR, target=STR)
    def create_move_task(self, key, source: str, target: str) -> tuple[str, int]:
        if not self._ready("create_move_task"):
            return "", -1
        reply = self._rpc("CreateMoveTask", key=key, source=source, target=target)
        return ("", reply) if isinstance(reply, int) else (reply.task_id, reply.code)

    @typed(task_id=STR)
    def query_task(self, task_id: str) -> tuple[QueryTaskResponse | None, int]:
        if not self._ready("query_task"):
            return None, -1
        reply = self._rpc("QueryTask", task_id=task_id)
        if isinstance(reply, int):
            return None, reply
        return (QueryTaskResponse(reply.task), 0) if reply.code == 0 else (None, reply.code)
