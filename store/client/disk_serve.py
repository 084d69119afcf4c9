"""Serving LOCAL_DISK replicas: the owner side (``DiskServer``) and the reader side (``DiskPeers``).

Protocol (DiskReplicaService in store/proto/mooncake_master.proto, framed protobuf over TCP as in
store/common/fast_rpc.py): a reader whose object only has a LOCAL_DISK replica calls ``ReadDiskObject(key,
seq)`` at the owner's endpoint (from the replica descriptor). The owner reads the file into a *hold*: space
in its registered staging buffer (``local_buffer_size``), or, when that is full or absent, a buffer it
registers with its Transfer Engine for the occasion; it answers (segment, address, size, handle). The
reader pulls the bytes with one Transfer Engine read and calls ``ReleaseDiskObject(handle)``.

Bounds: at most MAX_HOLDS holds and MC_STORE_DISK_SERVE_MAX_BYTES (default 1 GiB) held at once (beyond:
OBJECT_REPLICA_BUSY, the reader retries for a moment); a hold the reader never releases (it died) is
reclaimed MC_STORE_DISK_HOLD_MS (30 s) after the answer (checked on every read and by a timer); a reader
treats a release not answered OK as a failed transfer (the bytes may have been reused meanwhile). Calls to an
owner time out after MC_STORE_DISK_RPC_TIMEOUT_MS (5 s). An owner that cannot be reached (connection refused:
RPC_FAIL; no answer in time: RPC_TIMEOUT) is taken for dead for DEAD_SEC: reads of its replicas fail at once
with RPC_FAIL meanwhile, so a batch of its keys costs one timeout, not one each (the master drops its
replicas when its liveness expires). OBJECT_NOT_FOUND means the owner answered that it has no such file.

Listener bounds (fast_rpc's framing): a request frame is at most _MAX_FRAME bytes (a key and a number), the
requests being received hold at most _MAX_INFLIGHT bytes together, and at most _MAX_CONNECTIONS readers are
connected at once.

Threading: the server runs one thread per connection (fast_rpc); all state is under one lock.
``DiskPeers`` is shared by the store's threads (FastRpcClient keeps one connection per thread).
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import stat
import threading
import time

import grpc
import numpy as np

from mooncake.store.client.ssd import DISK_ID_FILE
from mooncake.store.common.protocol import MAX_KEY_BYTES
from mooncake.store.common.errors import ErrorCode
from mooncake.store.common.fast_rpc import FastRpcClient, FastRpcError, FastRpcServer
from mooncake.store.proto import mooncake_master_pb2 as pb

_log = logging.getLogger("mooncake.store.client.disk")
MAX_HOLDS = 64
_BUSY_RETRY_SEC = 2.0
DEAD_SEC = 3.0  # an owner that did not answer is not asked again for this long
DIR_TTL_SEC = 30.0  # how often DiskPeers.local_dir checks a visible directory's id file again
NO_DIR_TTL_SEC = 5.0  # how long "not visible here" is kept
_MAX_FRAME = MAX_KEY_BYTES + 1024
_MAX_INFLIGHT = 16 << 20
_MAX_CONNECTIONS = 256


def _env_ms(name: str, default: int) -> float:
    return float(os.environ.get(name, default)) / 1000.0


class _Hold:
    __slots__ = ("addr", "size", "deadline", "release")

    def __init__(self, addr: int, size: int, deadline: float, release) -> None:
        self.addr, self.size, self.deadline, self.release = addr, size, deadline, release


class DiskServer:
    """Serves `disk` (ssd.DiskTier) at host:port (0: ephemeral); ``endpoint`` is what readers dial.

    ``evicted(key, seq)`` is called for a read of a key the tier does not have at all (the master still
    lists it: its EvictDiskReplica report was lost); the client reports it again."""

    def __init__(self, disk, engine, staging, segment_name: str, host: str, port: int = 0, evicted=None) -> None:
        self._disk = disk
        self._engine = engine
        self._staging = staging
        self._segment = segment_name
        self._evicted = evicted
        self._hold_sec = _env_ms("MC_STORE_DISK_HOLD_MS", 30000)
        self._max_bytes = int(os.environ.get("MC_STORE_DISK_SERVE_MAX_BYTES", 1 << 30))
        self._holds: dict[int, _Hold] = {}
        self._held_bytes = 0
        self._next = 1
        self._lock = threading.Lock()
        limits = dict(service="DiskReplicaService", thread_name="store-disk-rpc", max_frame=_MAX_FRAME,
                      max_inflight=_MAX_INFLIGHT, max_connections=_MAX_CONNECTIONS)
        try:
            self._server = FastRpcServer(self, host, port, **limits)
        except OSError:  # a hostname that is not a local address: listen on all of them
            self._server = FastRpcServer(self, "::" if ":" in host else "0.0.0.0", port, **limits)
        self.endpoint = f"[{host}]:{self._server.port}" if ":" in host else f"{host}:{self._server.port}"
        self.served = 0
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="store-disk-reap", daemon=True)

    def start(self) -> "DiskServer":
        self._server.start()
        self._reaper.start()
        return self

    def _reap(self) -> None:
        """Reclaims expired holds even when no read comes in."""
        period = min(1.0, max(0.01, self._hold_sec / 4))
        while not self._stop.wait(period):
            self._expire(time.monotonic())

    # -- DiskReplicaService ------------------------------------------------------------------------------------
    def ReadDiskObject(self, request, context):
        self._expire(time.monotonic())
        opened = self._disk.open_value(request.key, request.seq)
        if opened is None:
            if self._evicted is not None and self._disk.lookup(request.key) is None:
                self._evicted(request.key, request.seq)
            return pb.DiskReadReply(code=ErrorCode.OBJECT_NOT_FOUND)
        f, size, _, promote = opened
        with f:
            hold = self._alloc(size)
            if hold is None:
                return pb.DiskReadReply(code=ErrorCode.OBJECT_REPLICA_BUSY)
            view = memoryview((ctypes.c_char * size).from_address(hold.addr)).cast("B")
            n = 0
            try:
                while n < size:
                    k = f.readinto(view[n:])
                    if not k:
                        break
                    n += k
            except OSError as e:
                _log.warning("SSD tier: reading %r failed: %s", request.key, e)
            finally:
                view.release()
        if n != size:
            hold.release()
            return pb.DiskReadReply(code=ErrorCode.OBJECT_NOT_FOUND)
        hold.deadline = time.monotonic() + self._hold_sec  # the reader's time starts with the answer
        with self._lock:
            handle = self._next
            self._next += 1
            self._holds[handle] = hold
            self.served += 1
        return pb.DiskReadReply(code=0, segment_name=self._segment, address=hold.addr, size=size, handle=handle,
                                promote=promote)

    def DescribeDisk(self, request, context):
        return pb.DiskDescribeReply(code=0, path=os.path.abspath(self._disk.path), disk_id=self._disk.disk_id)

    def ReleaseDiskObject(self, request, context):
        with self._lock:
            hold = self._holds.pop(request.handle, None)
        if hold is None:
            return pb.StatusReply(code=ErrorCode.INVALID_PARAMS)
        hold.release()
        return pb.StatusReply(code=0)

    # -- holds -------------------------------------------------------------------------------------------------
    def _alloc(self, size: int) -> _Hold | None:
        with self._lock:
            if len(self._holds) >= MAX_HOLDS or self._held_bytes + size > self._max_bytes:
                return None
            self._held_bytes += size
        deadline = float("inf")  # set once the file is read (ReadDiskObject)
        staging = self._staging
        addr = staging.alloc(size)
        if addr is not None:
            return _Hold(addr, size, deadline, lambda: self._freed(size, staging.free, addr))
        buf = np.empty(size, dtype=np.uint8)  # registered for the transfer only
        addr = buf.ctypes.data
        if self._engine.register_memory(addr, size) != 0:
            self._freed(size)
            return None

        def release(buf=buf) -> None:
            self._engine.unregister_memory(buf.ctypes.data)
            self._freed(size)
        return _Hold(addr, size, deadline, release)

    def _freed(self, size: int, free=None, addr: int = 0) -> None:
        if free is not None:
            free(addr)
        with self._lock:
            self._held_bytes -= size

    def _expire(self, now: float) -> None:
        with self._lock:
            late = [h for h, hold in self._holds.items() if hold.deadline <= now]
            holds = [self._holds.pop(h) for h in late]
        for hold in holds:
            _log.warning("SSD tier: a reader did not release %d bytes in %.0f s; reclaimed", hold.size,
                         self._hold_sec)
            hold.release()

    def close(self) -> None:
        self._server.stop()
        self._stop.set()
        if self._reaper.is_alive():
            self._reaper.join()
        with self._lock:
            holds, self._holds = list(self._holds.values()), {}
        for hold in holds:
            hold.release()


class DiskPeers:
    """The reader side: one FastRpcClient per owner endpoint."""

    def __init__(self) -> None:
        self.timeout = _env_ms("MC_STORE_DISK_RPC_TIMEOUT_MS", 5000)
        self._clients: dict[str, FastRpcClient] = {}
        self._dead: dict[str, float] = {}  # endpoint -> monotonic time until which it is taken for dead
        self._dirs: dict[str, tuple] = {}  # endpoint -> (its directory seen here or None, disk id, until)
        self._lock = threading.Lock()

    def _client(self, endpoint: str) -> FastRpcClient:
        with self._lock:
            c = self._clients.get(endpoint)
            if c is None:
                host, _, port = endpoint.rpartition(":")
                c = self._clients[endpoint] = FastRpcClient(host.strip("[]"), int(port), self.timeout,
                                                            service="DiskReplicaService",
                                                            connect_timeout=self.timeout)
            return c

    def _forget(self, endpoint: str, c: FastRpcClient, dead: bool = False) -> None:
        with self._lock:
            if self._clients.get(endpoint) is c:
                del self._clients[endpoint]
            if dead:
                self._dead[endpoint] = time.monotonic() + DEAD_SEC
        c.close()

    def _is_dead(self, endpoint: str) -> bool:
        with self._lock:
            until = self._dead.get(endpoint)
            if until is None:
                return False
            if time.monotonic() < until:
                return True
            del self._dead[endpoint]
            return False

    def local_dir(self, endpoint: str) -> str | None:
        """The directory of the tier at `endpoint` when this host sees it (its `.mooncake-disk-id` holds the
        id the owner gives), else None. The owner is asked once (DescribeDisk); afterwards the id file is only
        checked again locally every DIR_TTL_SEC (an owner that restarted writes a new id: the owner is asked
        again), so reads need no RPC to the owner. "Not visible" answers are kept for NO_DIR_TTL_SEC."""
        now = time.monotonic()
        with self._lock:
            got = self._dirs.get(endpoint)
        if got is not None and now < got[2]:
            return got[0]
        if got is not None and got[0] is not None and _read_disk_id(got[0]) == got[1]:
            with self._lock:
                self._dirs[endpoint] = (got[0], got[1], now + DIR_TTL_SEC)
            return got[0]
        found, disk_id = None, ""
        if not self._is_dead(endpoint):
            try:
                reply = self._client(endpoint).call("DescribeDisk", pb.DiskDescribeRequest())
                if reply.code == 0 and reply.path and reply.disk_id and _read_disk_id(reply.path) == reply.disk_id:
                    found, disk_id = reply.path, reply.disk_id
            except Exception as e:  # noqa: BLE001  an owner without DescribeDisk, another host, a bad answer
                _log.debug("disk tier at %s: its files are not read directly: %s", endpoint, e)
        with self._lock:
            if len(self._dirs) > 4096:
                self._dirs.clear()
            self._dirs[endpoint] = (found, disk_id, now + (DIR_TTL_SEC if found else NO_DIR_TTL_SEC))
        return found

    def read(self, endpoint: str, key: str, seq: int, pull) -> tuple[int, bool]:
        """Asks the owner at `endpoint` for `key` and calls ``pull(segment, address, size)`` (-> True when the
        bytes arrived) while it holds them. Returns (size or a negative code, promote): OBJECT_NOT_FOUND when the
        owner has no such file, RPC_FAIL / RPC_TIMEOUT when it could not be asked (RPC_FAIL at once while it is
        taken for dead)."""
        if self._is_dead(endpoint):
            _log.debug("get %r: the owner of its disk replica (%s) did not answer lately", key, endpoint)
            return int(ErrorCode.RPC_FAIL), False
        try:
            c = self._client(endpoint)
        except ValueError:
            return int(ErrorCode.INVALID_PARAMS), False
        deadline = time.monotonic() + _BUSY_RETRY_SEC
        try:
            while True:
                reply = c.call("ReadDiskObject", pb.DiskReadRequest(key=key, seq=seq))
                if reply.code != ErrorCode.OBJECT_REPLICA_BUSY or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        except FastRpcError as e:
            timeout = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            dead = timeout or e.code() == grpc.StatusCode.UNAVAILABLE
            self._forget(endpoint, c, dead)
            what = "unreachable" if dead else "failed"
            _log.warning("get %r: the owner of its disk replica (%s) is %s: %s%s", key, endpoint, what, e.details(),
                         f" (not asked again for {DEAD_SEC:.0f} s)" if dead else "")
            return int(ErrorCode.RPC_TIMEOUT if timeout else ErrorCode.RPC_FAIL), False
        if reply.code != 0:
            if reply.code == ErrorCode.OBJECT_REPLICA_BUSY:
                _log.warning("get %r: the owner of its disk replica (%s) is busy", key, endpoint)
            return reply.code, False
        ok = False
        try:
            ok = pull(reply.segment_name, reply.address, reply.size)
        finally:
            # Only a hold released by us was held during the whole pull: one the owner reclaimed (too slow a
            # pull) or an unknown answer means the bytes may have been overwritten meanwhile.
            try:
                released = c.call("ReleaseDiskObject", pb.DiskReleaseRequest(handle=reply.handle)).code == 0
            except FastRpcError as e:
                self._forget(endpoint, c)
                _log.warning("get %r: releasing its disk replica at %s failed: %s", key, endpoint, e.details())
                released = False  # the owner reclaims the hold after its timeout
            if ok and not released:
                _log.warning("get %r: the owner (%s) reclaimed its hold during the transfer", key, endpoint)
                ok = False
        return (reply.size, reply.promote) if ok else (int(ErrorCode.TRANSFER_FAIL), False)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()


def _read_disk_id(directory: str) -> str | None:
    """The content of `directory`'s disk id file, or None: absent, not a regular file (never a FIFO that would
    block, never through a symlink), unreadable."""
    try:
        fd = os.open(os.path.join(directory, DISK_ID_FILE), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 256).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def advertised_host(segment_name: str) -> str:
    """The host part of a Transfer Engine segment name (host:port, [v6]:port)."""
    host = segment_name.rsplit(":", 1)[0] if segment_name.count(":") == 1 or segment_name.startswith("[") \
        else segment_name
    host = host.strip("[]")
    return host or socket.gethostname()
