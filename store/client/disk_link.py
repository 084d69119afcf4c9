"""The SSD tier side of a store client (see core.py's docstring and store/README.md): declaring the tier to
the master and re-reporting its files, offload tasks and drop notices from pings, and reads of objects whose
only replica is a LOCAL_DISK one.

A mixin of StoreCore: the methods use its state (``_master``, ``_disk``, ``_disk_peers``, ``_global``, the
disk-sync counters) and its data path (``_rpc``, ``_pin``, ``_transfer``, ``put_many``, ``_cache_drop``).
Threading: ``_on_ping``/``_disk_tick`` run on the heartbeat thread and never block; the declare/reload work
runs on its own "store-ssd-sync" thread.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

import grpc

from mooncake import file_segment
from mooncake.store.client import ssd
from mooncake.store.client.guard import NOT_READY
from mooncake.store.client.memory import BYTES_DATA, scatter
from mooncake.store.common.errors import ErrorCode, code_name
from mooncake.store.proto import mooncake_master_pb2 as pb

if TYPE_CHECKING:
    from mooncake.store.client.core import _Entry

_log = logging.getLogger("mooncake.store.client")

OK = int(ErrorCode.OK)
_NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
_CLIENT_NOT_FOUND = int(ErrorCode.CLIENT_NOT_FOUND)
_REPORT_CHUNK = 4096  # disk objects per NotifyOffloadSuccess


class DiskLinkMixin:
    def _declare_disk(self) -> int:
        """MountLocalDisk. The files no master confirmed before this mount are deleted first (their tasks
        belong to a master, or a mount, gone)."""
        disk, server = self._disk, self._disk_server
        if disk is None or server is None:
            return OK
        disk.discard(disk.pending())  # taken before the mount: a task of the new mount is not among them
        reply = self._rpc("MountLocalDisk", endpoint=server.endpoint)
        return reply if isinstance(reply, int) else reply.code

    def _reload_disk(self, disk) -> int:
        """Every confirmed file of the tier again (after setup: the rebuilt index; after a remount: what the
        master lost). Obsolete files (the object changed meanwhile) are deleted."""
        objects = disk.entries()
        stale = []
        for i in range(0, len(objects), _REPORT_CHUNK):
            if self._disk is not disk:
                return NOT_READY  # closing
            chunk = objects[i:i + _REPORT_CHUNK]
            reply = self._rpc("NotifyOffloadSuccess", reload=True,
                              objects=[pb.DiskObject(key=k, size=n, seq=seq) for k, n, seq in chunk])
            if isinstance(reply, int):
                return reply
            if _CLIENT_NOT_FOUND in reply.codes:
                return _CLIENT_NOT_FOUND  # the master forgot the tier meanwhile: declare it again
            stale += [(k, seq) for (k, _, seq), c in zip(chunk, reply.codes) if c == _NOT_FOUND]
        disk.discard(stale)
        if objects:
            _log.info("SSD tier: %d object(s) reported to the master (%d obsolete)", len(objects), len(stale))
        return OK

    def _disk_lost_now(self) -> None:
        """The master may have lost the tier (remount, CLIENT_NOT_FOUND): the next ping declares it again."""
        with self._disk_sync_lock:
            self._disk_lost += 1

    def _on_ping(self, reply) -> None:
        if reply.client_status == pb.CLIENT_STATUS_OK and not reply.disk_mounted:
            self._disk_lost_now()  # e.g. a MountLocalDisk that failed, or the tier unmounted behind our back
        self._disk_tick()

    def _disk_tick(self, declare: bool = True) -> None:
        """Each ping (heartbeat thread; must not block): unless the master knows the tier as it is, starts a
        thread that declares it (unless `declare` is False: setup did) and reports its files again."""
        with self._disk_sync_lock:
            disk = self._disk
            if disk is None or self._disk_synced == self._disk_lost or \
                    (self._disk_sync_thread is not None and self._disk_sync_thread.is_alive()):
                return
            t = threading.Thread(target=self._sync_disk, args=(disk, self._disk_lost, declare),
                                 name="store-ssd-sync", daemon=True)
            self._disk_sync_thread = t
            t.start()

    def _sync_disk(self, disk, epoch: int, declare: bool) -> None:
        code = self._declare_disk() if declare else OK
        if code == OK:
            code = self._reload_disk(disk)
        with self._disk_sync_lock:
            if code == OK and self._disk_lost == epoch:
                self._disk_synced = epoch
        if code != OK and self._disk is disk:
            _log.warning("SSD tier: declaring it to the master failed (%s); retried with the next ping",
                         code_name(code))

    def _report_stored(self, objects: list) -> tuple[list, list, bool]:
        """(obsolete files, files the master recorded, delivered). A tier the master does not know
        (CLIENT_NOT_FOUND: it restarted, or forgot this client) never handed out these tasks: obsolete."""
        reply = self._rpc("NotifyOffloadSuccess", objects=[pb.DiskObject(key=k, size=n, seq=seq, version=v)
                                                           for k, n, seq, v in objects])
        if isinstance(reply, int):
            return [], [], reply == NOT_READY  # closed: nothing to retry; RPC failure: offer them again
        if _CLIENT_NOT_FOUND in reply.codes:
            self._disk_lost_now()
        codes = list(zip(objects, reply.codes))
        return ([(k, seq) for (k, _, seq, _), c in codes if c in (_NOT_FOUND, _CLIENT_NOT_FOUND)],
                [(k, seq) for (k, _, seq, _), c in codes if c == OK], True)

    def _disk_drops_soon(self) -> None:
        """After a removal: this client's own files of removed objects go with the master's drop notices
        (each names the version of the file the master recorded, so a file re-put and persisted meanwhile
        stays), fetched by a ping now rather than at the next heartbeat."""
        master = self._master
        if self._disk is not None and master is not None:
            master.ping_soon()

    def _on_disk_drops(self, objects: list) -> bool:
        disk = self._disk
        if disk is None:
            return False  # not handled: not acknowledged
        disk.discard([(o.key, o.seq) for o in objects])
        return True

    def _on_offload(self, tasks: list) -> None:
        """Offload tasks from a ping: the tier writes each object from this client's segment memory (no copy
        before the write; if the master reused the memory meanwhile, it refuses the report and the file goes).
        The segment stays mapped until the tier is closed."""
        disk = self._disk
        base, size = self._global
        if disk is None:
            return
        for t in tasks:
            if not (base <= t.address and t.address + t.size <= base + size) or t.size == 0:
                _log.warning("SSD tier: offload task for %r outside this client's segment; ignored", t.key)
                continue
            view = memoryview((ctypes.c_char * t.size).from_address(t.address)).cast("B")
            disk.submit(t.key, view, t.version)

    def _flush_disk(self, timeout: float = 30.0) -> bool:
        """Waits until every object committed to this client's segment so far is persisted by its SSD tier
        (or its offload task failed or was dropped): pings for tasks until the master has none queued, then
        drains the tier. False on timeout or without an SSD tier."""
        master, disk = self._master, self._disk
        if master is None or disk is None:
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = master.ping_once()
            except grpc.RpcError:
                time.sleep(0.05)
                continue
            disk.flush(max(0.0, deadline - time.monotonic()))
            if not reply.offload_backlog:
                return True
        return False

    def _report_evicted(self, objects: list) -> None:
        self._rpc("EvictDiskReplica", objects=[pb.DiskObject(key=k, seq=seq) for k, seq in objects])

    def _read_disk_replica(self, key: str, e: _Entry, regions: list, registered: bool) -> int:
        """Reads an object that only has a LOCAL_DISK replica into `regions` (from this client's tier, or
        from the owner's staging memory); bytes read or a negative code. Promotes a hot object."""
        rep = e.disk[0]
        master, disk = self._master, self._disk
        if disk is not None and master is not None and rep.client_id == master.client_id:
            got = disk.read(key, rep.disk_seq)
            if got is None:
                if disk.lookup(key) is None:  # gone from the tier: make sure the master forgets it
                    self._report_evicted([(key, rep.disk_seq)])
                return _NOT_FOUND
            data, promote = got
            scatter(id(data) + BYTES_DATA, regions)
            size = len(data)
        else:
            peers = self._disk_peers
            if peers is None:
                return NOT_READY
            direct = self._read_owner_file(peers, key, e, regions, registered)
            if direct is not None:
                size, promote = direct
                return self._promote_if_hot(key, regions, registered, size, promote)

            def pull(segment: str, address: int, size: int) -> bool:
                if size != e.size:
                    return False
                pinned = self._pin(regions, registered, True, write_out=True)
                if pinned is None:
                    return False
                local, release = pinned
                ops, off, where = [], 0, pb.ReplicaDescriptor(segment_name=segment)  # the owner's staging
                for a, n in local:
                    ops.append((where, a, address + off, n, 0))
                    off += n
                try:
                    failed = self._transfer(ops, write=False)
                finally:
                    release()
                return not failed
            size, promote = peers.read(rep.transport_endpoint, key, rep.disk_seq, pull)
            if size < 0:
                return size
        return self._promote_if_hot(key, regions, registered, size, promote)

    def _promote_if_hot(self, key: str, regions: list, registered: bool, size: int, promote: bool) -> int:
        if promote:
            code = self.put_many([key], [regions], registered, None, promote=True)[0]
            self._cache_drop([key])  # the cached disk-only descriptor is outdated now
            if code == OK:
                _log.info("SSD tier: %r is hot again, promoted to memory", key)
            else:
                _log.debug("SSD tier: promoting %r: %s", key, code_name(code))
        return size

    def _read_owner_file(self, peers, key: str, e: _Entry, regions: list, registered: bool):
        """An object whose only replica is in another client's SSD tier, read straight from the owner's file
        when this host sees the owner's directory (DiskPeers.local_dir): one Transfer Engine batch over the file
        transport (header and value), no RPC to the owner. (size, promote), or None: not possible here or the
        file is not the replica's (another version, gone, torn); the caller then asks the owner."""
        rep = e.disk[0]
        engine = self._engine
        if engine is None:
            return None
        if getattr(self, "_file_reads", None) is None:
            self._file_reads = _file_reads_enabled(engine)
        if not self._file_reads:
            return None
        directory = peers.local_dir(rep.transport_endpoint)
        if directory is None:
            return None
        path = os.path.join(directory, ssd.file_name(key))
        head_len = ssd.value_offset(key)
        try:
            if os.stat(path).st_size != head_len + e.size:
                return None
        except OSError:
            return None
        head = self._staging.alloc(head_len)
        if head is None:
            return None
        # One name per thread (a definition replaces the thread's previous one): the engine keeps a handle per
        # name it was asked for, so names must not grow with the number of reads.
        name = f"mooncake-ssd/{threading.get_ident()}"
        defined, failed = False, set()
        try:
            # Read-only, through the page cache: the owner wrote the file lately (ssd_bench: O_DIRECT reads of
            # such files are about 2x slower than the owner's path, buffered ones 1.5x faster).
            text = file_segment.descriptor(name, [(path, head_len + e.size)], direct=False, read_only=True)
            if engine.define_segment(name, text) != 0:
                return None
            defined = True
            pinned = self._pin(regions, registered, True, write_out=True)
            if pinned is None:
                return None
            local, release = pinned
            where = pb.ReplicaDescriptor(segment_name=name)
            ops, off = [(where, head, file_segment.BASE, head_len, 0)], head_len
            for a, n in local:
                ops.append((where, a, file_segment.BASE + off, n, 0))
                off += n
            try:
                failed = self._transfer(ops, write=False)
            finally:
                release()  # on a bad header the caller's regions are filled again by the owner's answer
            good = not failed and ssd.check_header(ctypes.string_at(head, head_len), key, e.size, rep.disk_seq)
        finally:
            if defined:
                engine.undefine_segment(name)
            if failed:
                # A transfer that timed out may still be reading into it: never hand this staging out again.
                _log.warning("get %r: reading the owner's file failed; %d staging bytes kept aside", key, head_len)
            else:
                self._staging.free(head)
        if not good:
            _log.debug("get %r: the owner's file did not hold its disk replica; asking the owner", key)
            return None
        return e.size, _direct_hits.hot(key)


class _Hits:
    """Reads of disk-only objects this client made straight from owners' files, per key (bounded): every
    PROMOTE_HITS-th read says "promote", as the owner's own count does for reads through it."""

    def __init__(self, limit: int = 1 << 16) -> None:
        self._counts: dict[str, int] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def hot(self, key: str) -> bool:
        with self._lock:
            n = self._counts.pop(key, 0) + 1
            if n < ssd.PROMOTE_HITS:
                if len(self._counts) >= self._limit:
                    self._counts.pop(next(iter(self._counts)))
                self._counts[key] = n
                return False
            return True


_direct_hits = _Hits()


def _file_reads_enabled(engine) -> bool:
    """MC_STORE_SSD_DIRECT_READ: "auto" (default) or "1": when the engine has the file transport; "0": never."""
    if os.environ.get("MC_STORE_SSD_DIRECT_READ", "auto").lower() in ("0", "false", "off", "no"):
        return False
    try:
        has_file = "file" in json.loads(engine.get_stats())
    except (ValueError, AttributeError, TypeError):
        has_file = False
    _log.info("SSD tier: other clients' disk replicas are read %s", "from their files on this host where "
              "visible (file transport)" if has_file else "through their owners (no file transport here)")
    return has_file


class DiskReporter:
    """ssd.Reporter of a StoreCore: the tier's reports become master RPCs."""

    def __init__(self, core) -> None:
        self._core = core

    def stored(self, objects):
        return self._core._report_stored(objects)

    def evicted(self, objects) -> None:
        self._core._report_evicted(objects)
