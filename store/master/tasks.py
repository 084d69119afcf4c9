"""Copy/move task queue: the master plans replica copies and moves, a client executes them.

Life of a task: CreateCopyTask / CreateMoveTask -> PENDING, assigned to one client (the owner of the target
segment, see replication.py) -> that client's FetchTasks returns it -> PROCESSING -> the client runs
CopyStart/End (or MoveStart/End) and reports MarkTaskToComplete -> SUCCESS or FAILED. A task still PENDING
after --pending_task_timeout_sec or PROCESSING after --processing_task_timeout_sec, or whose client expires,
becomes FAILED. At most one unfinished task per key (OBJECT_HAS_REPLICATION_TASK otherwise); at most
--max_total_pending_tasks pending (TASK_PENDING_LIMIT_EXCEEDED) and --max_total_processing_tasks handed out
at once; the newest --max_total_finished_tasks finished tasks stay queryable.

Threading: not thread-safe; the master calls everything under its lock.
"""

from __future__ import annotations

import enum
import uuid

from mooncake.store.common.errors import ErrorCode


class TaskType(enum.IntEnum):
    COPY = 1
    MOVE = 2


class TaskStatus(enum.IntEnum):
    PENDING = 1
    PROCESSING = 2
    SUCCESS = 3
    FAILED = 4


class Task:
    __slots__ = ("id", "type", "key", "source", "targets", "client_id", "status", "message", "created", "updated")

    def __init__(self, task_type: TaskType, key: str, source: str, targets: tuple[str, ...], client_id: str,
                 now: float) -> None:
        self.id = uuid.uuid4().hex
        self.type = task_type
        self.key = key
        self.source = source
        self.targets = targets
        self.client_id = client_id
        self.status = TaskStatus.PENDING
        self.message = ""
        self.created = now
        self.updated = now


class TaskManager:
    def __init__(self, max_pending: int = 10000, max_processing: int = 10000, max_finished: int = 10000,
                 pending_timeout_sec: float = 300, processing_timeout_sec: float = 300) -> None:
        self.max_pending = max_pending
        self.max_processing = max_processing
        self.max_finished = max_finished
        self.pending_timeout = pending_timeout_sec
        self.processing_timeout = processing_timeout_sec
        self._tasks: dict[str, Task] = {}
        self._pending: dict[str, Task] = {}  # creation order
        self._processing: dict[str, Task] = {}
        self._finished: dict[str, Task] = {}  # completion order, trimmed to max_finished
        self._by_key: dict[str, Task] = {}  # unfinished task of a key

    def create(self, task_type: TaskType, key: str, source: str, targets: tuple[str, ...], client_id: str,
               now: float) -> tuple[ErrorCode, str]:
        if key in self._by_key:
            return ErrorCode.OBJECT_HAS_REPLICATION_TASK, ""
        if len(self._pending) >= self.max_pending:
            return ErrorCode.TASK_PENDING_LIMIT_EXCEEDED, ""
        task = Task(task_type, key, source, targets, client_id, now)
        self._tasks[task.id] = task
        self._pending[task.id] = task
        self._by_key[key] = task
        return ErrorCode.OK, task.id

    def get(self, task_id: str) -> Task | None:
        return self._tasks.get(task_id)

    def has_task(self, key: str) -> bool:
        return key in self._by_key

    def fetch(self, client_id: str, batch: int, now: float) -> list[Task]:
        """Hands out up to `batch` of the client's pending tasks (oldest first); they become PROCESSING."""
        out: list[Task] = []
        room = min(batch, self.max_processing - len(self._processing))
        if room <= 0:
            return out
        for task in self._pending.values():
            if task.client_id == client_id:
                out.append(task)
                if len(out) == room:
                    break
        for task in out:
            del self._pending[task.id]
            self._processing[task.id] = task
            task.status = TaskStatus.PROCESSING
            task.updated = now
        return out

    def complete(self, client_id: str, task_id: str, success: bool, message: str, now: float) -> ErrorCode:
        task = self._tasks.get(task_id)
        if task is None:
            return ErrorCode.TASK_NOT_FOUND
        if task.client_id != client_id:
            return ErrorCode.ILLEGAL_CLIENT
        if task.status != TaskStatus.PROCESSING:
            return ErrorCode.INVALID_PARAMS
        self._finish(task, TaskStatus.SUCCESS if success else TaskStatus.FAILED, message, now)
        return ErrorCode.OK

    def expire(self, now: float) -> None:
        for table, timeout, what in ((self._pending, self.pending_timeout, "pending"),
                                     (self._processing, self.processing_timeout, "processing")):
            late = [t for t in table.values() if now - t.updated >= timeout]
            for t in late:
                self._finish(t, TaskStatus.FAILED, f"timed out after {timeout:g} s {what}", now)

    def fail_client(self, client_id: str, now: float) -> None:
        """Fails the unfinished tasks of a client that expired."""
        mine = [t for t in list(self._pending.values()) + list(self._processing.values()) if t.client_id == client_id]
        for t in mine:
            self._finish(t, TaskStatus.FAILED, f"client {client_id} expired", now)

    def counts(self) -> dict[str, int]:
        return {"pending": len(self._pending), "processing": len(self._processing),
                "finished": len(self._finished)}

    def _finish(self, task: Task, status: TaskStatus, message: str, now: float) -> None:
        self._pending.pop(task.id, None)
        self._processing.pop(task.id, None)
        if self._by_key.get(task.key) is task:
            del self._by_key[task.key]
        task.status = status
        task.message = message
        task.updated = now
        self._finished[task.id] = task
        while len(self._finished) > self.max_finished:
            old_id = next(iter(self._finished))
            del self._finished[old_id]
            del self._tasks[old_id]
