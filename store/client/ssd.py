"""SSD tier of a store client (``enable_ssd_offload=True``, ``ssd_offload_path``): a local file per object.

Write path (owner-driven): the master hands the client offload tasks for the objects committed to its
segment, whoever wrote them; the client ``submit``s each with the object's bytes (a view of its segment
memory) and the task's version, as many as ``free_slots`` allows (beyond, a submit is dropped and counted).
One background thread writes them, to a temporary name renamed into place (a crash never leaves a torn
object), straight from that memory. After each batch of writes it reports the new files
(``Reporter.stored``: the client sends NotifyOffloadSuccess with the versions; the master records them as
LOCAL_DISK replicas, or answers that the object changed since the task, i.e. the copy may be torn, and the
file is deleted) and the files the capacity limit deleted (``Reporter.evicted``: EvictDiskReplica). Only
files still in the index as written are reported (a file the capacity limit deleted in the same batch is
not). A file is written unconfirmed (magic PENDING_MAGIC) and marked confirmed (MAGIC) once the master
recorded it; only confirmed files are re-reported after a restart or a remount, the others are deleted
(``pending``: what to delete at a remount). Files
the master finds obsolete (the object was removed or overwritten) come back through ``discard`` and are
deleted by the same thread, so deletions and writes of one key never race.

Versions: each file carries ``seq``, increasing per directory (the next one follows the largest found at
start-up). The master keeps the seq of the file it recorded; reads and deletions name it, so an older
notice can never delete or serve a newer file.

Read path: ``read`` / ``open_value`` (this client's own gets, and the DiskReplicaService that serves other
clients, disk_serve.py); the PROMOTE_HITS-th read of a key says "promote": the reader gives the object a
memory replica again.

Capacity: ``capacity`` bytes (MC_STORE_SSD_CAPACITY, human-readable; default 80 % of the free space of the
directory at setup); beyond it the least recently used files are deleted. Restart: the index (key, size,
seq, last use) is rebuilt from the files' headers at start-up (``entries`` lists it for the re-report),
so the tier survives a client restart.

File format: magic b"MCSSD002" (b"MCSSD00P" until the master confirmed it), u32 key length, u64 value length, u64 seq, key (UTF-8), value. Name:
sha1(key). Files of another format are ignored (and left alone).
Threading: all methods are thread-safe; ``close`` drops the writes still queued (their memory is about to
go), reports what was written and waits for the thread (afterwards nothing reads the submitted memory).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import queue
import shutil
import struct
import threading
import uuid

_log = logging.getLogger("mooncake.store.client.ssd")
MAGIC = b"MCSSD002"
PENDING_MAGIC = b"MCSSD00P"  # written, not (yet) recorded by the master
_HEAD = struct.Struct("<8sIQQ")
PROMOTE_HITS = 2
QUEUE_LIMIT = 1024
BATCH = 64  # queued items handled (and reported) together
_RETRY_SEC = 1.0  # reports that failed (master unreachable) are retried this often
_MAX_UNREPORTED = 1 << 16
DISK_ID_FILE = ".mooncake-disk-id"  # names starting with "." are never object files


def file_name(key: str) -> str:
    """The name of `key`'s file in a tier's directory."""
    return hashlib.sha1(key.encode()).hexdigest()


def value_offset(key: str) -> int:
    """Where the value starts in `key`'s file (after the header and the key)."""
    return _HEAD.size + len(key.encode())


def check_header(head: bytes, key: str, size: int, seq: int) -> bool:
    """Whether `head` (the first value_offset(key) bytes of a file) is the header of `key`'s file of version
    `seq` holding `size` bytes (written, whether or not the master confirmed it yet)."""
    if len(head) != value_offset(key):
        return False
    kb = key.encode()
    magic, klen, fsize, fseq = _HEAD.unpack_from(head)
    return magic in (MAGIC, PENDING_MAGIC) and klen == len(kb) and fsize == size and fseq == seq and \
        head[_HEAD.size:] == kb


class Reporter:
    """What the tier tells its client (which tells the master); the default reports nothing."""

    def stored(self, objects: list[tuple[str, int, int, int]]
               ) -> tuple[list[tuple[str, int]], list[tuple[str, int]], bool]:
        """New files (key, size, seq, the master's offload task version). Returns (files to delete as
        obsolete: (key, seq), files the master recorded: (key, seq), delivered); not delivered: the same
        objects are offered again later. Without a master, every file counts as recorded."""
        return [], [(k, seq) for k, _, seq, _ in objects], True

    def evicted(self, objects: list[tuple[str, int]]) -> None:
        """Files (key, seq) the capacity limit deleted."""


