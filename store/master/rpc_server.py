"""gRPC front end of the master (store/proto/mooncake_master.proto) and the server process object.

``MasterServicer`` only translates messages: every handler calls one MasterService method (which does all
the locking) and builds the reply; per-item errors travel in reply ``code`` fields. An unexpected exception
is logged and answered with gRPC status INTERNAL (the client sees RPC_FAIL); it never kills the server.

``MasterServer`` owns the process-level pieces: the gRPC server (``_GrpcDoor``: requests are received on an
asyncio event loop, handlers run on a pool of --max_threads, so calls whose request never completes hold no
worker), the fast RPC door, the service's monitor thread, the admin/metrics HTTP server and, if enabled, the
embedded HTTP metadata server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent import futures

import grpc

import mooncake
from mooncake.store.master.admin_http import AdminHttpServer
from mooncake.store.master.config import GRPC_SERVER_OPTIONS, MAX_KEY_BYTES, MAX_REQUEST_BYTES, MasterConfig
from mooncake.store.common.errors import ErrorCode
from mooncake.store.common.fast_rpc import VIEW_METADATA_KEY, FastRpcServer
from mooncake.store.master.objects import DiskReplica, PutConfig, ReplicaStatus
from mooncake.store.master.segments import Replica
from mooncake.store.master.service import MasterService, SegmentSpec
from mooncake.store.master.tasks import Task
from mooncake.store.proto import mooncake_master_pb2 as pb
from mooncake.store.proto import mooncake_master_pb2_grpc as pb_grpc

_log = logging.getLogger("mooncake.store.master.rpc")

_COMPLETE = ReplicaStatus.COMPLETE
_PROCESSING = ReplicaStatus.PROCESSING


def _descriptor(r: Replica | DiskReplica, status: int) -> pb.ReplicaDescriptor:
    if type(r) is DiskReplica:
        return pb.ReplicaDescriptor(type=pb.REPLICA_TYPE_LOCAL_DISK, client_id=r.owner.client_id,
                                    transport_endpoint=r.owner.endpoint, size=r.size, disk_seq=r.seq,
                                    status=status)
    seg = r.segment
    return pb.ReplicaDescriptor(segment_name=seg.name, segment_id=seg.id, transport_endpoint=seg.te_endpoint,
                                address=seg.base + r.offset, size=r.size, status=status, protocol=seg.protocol)


def _put_config(request) -> PutConfig:
    if not request.HasField("config"):
        return PutConfig()
    c = request.config
    return PutConfig(replica_num=c.replica_num, preferred_segments=tuple(c.preferred_segments),
                     with_soft_pin=c.with_soft_pin, with_hard_pin=c.with_hard_pin, soft_pin_ttl_ms=c.soft_pin_ttl_ms)


def _spec(s: pb.Segment) -> SegmentSpec:
    return SegmentSpec(s.id, s.name, s.base, s.size, s.te_endpoint, s.protocol or "tcp")


def _start_reply(result) -> pb.PutStartReply:
    code, replicas = result
    return pb.PutStartReply(code=code, replicas=[_descriptor(r, _PROCESSING) for r in replicas])


def _get_reply(result) -> pb.GetReplicaListReply:
    code, replicas, lease_ms = result
    return pb.GetReplicaListReply(code=code, size=replicas[0].size if replicas else 0, lease_ttl_ms=lease_ms,
                                  replicas=[_descriptor(r, _COMPLETE) for r in replicas])


def _task_info(t: Task, now: float) -> pb.TaskInfo:
    return pb.TaskInfo(task_id=t.id, type=int(t.type), status=int(t.status), key=t.key, source=t.source,
                       targets=list(t.targets), assigned_client=t.client_id, message=t.message,
                       age_sec=max(0.0, now - t.created))


def _copy_reply(result) -> pb.CopyStartReply:
    code, src, new = result
    reply = pb.CopyStartReply(code=code, targets=[_descriptor(r, _PROCESSING) for r in new])
    if src is not None:
        reply.source.CopyFrom(_descriptor(src, _COMPLETE))
    return reply


def _rpc(method):
    """Times the handler into master_rpc_latency_seconds{method} and turns exceptions into INTERNAL. With HA
    (``svc.gate``, ha.py): a master that is not the leader answers UNAVAILABLE, and a reply waits until the
    ops applied up to its end are in the op log (UNAVAILABLE when they cannot be written); the reply carries the leader's view number (trailing metadata
    VIEW_METADATA_KEY, or the fast path's view frame)."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, request, context):
        gate = self.svc.gate
        if gate is not None and not gate.serving():
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{name}: this master is not the leader")
        if gate is not None:
            self.svc.begin_call()
        t0 = time.perf_counter()
        try:
            reply = method(self, request, context)
        except Exception as e:  # a bug: log it, answer INTERNAL, keep serving
            _log.exception("%s failed", name)
            context.abort(grpc.StatusCode.INTERNAL, f"{name}: {type(e).__name__}: {e}")
        finally:
            self._latency(name).observe(time.perf_counter() - t0)
        if gate is not None:
            if not gate.durable(self.svc.call_lsn()):
                context.abort(grpc.StatusCode.UNAVAILABLE, f"{name}: the op log could not be written")
            context.set_trailing_metadata(((VIEW_METADATA_KEY, str(self.svc.view_version)),))
        return reply
    return wrapper


