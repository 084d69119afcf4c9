"""SSD tier of a store client (``enable_ssd_offload=True``, ``ssd_offload_path``): a local file per object.

Write path: every successful put/upsert of this client is queued and written by one background thread
(write-through, so an object the master later evicts from memory is already on disk; a full queue drops
the write and counts it). Files are written to a temporary name and renamed, so a crash never leaves a
torn object. Read path: a get the master answers OBJECT_NOT_FOUND (evicted, or a master that restarted)
reads the file; the PROMOTE_HITS-th disk hit of a key puts it back into memory (asynchronously).

Capacity: ``capacity`` bytes (MC_STORE_SSD_CAPACITY, human-readable; default 80 % of the free space of the
directory at setup); beyond it the least recently used files are deleted. Restart: the index (key, size,
last use) is rebuilt from the files' headers at start-up, so the tier survives a client restart.

File format: magic b"MCSSD001", u32 key length, u64 value length, key (UTF-8), value. Name: sha1(key).
Threading: all methods are thread-safe; ``close`` drains the queue and stops the thread.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import queue
import re
import shutil
import struct
import threading

_log = logging.getLogger("mooncake.store.client.ssd")
MAGIC = b"MCSSD001"
_HEAD = struct.Struct("<8sIQ")
PROMOTE_HITS = 2
QUEUE_LIMIT = 1024


class DiskTier:
    def __init__(self, path: str, capacity: int | None = None) -> None:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-probe")
        with open(probe, "wb") as f:  # self-check: the directory is writable
            f.write(b"ok")
        os.unlink(probe)
        self.path = path
        self.capacity = capacity if capacity else int(shutil.disk_usage(path).free * 0.8)
        self._lock = threading.Lock()
        self._index: collections.OrderedDict[str, int] = collections.OrderedDict()  # key -> size, LRU order
        self._hits: dict[str, int] = {}
        self.used = 0
        self.dropped = 0
        self._rebuild()
        self._queue: queue.Queue = queue.Queue(QUEUE_LIMIT)
        self._thread = threading.Thread(target=self._writer, name="store-ssd", daemon=True)
        self._thread.start()
        _log.info("SSD tier at %s: capacity %d bytes, %d object(s) (%d bytes) indexed", path, self.capacity,
                  len(self._index), self.used)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, hashlib.sha1(key.encode()).hexdigest())

    def _rebuild(self) -> None:
        entries = []
        for name in os.listdir(self.path):
            full = os.path.join(self.path, name)
            if name.endswith(".tmp"):
                os.unlink(full)  # a write interrupted by a crash
                continue
            try:
                with open(full, "rb") as f:
                    magic, klen, size = _HEAD.unpack(f.read(_HEAD.size))
                    key = f.read(klen).decode()
                if magic != MAGIC or os.path.getsize(full) != _HEAD.size + klen + size:
                    raise ValueError("bad header")
            except (OSError, ValueError, struct.error, UnicodeDecodeError):
                _log.warning("SSD tier: ignoring unreadable file %s", full)
                continue
            entries.append((os.path.getmtime(full), key, size))
        for _, key, size in sorted(entries):
            self._index[key] = size
            self.used += size

    # -- writes ------------------------------------------------------------------------------------------------
    def submit(self, key: str, data: bytes) -> None:
        """Queues `data` as the disk copy of `key` (replacing an older one)."""
        try:
            self._queue.put_nowait((key, data))
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout: float = 30.0) -> None:
        """Waits until every queued write is on disk."""
        done = threading.Event()
        self._queue.put((None, done), timeout=timeout)
        done.wait(timeout)

    def _writer(self) -> None:
        while True:
            key, data = self._queue.get()
            if key is None:
                if data is None:
                    return
                data.set()
                continue
            try:
                self._write(key, data)
            except OSError as e:
                _log.warning("SSD tier: writing %r failed: %s", key, e)

    def _write(self, key: str, data: bytes) -> None:
        if len(data) > self.capacity:
            return
        kb = key.encode()
        path = self._file(key)
        with open(path + ".tmp", "wb") as f:
            f.write(_HEAD.pack(MAGIC, len(kb), len(data)))
            f.write(kb)
            f.write(data)
        os.replace(path + ".tmp", path)
        with self._lock:
            self.used += len(data) - self._index.pop(key, 0)
            self._index[key] = len(data)
            victims = []
            while self.used > self.capacity and self._index:
                k, size = self._index.popitem(last=False)
                self.used -= size
                victims.append(k)
        for k in victims:
            self._unlink(k)

    # -- reads / removal ---------------------------------------------------------------------------------------
    def size(self, key: str) -> int | None:
        with self._lock:
            return self._index.get(key)

    def read(self, key: str) -> tuple[bytes, bool] | None:
        """(value, promote) or None; promote is True on the PROMOTE_HITS-th read since the last promotion."""
        with self._lock:
            if key not in self._index:
                return None
            self._index.move_to_end(key)
            hits = self._hits.get(key, 0) + 1
            self._hits[key] = 0 if hits >= PROMOTE_HITS else hits
        try:
            with open(self._file(key), "rb") as f:
                _, klen, size = _HEAD.unpack(f.read(_HEAD.size))
                f.seek(klen, os.SEEK_CUR)
                data = f.read(size)
        except OSError:
            return None
        return (data, hits >= PROMOTE_HITS) if len(data) == size else None

    def remove(self, keys) -> int:
        n = 0
        for k in keys:
            with self._lock:
                size = self._index.pop(k, None)
                self._hits.pop(k, None)
                if size is None:
                    continue
                self.used -= size
            self._unlink(k)
            n += 1
        return n

    def remove_matching(self, pattern: str | None) -> int:
        """Removes keys matching `pattern` (re.search), or every key for None."""
        with self._lock:
            keys = [k for k in self._index if pattern is None or re.search(pattern, k)]
        return self.remove(keys)

    def _unlink(self, key: str) -> None:
        try:
            os.unlink(self._file(key))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self._queue.put((None, None))
        self._thread.join(timeout=30)