class DiskTier:
    def __init__(self, path: str, capacity: int | None = None, reporter: Reporter | None = None) -> None:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-probe")
        with open(probe, "wb") as f:  # self-check: the directory is writable
            f.write(b"ok")
        os.unlink(probe)
        self.path = path
        # Readers on this host (or a shared file system) that find this id here read the files themselves.
        self.disk_id = uuid.uuid4().hex
        with open(os.path.join(path, DISK_ID_FILE + ".tmp"), "w") as f:
            f.write(self.disk_id)
        os.replace(os.path.join(path, DISK_ID_FILE + ".tmp"), os.path.join(path, DISK_ID_FILE))
        self.capacity = capacity if capacity else int(shutil.disk_usage(path).free * 0.8)
        self.reporter = reporter or Reporter()
        self._lock = threading.Lock()
        # key -> (size, seq), least recently used first
        self._index: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()
        self._hits: dict[str, int] = {}
        self._seq = 0
        self.used = 0
        self.dropped = 0
        self._unreported: list[tuple[str, int, int]] = []
        self._pending: dict[str, int] = {}  # key -> seq of its file not confirmed by the master yet
        self._closing = False
        self._discards: collections.deque[tuple[str, int]] = collections.deque()
        self._rebuild()
        self._queue: queue.Queue = queue.Queue(QUEUE_LIMIT)
        self._thread = threading.Thread(target=self._writer, name="store-ssd", daemon=True)
        self._thread.start()
        _log.info("SSD tier at %s: capacity %d bytes, %d object(s) (%d bytes) indexed", path, self.capacity,
                  len(self._index), self.used)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, file_name(key))

    def _rebuild(self) -> None:
        entries = []
        for name in os.listdir(self.path):
            full = os.path.join(self.path, name)
            if name.startswith("."):
                continue  # the disk id, or a write probe
            if name.endswith(".tmp"):
                os.unlink(full)  # a write interrupted by a crash
                continue
            try:
                with open(full, "rb") as f:
                    magic, klen, size, seq = _HEAD.unpack(f.read(_HEAD.size))
                    key = f.read(klen).decode()
                if magic == PENDING_MAGIC:
                    os.unlink(full)  # never recorded by the master: maybe stale or torn
                    continue
                if magic != MAGIC or os.path.getsize(full) != _HEAD.size + klen + size:
                    raise ValueError("bad header")
            except (OSError, ValueError, struct.error, UnicodeDecodeError):
                _log.warning("SSD tier: ignoring unreadable file %s", full)
                continue
            entries.append((os.path.getmtime(full), key, size, seq))
        for _, key, size, seq in sorted(entries):
            self._index[key] = (size, seq)
            self.used += size
            self._seq = max(self._seq, seq)

    # -- writes ------------------------------------------------------------------------------------------------
    def submit(self, key: str, data, version: int = 0) -> bool:
        """Queues `data` (a bytes-like object, read when the file is written) as the disk copy of `key`
        (replacing an older one), written for the master's offload task `version`. False when the queue is
        full (the write is dropped and counted)."""
        try:
            self._queue.put_nowait(("write", key, (data, version)))
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def free_slots(self) -> int:
        """How many more submits the queue takes now."""
        return max(0, QUEUE_LIMIT - self._queue.qsize() - 1)  # one slot kept for a discard or a flush

    def discard(self, objects: list[tuple[str, int]]) -> None:
        """Queues the deletion of files (key, seq; seq 0: whatever version) the master found obsolete. Never
        blocks (the heartbeat calls it): deletions wait in their own list, which the writer empties before
        each batch (a deletion names its file's seq, so its order against writes does not matter)."""
        if objects:
            self._discards.extend(objects)  # a deque: thread-safe without the index lock
            try:
                self._queue.put_nowait(("wake", None, None))
            except queue.Full:
                pass  # the writer is busy: it takes the deletions with its next batch

    def flush(self, timeout: float = 30.0) -> None:
        """Waits until every queued write is on disk and reported."""
        done = threading.Event()
        self._queue.put(("flush", done, None), timeout=timeout)
        done.wait(timeout)

    def _writer(self) -> None:
        while True:
            try:
                items = [self._queue.get(timeout=_RETRY_SEC)]
            except queue.Empty:
                items = []
            while len(items) < BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            discards = []
            while self._discards:
                discards.append(self._discards.popleft())
            if discards:
                self._delete(discards)
            stored, evicted, stop = [], [], False
            for op, a, b in items:
                if op == "write":
                    if self._closing:  # the memory to copy is about to be unmapped
                        self.dropped += 1
                        continue
                    try:
                        self._write(a, b[0], b[1], stored, evicted)
                    except OSError as e:
                        _log.warning("SSD tier: writing %r failed: %s", a, e)
                elif op == "wake":
                    pass
                elif op == "flush":
                    self._report(stored, evicted)
                    stored, evicted = [], []
                    a.set()
                else:
                    stop = True
            self._report(stored, evicted)
            if stop:
                return

    def _report(self, stored: list, evicted: list) -> None:
        try:
            with self._lock:  # only files still there as written (not evicted or replaced meanwhile)
                index = self._index
                stored = [o for o in self._unreported + stored if index.get(o[0]) == (o[1], o[2])]
            self._unreported = []
            if evicted:
                self.reporter.evicted(evicted)
            if stored:
                obsolete, confirmed, delivered = self.reporter.stored(stored)
                if not delivered:
                    self._unreported = stored[-_MAX_UNREPORTED:]
                self._confirm(confirmed)
                self._delete(obsolete)
        except Exception:  # a reporter bug must not stop the writer
            _log.exception("SSD tier: reporting to the master failed")

    def _write(self, key: str, data, version: int, stored: list, evicted: list) -> None:
        data = memoryview(data).cast("B")
        if len(data) > self.capacity:
            return
        kb = key.encode()
        path = self._file(key)
        with self._lock:
            self._seq += 1
            seq = self._seq
        with open(path + ".tmp", "wb") as f:
            f.write(_HEAD.pack(PENDING_MAGIC, len(kb), len(data), seq))
            f.write(kb)
            f.write(data)
        with self._lock:  # rename and index together: a concurrent delete sees one or the other
            os.replace(path + ".tmp", path)
            self.used += len(data) - self._index.pop(key, (0, 0))[0]
            self._index[key] = (len(data), seq)
            self._pending[key] = seq
            while self.used > self.capacity and self._index:
                k, (size, s) = self._index.popitem(last=False)
                self.used -= size
                self._hits.pop(k, None)
                self._pending.pop(k, None)
                self._unlink(k)
                evicted.append((k, s))
        stored.append((key, len(data), seq, version))

    def _delete(self, objects) -> None:
        with self._lock:
            for key, seq in objects:
                entry = self._index.get(key)
                if entry is None or (seq and entry[1] != seq):
                    continue
                del self._index[key]
                self._hits.pop(key, None)
                self._pending.pop(key, None)
                self.used -= entry[0]
                self._unlink(key)

    def _confirm(self, objects) -> None:
        """Marks the files (key, seq) the master recorded: they survive a restart."""
        with self._lock:  # a concurrent delete sees the file before or after
            for key, seq in objects:
                if self._pending.get(key) != seq:
                    continue
                try:
                    with open(self._file(key), "r+b") as f:
                        f.write(MAGIC)
                    del self._pending[key]
                except OSError as e:
                    _log.warning("SSD tier: confirming %r failed: %s", key, e)

    # -- reads ---------------------------------------------------------------------------------------------------
    def size(self, key: str) -> int | None:
        with self._lock:
            entry = self._index.get(key)
            return None if entry is None else entry[0]

    def lookup(self, key: str) -> tuple[int, int] | None:
        """(size, seq) of the file of `key`, or None."""
        with self._lock:
            return self._index.get(key)

    def entries(self) -> list[tuple[str, int, int]]:
        """(key, size, seq) of every confirmed file, least recently used first."""
        with self._lock:
            pending = self._pending
            return [(k, size, seq) for k, (size, seq) in self._index.items() if pending.get(k) != seq]

    def pending(self) -> list[tuple[str, int]]:
        """(key, seq) of the files the master did not confirm (yet)."""
        with self._lock:
            return list(self._pending.items())

    def open_value(self, key: str, seq: int = 0):
        """(file positioned at the value, size, seq, promote) for a read of `key` (version `seq`, 0: any), or
        None. Counts the read: promote is True on the PROMOTE_HITS-th read since the last promotion. The
        caller closes the file."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or (seq and entry[1] != seq):
                return None
            size, seq = entry
            self._index.move_to_end(key)
            hits = self._hits.get(key, 0) + 1
            self._hits[key] = 0 if hits >= PROMOTE_HITS else hits
        try:
            f = open(self._file(key), "rb")
        except OSError:
            return None
        try:
            magic, klen, fsize, fseq = _HEAD.unpack(f.read(_HEAD.size))
            if magic in (MAGIC, PENDING_MAGIC) and fsize == size and fseq == seq:
                f.seek(klen, os.SEEK_CUR)
                return f, size, seq, hits >= PROMOTE_HITS
        except (OSError, struct.error):
            pass
        f.close()
        return None

    def read(self, key: str, seq: int = 0) -> tuple[bytes, bool] | None:
        """(value, promote) or None."""
        opened = self.open_value(key, seq)
        if opened is None:
            return None
        f, size, _, promote = opened
        with f:
            data = f.read(size)
        return (data, promote) if len(data) == size else None

    def _unlink(self, key: str) -> None:
        try:
            os.unlink(self._file(key))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self._closing = True
        while self._thread.is_alive():
            try:
                self._queue.put(("stop", None, None), timeout=1.0)
                break
            except queue.Full:
                continue
        self._thread.join()  # no timeout: the caller unmaps the memory the writer may still be reading
