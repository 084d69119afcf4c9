"""The store client's core: lifecycle (setup/close/health), master RPCs, the replica descriptor cache and the
data path (puts and gets of byte regions). The public API classes (store.py, tensor.py) build on it.

Data path. A put is BatchPutStart (the master allocates one contiguous buffer per replica, PROCESSING) ->
the client writes its source regions into every replica -> BatchPutEnd (COMPLETE, readable); a key whose
write failed is BatchPutRevoke'd, so nothing half-written is ever readable. A single-key, one-replica put
takes one master call instead: it writes into space reserved for this client and commits with PutReserved
(reserved.py). A get looks the key up
(descriptor cache or BatchGetReplicaList, which grants a read lease), reads one COMPLETE replica (this
process's own segment first: a plain memcpy; otherwise one Transfer Engine transfer per segment and batch,
which is itself a memcpy for a same-host peer's memfd segment) and fails with LEASE_EXPIRED (-707) if the
lease ran out before the read finished.

Local memory rule: the Transfer Engine only moves data from/to registered memory. Regions that are not
registered (Python bytes, unregistered arrays) are staged through the registered staging pool for small
values, or registered for the duration of the transfer (zero copy) for values of ZERO_COPY_MIN bytes and
more or when the pool is full. A replica in this client's own segment never needs registration (memcpy).

Shared engine rule (setup's ``engine``): the store uses that Transfer Engine as its own (segment name,
metadata, transports) but never closes it. Memory its owner registered is usable as it is (register_buffer
and the registration of values for a transfer accept it, and never unregister it); at close the store
undoes only what it did: its register_buffer registrations and its managed buffers (segment, staging, pool).
One store per engine (a second one is refused): both would mount segments under the engine's one name.

Descriptor cache rule (why repeated gets skip the master): after GetReplicaList the client keeps the key's
replica descriptors until ``t_request + lease_ttl * (1 - CACHE_MARGIN)``, where t_request is taken *before*
the RPC was sent (so the local deadline is never later than the master's). While the lease lives the master
neither evicts nor (non-force) removes the object, so its buffers hold this value. Exceptions, documented
for users: a ``force`` remove or ``remove_all(force=True)`` by another client, an ``upsert`` by another
client (readers may see the new value), and a master restart (detected within one heartbeat, then the
cache is dropped). This client's own remove/upsert/remove_* drop the affected entries at once; a failed
read through a cached entry drops it and retries once with a fresh lookup. Cache hits do not extend leases.
A master that dies takes its leases with it, and its successor hands remounted memory out again after
segments.REMOUNT_HOLD_SEC: so a descriptor (cached or just looked up) is also trusted only until TRUST_SEC
after the later of its lookup and the last ping the same master answered (``_usable``); a read that ends
later counts as one whose lease ran out.

Replica identity rule: a replica is in this process's segment when its ``segment_id`` is this instance's
(a random id drawn at each setup), never because its ``segment_name`` matches: a client restarted under its
old name shares the name with the dead predecessor's segment. Local replicas are copied with memmove, and
only within the segment this client mapped (``_copy``); a replica under this name but of another instance is
never touched (the Transfer Engine would resolve the name to this process). Data-path calls run between
``_enter`` and ``_leave`` (``guard.while_open``): close waits for them before the engine unmaps their memory.

SSD tier (``enable_ssd_offload``): the objects in this client's segment, whoever wrote them, are persisted
by this client (owner-driven, as in Mooncake): the master hands it offload tasks with its pings (as many as
its tier's queue takes), the tier copies each object from the segment into a file (ssd.py) and reports it
with the task's version; the master records it as a LOCAL_DISK replica of this client unless the object
changed meanwhile. This client serves its files to readers (disk_serve.py) and re-reports them after a
restart or a remount. A read whose object only has a disk replica asks its owner (this client: a file read)
and pulls the bytes from the owner's staging memory; the owner says when the object became hot and the
reader then gives it a memory replica again (PutStart ``promote``). That side of the client is in disk_link.py.

Threading: every public method may be called from several threads once ``setup`` returned.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import socket
import threading
import time
import uuid

import grpc

from mooncake.store.client.config import ReplicateConfig, SetupConfig
from mooncake.store.client.disk_link import DiskLinkMixin, DiskReporter
from mooncake.store.client.guard import NOT_READY, all_failed, while_open
from mooncake.store.client.device_memory import DeviceBuffers
from mooncake.store.client.memory import BYTES_DATA, ZERO_COPY_MIN, RegisteredRanges, StagingPool, gather, scatter
from mooncake.store.client.reads import ReadPathMixin
from mooncake.store.client.reserved import ReservedPuts
from mooncake.store.client.validate import key_error
from mooncake.store.common.errors import ErrorCode, code_name
from mooncake.store.common.master_client import MasterClient, segment as make_segment
from mooncake.store.proto import mooncake_master_pb2 as pb

_log = logging.getLogger("mooncake.store.client")

OK = 0
CACHE_MARGIN = 0.25
CACHE_MAX_ENTRIES = 1 << 16
_ALREADY = int(ErrorCode.OBJECT_ALREADY_EXISTS)
_OVERLAPPED = -7  # Transfer Engine: the range overlaps a registration
_NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
_LOCAL_DISK = pb.REPLICA_TYPE_LOCAL_DISK
_SETUP_RELOAD_WAIT = 10.0  # seconds setup waits for the tier's files to be reported again
TRUST_SEC = 2.0  # see the descriptor cache rule; below segments.REMOUNT_HOLD_SEC
_CLOSE_RPC_SEC = 2.0  # close does not wait longer than this per master call
_SHARED_LOCK = threading.Lock()
_SHARED: set[int] = set()  # id() of the engines shared with a store of this process (setup's `engine`)

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


def new_bytes(size: int) -> tuple[bytes, int]:
    """An uninitialised bytes object of `size` bytes and the address of its data (fill it before use)."""
    b = _new_bytes(None, size)
    return b, id(b) + BYTES_DATA


class _Entry:
    """A looked-up object: memory replicas (``replicas``), LOCAL_DISK ones (``disk``), lease deadline, and
    when (``fetched``: before the lookup was sent) under which master view (``view``) it was looked up."""
    __slots__ = ("size", "replicas", "expiry", "disk", "fetched", "view")

    def __init__(self, size: int, replicas, expiry: float, disk=(), fetched: float = 0.0, view: int = 0) -> None:
        self.size = size
        self.replicas = replicas
        self.expiry = expiry
        self.disk = disk
        self.fetched = fetched
        self.view = view


class StoreCore(ReadPathMixin, DiskLinkMixin):
    def __init__(self) -> None:
        self._cfg: SetupConfig | None = None
        self._engine = None
        self._own_engine = True  # False: setup's `engine` is shared (never closed here)
        self._managed: list[tuple[int, int]] = []  # (addr, size) from the engine's allocate_managed_buffer
        self._borrowed: set[int] = set()  # register_buffer ranges a shared engine's owner had registered
        self._mem_pool = StagingPool(0, 0)  # setup_dummy's mem_pool_size (alloc_from_mem_pool)
        self._master: MasterClient | None = None
        self._segment_name = ""
        self._segment_id = ""
        self._global = (0, 0)
        self._local = (0, 0)
        self._staging = StagingPool(0, 0)
        self._reserved = ReservedPuts(self)
        self._ranges = RegisteredRanges()
        self._devices = DeviceBuffers()  # the registered buffers that are device memory
        self._cache: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._cache_lock = threading.Lock()
        self._view = 0
        self._tasks = None
        self._disk = None  # ssd.DiskTier when enable_ssd_offload
        self._disk_server = None  # disk_serve.DiskServer (serves self._disk to other clients)
        self._disk_peers = None  # disk_serve.DiskPeers (reads other clients' disk replicas)
        # What the master knows of the tier: _disk_lost counts the times it may have lost it (remount,
        # CLIENT_NOT_FOUND); _disk_synced is the count the last complete MountLocalDisk + reload matched.
        # While they differ, each ping starts a sync thread (one at a time) that declares and reloads again.
        self._disk_lost = 0
        self._disk_synced = -1
        self._disk_sync_thread: threading.Thread | None = None
        self._disk_sync_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._in_flight: list = []  # one item per data-path call running (_enter / _leave; atomic list ops)
        self._closing = False
        self._http = None  # (ClientMetrics, ClientHttpServer) while set up with enable_client_http_server

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def setup(self, *args, **kwargs) -> int:
        """Positional or dict form (reference §2.2). 0, or a negative code with the reason logged."""
        try:
            cfg = SetupConfig.from_args(args, kwargs)
        except (ValueError, TypeError) as e:
            if self._cfg is None:
                _log.error("setup: %s", e)
                return int(ErrorCode.INVALID_PARAMS)
            cfg = None
        return self._setup_with(cfg)

    def _setup_with(self, cfg: SetupConfig | None, mem_pool_size: int = 0) -> int:
        """setup() with parsed options (None: they were bad; only said when the store is not set up), plus
        `mem_pool_size` bytes of registered memory for alloc_from_mem_pool (setup_dummy)."""
        with self._state_lock:
            if self._cfg is not None:
                _log.error("setup: this store is already set up; call close() first")
                return int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
            if cfg is None:
                return int(ErrorCode.INVALID_PARAMS)
            code = self._setup_locked(cfg, mem_pool_size)
            if code != OK:
                self._teardown_locked(unmount=True)
            return code

    def _setup_locked(self, cfg: SetupConfig, mem_pool_size: int = 0) -> int:
        from mooncake.engine import TransferEngine  # the native module is needed only once a store is set up

        self._closing = False

        self._master = MasterClient(cfg.master_server_addr, timeout=float(os.environ.get("MC_RPC_TIMEOUT_MS",
                                                                                         30000)) / 1000)
        connect_s = float(os.environ.get("MC_RPC_CONNECT_TIMEOUT_MS", 5000)) / 1000
        try:
            self._master.wait_ready(timeout=connect_s)
            info = self._master.call("GetServiceInfo")
            self._view = info.view_version
            if os.environ.get("MC_STORE_FAST_RPC", "1") != "0":
                self._master.use_fast_path()
        except (grpc.FutureTimeoutError, grpc.RpcError) as e:
            _log.error("setup: master %s unreachable within %.1f s (%s)", cfg.master_server_addr, connect_s,
                       type(e).__name__)
            return int(ErrorCode.RPC_FAIL)
        self._master.view_version = self._view
        self._own_engine = cfg.engine is None
        if self._own_engine:
            engine = self._engine = TransferEngine()
            hostname = _hostname_with_port(cfg.local_hostname, cfg.metadata_server)
            if engine.initialize(hostname, cfg.metadata_server, cfg.protocol, cfg.rdma_devices) != 0:
                _log.error("setup: Transfer Engine initialisation failed (hostname %r, metadata %r, protocol %r)",
                           hostname, cfg.metadata_server, cfg.protocol)
                return int(ErrorCode.INTERNAL_ERROR)
        else:  # shared: its owner initialized it (name, metadata, transports) and closes it
            engine = cfg.engine
            with _SHARED_LOCK:  # one store per engine: two would mount segments under one name (identity rule)
                if id(engine) in _SHARED:
                    _log.error("setup: Transfer Engine %s is shared with another store of this process already",
                               engine.get_local_segment_name())
                    return int(ErrorCode.INVALID_PARAMS)
                _SHARED.add(id(engine))
            self._engine = engine
            _log.info("setup: sharing Transfer Engine %s (its name, metadata and transports are used)",
                      engine.get_local_segment_name())
        self._segment_name = engine.get_local_segment_name()
        for attr, size in (("_global", cfg.global_segment_size), ("_local", cfg.local_buffer_size),
                           ("_pool", mem_pool_size)):
            if size:
                addr = engine.allocate_managed_buffer(size)
                if not addr:
                    _log.error("setup: cannot allocate %d bytes of %s memory", size, attr[1:])
                    return int(ErrorCode.INTERNAL_ERROR)
                self._managed.append((addr, size))
                if os.environ.get("MC_STORE_PREFAULT", "1") != "0":
                    ctypes.memset(addr, 0, size)  # commit the pages now, not on the first put (like RDMA pinning)
                if attr == "_pool":
                    self._mem_pool = StagingPool(addr, size)
                else:
                    setattr(self, attr, (addr, size))
                self._ranges.add(addr, size)
        self._staging = StagingPool(*self._local)
        if cfg.enable_ssd_offload:
            from mooncake.store.client.config import parse_size
            from mooncake.store.client.ssd import DiskTier
            try:
                self._disk = DiskTier(cfg.ssd_offload_path, parse_size(os.environ.get("MC_STORE_SSD_CAPACITY", 0)),
                                      DiskReporter(self))
            except (OSError, ValueError) as e:
                _log.error("setup: SSD tier at %r unusable: %s", cfg.ssd_offload_path, e)
                return int(ErrorCode.INVALID_PARAMS)
        from mooncake.store.client.disk_serve import DiskPeers, DiskServer, advertised_host
        self._disk_peers = DiskPeers()
        if self._disk is not None:  # before the segment: what is put there from the start gets persisted
            try:
                self._disk_server = DiskServer(self._disk, engine, self._staging, self._segment_name,
                                               advertised_host(self._segment_name),
                                               int(os.environ.get("MC_STORE_DISK_RPC_PORT", 0)),
                                               evicted=lambda k, seq: self._report_evicted([(k, seq)])).start()
            except OSError as e:
                _log.error("setup: cannot serve the SSD tier: %s", e)
                return int(ErrorCode.INVALID_PARAMS)
            code = self._declare_disk()
            if code != OK:
                _log.error("setup: declaring the SSD tier to the master failed: %s", code_name(code))
                return code
            self._disk_lost, self._disk_synced = 0, -1
            self._master.on_remount = self._disk_lost_now
            self._master.on_ping = self._on_ping
            self._master.on_disk_drops = self._on_disk_drops
            self._master.offload_capacity = self._disk.free_slots
            self._master.on_offload = self._on_offload
        if self._global[1]:
            self._segment_id = uuid.uuid4().hex
            seg = make_segment(self._segment_id, self._segment_name, self._global[0], self._global[1],
                               self._segment_name, cfg.protocol)
            try:
                code = self._master.mount(seg)
            except grpc.RpcError as e:
                code = _rpc_code(e)
            if code != OK:
                _log.error("setup: mounting the global segment failed: %s", code_name(code))
                self._segment_id = ""
                return code
        else:
            self._rpc("ReMountSegment", segments=[])  # register as an alive client without memory
        # Well inside the master's client TTL, else a late ping expires this client (and drops its segment).
        interval = float(os.environ.get("MC_STORE_HEARTBEAT_INTERVAL", 1.0))
        if info.client_ttl_sec > 0:
            interval = min(interval, info.client_ttl_sec / 3)
        self._master.start_heartbeat(interval)
        if self._disk is not None:  # the reload of the files found runs beside the heartbeat (liveness)
            self._disk_tick(declare=False)
            sync = self._disk_sync_thread
            if sync is not None:
                sync.join(_SETUP_RELOAD_WAIT)  # usually done at once; a long one goes on after setup
        if self._global[1]:
            from mooncake.store.client.tasks import TaskRunner
            self._tasks = TaskRunner(self)
        if cfg.enable_client_http_server:
            code = self._start_http(cfg.client_http_port)
            if code != OK:
                return code
        self._cfg = cfg
        return OK

    def _start_http(self, port: int) -> int:
        """Serves /metrics and /health on `port` (http_server.py); INVALID_PARAMS when it cannot be bound."""
        from mooncake.store.client.http_server import ClientHttpServer
        from mooncake.store.client.metrics import ClientMetrics

        metrics = ClientMetrics()
        try:
            server = ClientHttpServer(self, metrics, os.environ.get("MC_STORE_CLIENT_HTTP_HOST", "0.0.0.0"), port)
        except (OSError, OverflowError) as e:
            _log.error("setup: cannot serve client_http_port %d: %s", port, e)
            return int(ErrorCode.INVALID_PARAMS)
        metrics.instrument(self)
        self._http = (metrics, server.start())
        _log.info("setup: client metrics on http://%s:%d/metrics", os.environ.get("MC_STORE_CLIENT_HTTP_HOST",
                                                                              "0.0.0.0"), server.port)
        return OK

    def close(self) -> int:
        """Unmounts this client's segment (objects stored only there disappear), stops everything. Idempotent."""
        with self._state_lock:
            self._teardown_locked(unmount=True)
        return OK

    def _teardown_locked(self, unmount: bool) -> None:
        self._cfg = None
        if self._http is not None:
            metrics, server = self._http
            self._http = None
            server.stop()
            metrics.uninstrument()
        if self._master is not None:
            self._master.limit_timeout(_CLOSE_RPC_SEC)
        if self._tasks is not None:
            self._tasks.close()
            self._tasks = None
        if self._disk_server is not None:
            self._disk_server.close()
            self._disk_server = None
        if self._disk is not None:
            if unmount and self._master is not None:
                try:  # the notices of files of objects removed lately: deleted before the tier stops
                    self._master.ping_for_drops()
                except grpc.RpcError:
                    pass
            with self._disk_sync_lock:
                disk, self._disk = self._disk, None  # no new sync thread from now on
                sync = self._disk_sync_thread
            if sync is not None:
                sync.join()  # it stops after its current RPC: no MountLocalDisk after our UnmountLocalDisk
            disk.close()  # queued writes dropped, done ones reported; then the master forgets the tier
            # (files stay). Only now may the engine unmap the segment the writer read from.
            if unmount and self._master is not None:
                self._rpc("UnmountLocalDisk")
        if self._disk_peers is not None:
            self._disk_peers.close()
            self._disk_peers = None
        if self._master is not None:
            if unmount:
                self._reserved.release_all()
            if unmount and self._segment_id:
                try:
                    self._master.unmount(self._segment_id)
                except grpc.RpcError as e:
                    _log.warning("close: unmount failed (%s); the master expires this client", e.code())
            self._master.close()  # calls in flight fail now: the wait below is short
            self._master = None
        self._closing = True  # no copy or transfer may run while the engine unmaps the memory
        while self._in_flight:
            time.sleep(0.001)
        if self._engine is not None:
            if self._own_engine:
                self._engine.close()
            else:
                self._release_shared_engine()
                with _SHARED_LOCK:
                    _SHARED.discard(id(self._engine))
            self._engine = None
        self._managed = []
        self._borrowed = set()
        self._segment_id = ""
        self._global = self._local = (0, 0)
        self._staging = self._mem_pool = StagingPool(0, 0)
        self._ranges.clear()
        self._devices.clear()
        self.cache_clear()

    def _release_shared_engine(self) -> None:
        """Undoes on a shared engine what this store did to it: the register_buffer registrations, then the
        managed buffers (segment, staging, memory pool). Logged, never raised: close goes on."""
        engine, managed = self._engine, set(self._managed)
        for addr, size in self._ranges.items():
            if (addr, size) not in managed and addr not in self._borrowed and engine.unregister_memory(addr) != 0:
                _log.warning("close: unregistering %#x from the shared Transfer Engine failed", addr)
        for addr, size in self._managed:
            if engine.free_managed_buffer(addr, size) != 0:
                _log.warning("close: freeing %d bytes at %#x of the shared Transfer Engine failed", size, addr)

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable."""
        master = self._master
        if self._cfg is None or master is None:
            return 1
        try:
            master.call("GetServiceInfo", timeout=2.0)  # not Ping: its reply may carry work for the heartbeat
            return 0
        except grpc.RpcError:
            return 2

    def get_hostname(self) -> str:
        return self._segment_name if self._cfg is not None else ""

    def _ready(self, op: str) -> bool:
        if self._cfg is None:
            _log.error("%s: the store is not set up (call setup() first) or was closed", op)
            return False
        return True

    def _enter(self) -> bool:
        """A data-path call begins (see guard.while_open); False once close began. Registering before looking at
        _closing (close sets it before it waits for _in_flight to empty) leaves no gap between the two."""
        self._in_flight.append(None)
        if self._closing:
            self._in_flight.pop()
            return False
        return True

    def _leave(self) -> None:
        self._in_flight.pop()

    def _is_mine(self, rep) -> bool:
        """Whether replica `rep` (anything with segment_name / segment_id) is in this instance's segment."""
        return bool(self._segment_id) and rep.segment_id == self._segment_id

    def _copy(self, remote: int, local: int, n: int, write: bool) -> bool:
        """Copies between `local` and this client's own segment at `remote` (memmove, or the platform's copy for
        a registered device buffer); False (nothing copied) when [remote, remote+n) is not inside it or a device
        copy failed. Only between _enter and _leave."""
        base, size = self._global
        if not size or remote < base or remote + n > base + size:
            _log.error("replica range [%#x, +%d) is outside this client's segment; not copied", remote, n)
            return False
        # `local` may be a registered device buffer: its platform copies it (device_memory.py)
        if write:
            return self._devices.copy(remote, local, n, device_side=local)
        return self._devices.copy(local, remote, n, device_side=local)

    def _usable(self, e: _Entry, now: float) -> bool:
        """Whether entry `e`'s buffers may still be read (descriptor cache rule): its lease lasts and the
        master that granted it answered (the lookup, or a later ping) less than TRUST_SEC ago."""
        if now >= e.expiry:
            return False
        if now < e.fetched + TRUST_SEC:
            return True
        master = self._master
        if master is None:
            return False
        view, sent = master.confirmed
        return view == e.view and now < sent + TRUST_SEC

    # -- master RPCs -------------------------------------------------------------------------------------------
    def _rpc(self, method: str, **fields):
        """The reply, or a negative int (RPC_FAIL / RPC_TIMEOUT) when the RPC itself failed."""
        master = self._master
        if master is None:
            return NOT_READY
        try:
            return master.call(method, **fields)
        except grpc.RpcError as e:
            return self._rpc_error_code(method, e)

    @staticmethod
    def _rpc_error_code(method: str, e: grpc.RpcError) -> int:
        """RPC_FAIL / RPC_TIMEOUT for a failed master RPC, logged."""
        code = _rpc_code(e)
        _log.warning("%s: master RPC failed: %s (%s)", method, code_name(code), e.code())
        return code

    # -- descriptor cache --------------------------------------------------------------------------------------
    def cache_clear(self) -> None:
        with self._cache_lock:
            self._cache.clear()

    def _cache_drop(self, keys) -> None:
        with self._cache_lock:
            for k in keys:
                self._cache.pop(k, None)

    def _lookup(self, keys: list[str]) -> list:
        """Per key an _Entry (readable; lease deadline in .expiry) or a negative code."""
        master = self._master
        if master is not None and master.view_version != self._view:
            self._view = master.view_version
            self.cache_clear()
            _log.info("master restarted (new view): descriptor cache dropped")
        now = time.monotonic()
        out: list = [None] * len(keys)
        missing = []
        with self._cache_lock:
            for i, k in enumerate(keys):
                e = self._cache.get(k)
                if e is not None and self._usable(e, now):
                    out[i] = e
                else:
                    missing.append(i)
        if not missing:
            return out
        t0 = time.monotonic()
        view = master.view_version if master is not None else 0
        reply = self._rpc("BatchGetReplicaList", keys=[keys[i] for i in missing])
        if isinstance(reply, int):
            for i in missing:
                out[i] = reply
            return out
        fresh = []
        for i, r in zip(missing, reply.results):
            if r.code != OK:
                out[i] = r.code
                continue
            ttl = r.lease_ttl_ms / 1000.0
            reps, disk = list(r.replicas), ()
            if reps and reps[-1].type == _LOCAL_DISK:
                disk = [d for d in reps if d.type == _LOCAL_DISK]
                reps = [d for d in reps if d.type != _LOCAL_DISK]
            e = _Entry(r.size, reps, t0 + ttl, disk, t0, view)
            out[i] = e
            fresh.append((keys[i], _Entry(r.size, reps, t0 + ttl * (1 - CACHE_MARGIN), disk, t0, view)))
        with self._cache_lock:
            for k, e in fresh:
                self._cache[k] = e
                self._cache.move_to_end(k)
            while len(self._cache) > CACHE_MAX_ENTRIES:
                self._cache.popitem(last=False)
        return out

    # -- data movement -----------------------------------------------------------------------------------------
    def _transfer(self, ops: list, write: bool) -> set:
        """ops: (replica, local_addr, remote_addr, length, tag), replica: where remote_addr lies (anything with
        segment_name / segment_id, e.g. a ReplicaDescriptor). Runs them (this instance's segment: memcpy;
        others: one Transfer Engine batch per segment name); returns the tags of failed ops (all of them once
        close began). An op on another instance's segment under this client's name fails (replica identity
        rule)."""
        if not self._enter():
            return {op[4] for op in ops}
        try:
            return self._run_ops(ops, write)
        finally:
            self._leave()

    def _run_ops(self, ops: list, write: bool) -> set:
        failed = set()
        by_seg: dict[str, list] = {}
        for op in ops:
            if op[3] == 0:
                continue
            where = op[0]
            if self._is_mine(where):
                if not self._copy(op[2], op[1], op[3], write):
                    failed.add(op[4])
            elif where.segment_name == self._segment_name:
                _log.warning("replica in segment %s under this client's name %s is another instance's: not used",
                             where.segment_id, where.segment_name)
                failed.add(op[4])
            else:
                by_seg.setdefault(where.segment_name, []).append(op)
        engine = self._engine
        for seg, seg_ops in by_seg.items():
            locals_ = [o[1] for o in seg_ops]
            remotes = [o[2] for o in seg_ops]
            lengths = [o[3] for o in seg_ops]
            if engine is None:
                rc = NOT_READY
            elif write:
                rc = engine.batch_transfer_sync_write(seg, locals_, remotes, lengths)
            else:
                rc = engine.batch_transfer_sync_read(seg, locals_, remotes, lengths)
            if rc != 0:
                _log.warning("transfer %s segment %s failed (rc %d, %d op(s))", "to" if write else "from", seg, rc,
                             len(seg_ops))
                failed.update(o[4] for o in seg_ops)
        return failed

    def _move_contiguous(self, where, address: int, regions: list, release, write: bool) -> bool:
        """Writes (or reads) the pinned `regions`, in order, to (from) one range of segment `where` (as in
        _transfer) starting at `address`, then calls release(); True when the transfer worked."""
        ops, off = [], 0
        for a, n in regions:
            ops.append((where, a, address + off, n, 0))
            off += n
        try:
            return not self._transfer(ops, write=write)
        finally:
            release()

    def _pin(self, regions: list, registered: bool, needs_te: bool, write_out: bool):
        """Makes `regions` usable as Transfer Engine local buffers. Returns (regions', release) where release()
        copies staged data back (for reads, write_out=True) and frees the staging / registration; or None."""
        total = sum(n for _, n in regions)
        if registered or not needs_te or total == 0:
            return regions, _noop
        engine = self._engine
        if total < ZERO_COPY_MIN:
            addr = self._staging.alloc(total)
            if addr is not None:
                staging = self._staging
                if not write_out:
                    gather(addr, regions)
                    return [(addr, total)], lambda: staging.free(addr)

                def release() -> None:
                    scatter(addr, regions)
                    staging.free(addr)
                return [(addr, total)], release
        done = []
        for a, n in regions:
            if not n:
                continue
            rc = engine.register_memory(a, n)
            if rc == _OVERLAPPED and not self._own_engine:
                continue  # registered by the shared engine's owner: usable as it is
            if rc != 0:
                for d in done:
                    engine.unregister_memory(d)
                return None
            done.append(a)
        return regions, lambda: [engine.unregister_memory(d) for d in done]

    @while_open(lambda *_, **__: NOT_READY)
    def put_one(self, key: str, source: list, registered: bool, config: ReplicateConfig | None,
                upsert: bool = False) -> int:
        """put_many for one key (0 / negative): the hot path of small puts, without the per-key lists."""
        config = config if config is not None else ReplicateConfig()
        code = config.validate()
        if code != OK:
            _log.error("put: invalid ReplicateConfig %s", config)
            return code
        size = source[0][1] if len(source) == 1 else sum(n for _, n in source)
        why = key_error(key) or (None if size > 0 else "value must not be empty")
        if why:
            _log.error("put: %s", why)
            return int(ErrorCode.INVALID_PARAMS)
        if not upsert:
            code = self._reserved.put(key, size, source, registered, config)
            if code is not None:
                return code
        return self._put_two_calls([key], [size], [source], registered, config, upsert, False, [0], [OK])[0]

    @while_open(all_failed)
    def put_many(self, keys: list[str], sources: list, registered: bool, config: ReplicateConfig | None,
                 upsert: bool = False, promote: bool = False) -> list[int]:
        """Writes object keys[i] = concatenation of sources[i] (list of (addr, len)). Per-key 0 / negative.
        An existing key is left unchanged and reported 0 (put); upsert overwrites. promote: memory replicas
        for objects that only have a disk replica (the master queues no offload for them: they are on disk)."""
        config = config if config is not None else ReplicateConfig()
        code = config.validate()
        if code != OK:
            _log.error("put: invalid ReplicateConfig %s", config)
            return [code] * len(keys)
        sizes = [sum(n for _, n in src) for src in sources]
        results = [OK] * len(keys)
        to_put = []
        for i, (k, size) in enumerate(zip(keys, sizes)):
            why = key_error(k) or (None if size > 0 else "value must not be empty")
            if why:
                _log.error("put: %s", why)
                results[i] = int(ErrorCode.INVALID_PARAMS)
            else:
                to_put.append(i)
        if not to_put:
            return results
        if len(to_put) == 1 and not upsert and not promote:
            i = to_put[0]
            code = self._reserved.put(keys[i], sizes[i], sources[i], registered, config)
            if code is not None:
                results[i] = code
                return results
        elif to_put and not upsert and not promote:
            codes = self._reserved.put_batch([keys[i] for i in to_put], [sizes[i] for i in to_put],
                                             [sources[i] for i in to_put], registered, config)
            if codes is not None:
                for i, c in zip(to_put, codes):
                    results[i] = c
                return results
        return self._put_two_calls(keys, sizes, sources, registered, config, upsert, promote, to_put, results)

    def _put_two_calls(self, keys: list[str], sizes: list[int], sources: list, registered: bool,
                       config: ReplicateConfig, upsert: bool, promote: bool, to_put: list[int],
                       results: list[int]) -> list[int]:
        """put_many's general way for keys[i], i in to_put (validated): Put/UpsertStart, the writes, End (or
        Revoke); fills `results` and returns it. Called between _enter and _leave."""
        if upsert:
            self._cache_drop(keys[i] for i in to_put)
        prefix = "BatchUpsert" if upsert else "BatchPut"
        reply = self._rpc(prefix + "Start", keys=[keys[i] for i in to_put], sizes=[sizes[i] for i in to_put],
                          config=config.to_proto(self._segment_name), **({"promote": True} if promote else {}))
        if isinstance(reply, int):
            for i in to_put:
                results[i] = reply
            return results
        ops, releases, started = [], [], []
        for i, r in zip(to_put, reply.results):
            if r.code == _ALREADY:
                continue
            if r.code != OK or not r.replicas:
                results[i] = r.code if r.code != OK else int(ErrorCode.NO_AVAILABLE_HANDLE)
                if r.code == ErrorCode.NO_AVAILABLE_HANDLE:
                    _log.warning("put %r: no space for %d bytes", keys[i], sizes[i])
                continue
            started.append(i)
            needs_te = not all(self._is_mine(rep) for rep in r.replicas)
            pinned = self._pin(sources[i], registered, needs_te, write_out=False)
            if pinned is None:
                results[i] = int(ErrorCode.TRANSFER_FAIL)
                continue
            regions, release = pinned
            releases.append(release)
            for rep in r.replicas:
                off = 0
                for a, n in regions:
                    ops.append((rep, a, rep.address + off, n, i))
                    off += n
        try:
            failed = self._transfer(ops, write=True)
        finally:
            for release in releases:
                release()
        for i in failed:
            results[i] = int(ErrorCode.TRANSFER_FAIL)
        good = [keys[i] for i in started if results[i] == OK]
        bad = [keys[i] for i in started if results[i] != OK and i not in failed]
        if good:
            end = self._rpc(prefix + "End", keys=good)
            codes = [end] * len(good) if isinstance(end, int) else list(end.codes)
            for i, c in zip([i for i in started if results[i] == OK], codes):
                results[i] = c
        if bad:  # nothing was sent for these (pinning failed): their buffers can be reused at once
            self._rpc(prefix + "Revoke", keys=bad)
        if failed:  # a failed write may still land (a timeout): the master holds their buffers, not frees them
            self._rpc(prefix + "Revoke", keys=[keys[i] for i in started if i in failed], unsettled=True)
        return results


def _noop() -> None:
    pass


def _rpc_code(e: grpc.RpcError) -> int:
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return int(ErrorCode.RPC_TIMEOUT)
    return int(ErrorCode.RPC_FAIL)


def _hostname_with_port(hostname: str, metadata_server: str) -> str:
    """P2P mode: the engine picks its RPC port. Otherwise a hostname without a port gets a free one in
    [MC_STORE_CLIENT_MIN_PORT, MC_STORE_CLIENT_MAX_PORT] so that clients on one host get distinct names."""
    if metadata_server.upper() == "P2PHANDSHAKE" or hostname.rsplit(":", 1)[-1].isdigit():
        return hostname
    lo = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", 12300))
    hi = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", 14300))
    start = int.from_bytes(os.urandom(2), "little") % max(1, hi - lo)
    for k in range(hi - lo):
        port = lo + (start + k) % (hi - lo)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return f"{hostname}:{port}"
    raise ValueError(f"no free port in [{lo}, {hi})")