class MasterServicer(pb_grpc.MasterServiceServicer):
    def __init__(self, service: MasterService) -> None:
        self.svc = service
        self.fast_rpc_port = 0  # set by MasterServer once the fast door is open
        self._children: dict[str, object] = {}

    def _latency(self, name: str):
        child = self._children.get(name)
        if child is None:
            child = self._children[name] = self.svc.metrics.rpc_latency.labels(method=name)
        return child

    # -- segments / liveness ---------------------------------------------------------------------------------
    @_rpc
    def MountSegment(self, request, context):
        return pb.StatusReply(code=self.svc.mount_segment(request.client_id, _spec(request.segment)))

    @_rpc
    def ReMountSegment(self, request, context):
        specs = [_spec(s) for s in request.segments]
        return pb.StatusReply(code=self.svc.remount_segments(request.client_id, specs))

    @_rpc
    def UnmountSegment(self, request, context):
        return pb.StatusReply(code=self.svc.unmount_segment(request.client_id, request.segment_id))

    @_rpc
    def Ping(self, request, context):
        code, alive = self.svc.ping(request.client_id)
        status = pb.CLIENT_STATUS_OK if alive else pb.CLIENT_STATUS_NEED_REMOUNT
        reply = pb.PingReply(code=code, view_version=self.svc.view_version, client_status=status)
        if alive:
            reply.disk_mounted = request.client_id in self.svc.disk_clients
            drops, reply.drop_seq = self.svc.take_disk_drops(request.client_id, request.drop_ack)
            if drops:
                reply.drop_disk.extend(pb.DiskObject(key=k, seq=seq) for k, seq in drops)
            if request.offload_capacity:
                tasks, reply.offload_backlog = self.svc.take_offload_tasks(request.client_id,
                                                                           request.offload_capacity)
                reply.offload.extend(pb.OffloadTask(key=k, size=n, address=a, version=v) for k, n, a, v in tasks)
        return reply

    @_rpc
    def GetServiceInfo(self, request, context):
        c = self.svc.config
        return pb.ServiceInfoReply(code=0, version=mooncake.__version__, view_version=self.svc.view_version,
                                   default_kv_lease_ttl_ms=c.default_kv_lease_ttl_ms,
                                   client_ttl_sec=c.client_ttl_sec, cluster_id=c.cluster_id,
                                   max_key_bytes=MAX_KEY_BYTES, fast_rpc_port=self.fast_rpc_port)

    # -- writes ----------------------------------------------------------------------------------------------
    @_rpc
    def PutStart(self, request, context):
        return _start_reply(self.svc.put_start(request.client_id, request.key, request.size, _put_config(request),
                                               request.promote))

    @_rpc
    def UpsertStart(self, request, context):
        return _start_reply(self.svc.upsert_start(request.client_id, request.key, request.size,
                                                  _put_config(request)))

    @_rpc
    def BatchPutStart(self, request, context):
        results = self.svc.batch_put_start(request.client_id, list(request.keys), list(request.sizes),
                                           _put_config(request), request.promote)
        return pb.BatchPutStartReply(results=[_start_reply(r) for r in results])

    @_rpc
    def BatchUpsertStart(self, request, context):
        results = self.svc.batch_upsert_start(request.client_id, list(request.keys), list(request.sizes),
                                              _put_config(request))
        return pb.BatchPutStartReply(results=[_start_reply(r) for r in results])

    @_rpc
    def PutEnd(self, request, context):
        return pb.StatusReply(code=self.svc.put_end(request.client_id, request.key))

    UpsertEnd = PutEnd  # the same commit; shares PutEnd's latency series

    @_rpc
    def PutRevoke(self, request, context):
        return pb.StatusReply(code=self.svc.put_revoke(request.client_id, request.key))

    UpsertRevoke = PutRevoke

    @_rpc
    def BatchPutEnd(self, request, context):
        return pb.BatchStatusReply(codes=self.svc.batch_put_end(request.client_id, list(request.keys)))

    BatchUpsertEnd = BatchPutEnd

    @_rpc
    def BatchPutRevoke(self, request, context):
        return pb.BatchStatusReply(codes=self.svc.batch_put_revoke(request.client_id, list(request.keys),
                                                                   request.unsettled))

    BatchUpsertRevoke = BatchPutRevoke

    # -- reads -----------------------------------------------------------------------------------------------
    @_rpc
    def ExistKey(self, request, context):
        code, found = self.svc.exist(request.key)
        return pb.ExistReply(code=code, exists=found)

    @_rpc
    def BatchExistKey(self, request, context):
        return pb.BatchExistReply(results=[pb.ExistReply(code=c, exists=f)
                                           for c, f in self.svc.batch_exist(list(request.keys))])

    @_rpc
    def GetReplicaList(self, request, context):
        return _get_reply(self.svc.get_replica_list(request.key))

    @_rpc
    def BatchGetReplicaList(self, request, context):
        return pb.BatchGetReplicaListReply(results=[_get_reply(r)
                                                    for r in self.svc.batch_get_replica_list(list(request.keys))])

    @_rpc
    def GetReplicaListByRegex(self, request, context):
        code, found = self.svc.get_replica_list_by_regex(request.pattern)
        keys = list(found)
        return pb.GetReplicaListByRegexReply(code=code, keys=keys,
                                             results=[_get_reply((0, *found[k])) for k in keys])

    # -- removal ---------------------------------------------------------------------------------------------
    @_rpc
    def Remove(self, request, context):
        return pb.StatusReply(code=self.svc.remove(request.key, request.force))

    @_rpc
    def BatchRemove(self, request, context):
        return pb.BatchStatusReply(codes=self.svc.batch_remove(list(request.keys), request.force))

    @_rpc
    def RemoveByRegex(self, request, context):
        code, n = self.svc.remove_by_regex(request.pattern, request.force)
        return pb.CountReply(code=code, count=n)

    @_rpc
    def RemoveAll(self, request, context):
        code, n = self.svc.remove_all(request.force)
        return pb.CountReply(code=code, count=n)

    @_rpc
    def BatchReplicaClear(self, request, context):
        code, cleared = self.svc.batch_replica_clear(request.client_id, list(request.keys), request.segment_name)
        return pb.BatchReplicaClearReply(code=code, cleared_keys=cleared)

    # -- copy / move / tasks -----------------------------------------------------------------------------------
    @_rpc
    def CopyStart(self, request, context):
        return _copy_reply(self.svc.copy_start(request.client_id, request.key, request.source, request.targets))

    @_rpc
    def MoveStart(self, request, context):
        return _copy_reply(self.svc.move_start(request.client_id, request.key, request.source, request.target))

    @_rpc
    def CopyEnd(self, request, context):
        return pb.StatusReply(code=self.svc.copy_end(request.client_id, request.key))

    @_rpc
    def CopyRevoke(self, request, context):
        return pb.StatusReply(code=self.svc.copy_revoke(request.client_id, request.key))

    @_rpc
    def MoveEnd(self, request, context):
        return pb.StatusReply(code=self.svc.move_end(request.client_id, request.key))

    @_rpc
    def MoveRevoke(self, request, context):
        return pb.StatusReply(code=self.svc.move_revoke(request.client_id, request.key))

    @_rpc
    def CreateCopyTask(self, request, context):
        code, task_id = self.svc.create_copy_task(request.key, request.targets)
        return pb.TaskIdReply(code=code, task_id=task_id)

    @_rpc
    def CreateMoveTask(self, request, context):
        code, task_id = self.svc.create_move_task(request.key, request.source, request.target)
        return pb.TaskIdReply(code=code, task_id=task_id)

    @_rpc
    def QueryTask(self, request, context):
        task = self.svc.query_task(request.task_id)
        if task is None:
            return pb.QueryTaskReply(code=ErrorCode.TASK_NOT_FOUND)
        return pb.QueryTaskReply(code=0, task=_task_info(task, self.svc.now()))

    @_rpc
    def FetchTasks(self, request, context):
        if not request.client_id:
            return pb.FetchTasksReply(code=ErrorCode.INVALID_PARAMS)
        tasks = self.svc.fetch_tasks(request.client_id, request.batch_size or 1)
        now = self.svc.now()
        return pb.FetchTasksReply(code=0, tasks=[_task_info(t, now) for t in tasks])

    @_rpc
    def MarkTaskToComplete(self, request, context):
        return pb.StatusReply(code=self.svc.mark_task_complete(request.client_id, request.task_id, request.success,
                                                               request.message))

    # -- SSD tier ------------------------------------------------------------------------------------------------
    @_rpc
    def MountLocalDisk(self, request, context):
        return pb.StatusReply(code=self.svc.mount_local_disk(request.client_id, request.endpoint))

    @_rpc
    def UnmountLocalDisk(self, request, context):
        code, n = self.svc.unmount_local_disk(request.client_id)
        return pb.CountReply(code=code, count=n)

    @_rpc
    def NotifyOffloadSuccess(self, request, context):
        objects = [(o.key, o.size, o.seq, o.version) for o in request.objects]
        return pb.BatchStatusReply(codes=self.svc.notify_offload(request.client_id, objects, request.reload))

    @_rpc
    def EvictDiskReplica(self, request, context):
        objects = [(o.key, o.seq) for o in request.objects]
        return pb.BatchStatusReply(codes=self.svc.evict_disk_replicas(request.client_id, objects))

    # -- reserved space (one-round-trip puts, reservations.py) ---------------------------------------------
    @_rpc
    def ReserveSpace(self, request, context):
        code, r = self.svc.reserve_space(request.client_id, request.size, request.min_size, _put_config(request),
                                         request.renew)
        if r is None:
            return pb.ReserveSpaceReply(code=code)
        block = Replica(r.segment, r.cursor, r.end - r.cursor)
        return pb.ReserveSpaceReply(code=code, reservation_id=r.id, block=_descriptor(block, _PROCESSING),
                                    granule=r.segment.allocator.granule,
                                    idle_ms=int(self.svc.config.reservation_idle_sec * 1000))

    @_rpc
    def PutReserved(self, request, context):
        code, cursor = self.svc.put_reserved(request.client_id, request.reservation_id, request.key, request.size,
                                             request.address, _put_config(request))
        return pb.PutReservedReply(code=code, cursor=cursor)

    @_rpc
    def BatchPutReserved(self, request, context):
        code, codes, cursor = self.svc.put_reserved_batch(request.client_id, request.reservation_id,
                                                          list(request.keys), list(request.sizes), request.address,
                                                          _put_config(request))
        return pb.BatchPutReservedReply(code=code, codes=codes, cursor=cursor)

    @_rpc
    def ReleaseSpace(self, request, context):
        return pb.StatusReply(code=self.svc.release_space(request.client_id, request.reservation_id,
                                                          request.unsettled))


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


PROBE_SEC = 1.0  # how often the gRPC door checks that its port still accepts (_GrpcDoor)


async def _accepts(host: str, port: int) -> bool:
    """False only when a connection to host:port is refused (nothing listens); a timeout or another error
    proves nothing (e.g. a full accept queue)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
    except ConnectionRefusedError:
        return False
    except (OSError, asyncio.TimeoutError):
        return True
    writer.close()
    return True


class _GrpcDoor:
    """The gRPC server: grpc.aio on an event loop thread of its own, the servicer's (synchronous) handlers on
    a pool of `max_threads`. A request is handed to a worker only once it has arrived completely, so clients
    that announce requests and never finish them (or trickle them) tie up no worker: the other clients keep
    being served. Limits: config.GRPC_SERVER_OPTIONS.

    The constructor binds `address` (OSError when it cannot); start/stop/wait are called from one control
    thread; stop is idempotent.

    Self-repair: grpcio's aio server ends its accept loop, and closes the port, when a request's :path is not
    UTF-8 (grpcio 1.85: UnicodeDecodeError in _server_main_loop; its shutdown then waits for the calls in
    flight, so it may never finish). One hostile frame would leave the master up with its gRPC port closed. A
    supervisor on the loop checks that the port still accepts (every PROBE_SEC, and at once when the loop
    reports a task exception); when it refuses and stop() did not ask for it, the old server is stopped (its
    calls in flight fail; clients retry them) and a new one serves on the same port. The fast RPC door is not
    affected. ``restarts`` counts these."""

    def __init__(self, servicer: MasterServicer, address: str, max_threads: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._pool = futures.ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="master-rpc")
        self._thread = threading.Thread(target=self._loop.run_forever, name="master-grpc-loop", daemon=True)
        self._thread.start()
        self._stopped = threading.Event()
        self._stopping = False
        self._servicer = servicer
        self._server = None
        self._supervisor: asyncio.Task | None = None
        self.restarts = 0
        try:
            self._server, self.port = self._run(self._create(servicer, address))
        except BaseException:
            self._shutdown_loop()
            raise
        self._address = address.rsplit(":", 1)[0] + f":{self.port}"  # the bound port, for a restart

    async def _create(self, servicer: MasterServicer, address: str):
        # so_reuseport off: a second master on the same port must fail, not silently share it.
        server = grpc.aio.server(migration_thread_pool=self._pool,
                                 options=GRPC_SERVER_OPTIONS + [("grpc.so_reuseport", 0)])
        pb_grpc.add_MasterServiceServicer_to_server(servicer, server)
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as e:
            raise OSError(f"cannot bind the RPC port {address}: {e}") from None
        if port == 0:
            raise OSError(f"cannot bind the RPC port {address}")
        return server, port

    def _run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> None:
        self._run(self._server.start())
        self._supervisor = self._run(self._spawn_supervisor())

    async def _spawn_supervisor(self) -> asyncio.Task:
        return asyncio.ensure_future(self._supervise())

    async def _supervise(self) -> None:
        wake = asyncio.Event()
        default = self._loop.get_exception_handler()

        def on_exception(loop, context) -> None:  # e.g. grpcio's main loop task failing: check the port now
            wake.set()
            if default is not None:
                default(loop, context)
            else:
                loop.default_exception_handler(context)
        self._loop.set_exception_handler(on_exception)
        host = self._address.rsplit(":", 1)[0].strip("[]")
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1", "localhost": "127.0.0.1"}.get(host, host)
        while not self._stopping:
            try:
                await asyncio.wait_for(wake.wait(), PROBE_SEC)
            except asyncio.TimeoutError:
                pass
            wake.clear()
            if self._stopping or await _accepts(host, self.port):
                continue
            await self._restart()

    async def _restart(self) -> None:
        self.restarts += 1
        _log.error("the gRPC port %s stopped accepting connections (the gRPC library ended its server, e.g. on "
                   "a request path that is not UTF-8); serving again on it (restart %d)", self._address,
                   self.restarts)
        try:
            await asyncio.wait_for(self._server.stop(0), 5.0)
        except Exception:  # noqa: BLE001  (a server that failed may not stop cleanly: it is dropped anyway)
            pass
        while not self._stopping:
            try:
                server, _ = await self._create(self._servicer, self._address)
                self._server = server  # before start: a stop() cancelling us meanwhile stops this one
                await server.start()
            except Exception as e:  # noqa: BLE001  (e.g. the port is taken meanwhile): retried, logged
                _log.error("gRPC server restart on %s failed: %s; retrying in 1 s", self._address, e)
                await asyncio.sleep(1.0)
                continue
            return

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def stop(self, grace: float) -> None:
        if self._stopped.is_set():
            return
        try:
            self._run(self._stop_on_loop(grace), timeout=grace + 30.0)
        finally:
            self._shutdown_loop()

    async def _stop_on_loop(self, grace: float) -> None:
        """On the loop, so no restart can start a server after it: the supervisor is cancelled and awaited
        first, then whichever server is current is stopped."""
        self._stopping = True
        task, self._supervisor = self._supervisor, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._server.stop(grace)

    def _shutdown_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._stopped.set()


class MasterServer:
    """The master process: gRPC + monitor + admin HTTP (+ embedded metadata server). ``start`` returns self.

    Errors: ``start`` raises OSError when a port cannot be bound (nothing is left running)."""

    def __init__(self, config: MasterConfig | None = None, service: MasterService | None = None) -> None:
        self.config = config or MasterConfig()
        self.service = service or MasterService(self.config)
        self._grpc: _GrpcDoor | None = None
        self._fast: FastRpcServer | None = None
        self._admin: AdminHttpServer | None = None
        self._metadata = None
        self.durability = None  # durable.LocalDurability with --enable_snapshot (no HA)
        self.ha = None  # ha.HaController with --enable_ha
        self.port = 0

    @property
    def address(self) -> str:
        host = "127.0.0.1" if self.config.rpc_address in ("0.0.0.0", "::", "") else self.config.rpc_address
        return _host_port(host, self.port)

    @property
    def admin_port(self) -> int:
        return self._admin.port if self._admin else 0

    @property
    def metadata_port(self) -> int:
        return self._metadata.port if self._metadata else 0

    def start(self) -> "MasterServer":
        c = self.config
        try:
            if c.enable_snapshot and not c.enable_ha:
                from mooncake.store.master.durable import LocalDurability
                self.durability = LocalDurability(self.service, c).start()
                self.service.status_sources["durability"] = self.durability.info
            servicer = MasterServicer(self.service)
            self._grpc = _GrpcDoor(servicer, _host_port(c.rpc_address, c.port), c.max_threads)
            self.port = self._grpc.port
            if c.fast_rpc_port >= 0:
                self._fast = FastRpcServer(servicer, c.rpc_address, c.fast_rpc_port,
                                           max_frame=MAX_REQUEST_BYTES).start()
                servicer.fast_rpc_port = self._fast.port
            if c.enable_metric_reporting:
                self._admin = AdminHttpServer(self.service, c.metrics_host, c.metrics_port).start()
            if c.enable_http_metadata_server:
                from mooncake.http_metadata_server import HttpMetadataServer
                self._metadata = HttpMetadataServer(c.http_metadata_server_host, c.http_metadata_server_port).start()
            self._grpc.start()
            if c.enable_ha:
                from mooncake.store.master.ha import HaController
                self.ha = HaController(self, c, self.address).start()
                self.service.status_sources["ha"] = self.ha.info
            else:
                self.service.start_monitor()
        except BaseException:
            self.stop()
            raise
        return self

    def wait(self, timeout: float | None = None) -> bool:
        return self._grpc.wait(timeout) if self._grpc else True

    def stop(self, grace: float = 1.0) -> None:
        """Idempotent; stops accepting RPCs, lets running ones finish for `grace` s, stops the helpers."""
        if self._fast is not None:
            self._fast.stop()
            self._fast = None
        if self._grpc is not None:
            self._grpc.stop(grace)
            self._grpc = None
        if self.ha is not None:
            self.ha.stop()
        self.service.stop_monitor()
        if self.durability is not None:
            self.durability.stop()
            self.durability = None
        if self._admin is not None:
            self._admin.stop()
            self._admin = None
        if self._metadata is not None:
            self._metadata.stop()
            self._metadata = None

    def __enter__(self) -> "MasterServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
