"""Thin synchronous client of the master's gRPC API, plus the liveness heartbeat a store client needs.

``MasterClient.call("PutStart", key="k", size=4096, config=replicate_config(replica_num=2))`` builds the
request message of that RPC (``client_id`` is filled in), sends it and returns the reply message; see
store/proto/mooncake_master.proto for every RPC and field. Reply ``code`` fields carry store error codes;
transport failures raise ``grpc.RpcError`` (the store client maps them to RPC_FAIL / RPC_TIMEOUT).

Segments mounted through ``mount`` are remembered, so the heartbeat (``start_heartbeat``) can re-mount them
when the master answers NEED_REMOUNT (it expired this client, or it restarted). Hooks for the SSD tier:
``on_remount()`` runs after such a re-mount attempt, whatever its outcome (the master lost the client's
state), ``on_disk_drops(objects)`` receives the obsolete-file notices of a ping reply (``PingReply.drop_disk``;
they are acknowledged in the next ping unless it returns False, and come again until then),
``offload_capacity()`` says how many offload tasks the ping asks for and ``on_offload(tasks)`` receives them
(``PingReply.offload``), ``on_ping(reply)`` runs after every answered ping; all on the thread that pings (the
heartbeat's, or a caller of ``ping_once``: pings are serialised). Hooks must not block. ``ping_soon()`` makes
the heartbeat ping now rather than at its next period.

Fast path: ``use_fast_path()`` asks the master (GetServiceInfo) for its framed-protobuf port
(fast_rpc.py) and then sends every call there (~3x lower latency than Python gRPC). A call whose connection
cannot be opened goes over gRPC instead (nothing was sent); a call that failed after sending raises (it may
have run) and the fast path is dropped until the heartbeat rediscovers it (e.g. after a master restart).

Threading: a MasterClient may be shared by threads (gRPC channels are thread-safe); the heartbeat runs in
its own daemon thread and stops with ``close``.
"""

from __future__ import annotations

import logging
import threading
import uuid

import grpc

from mooncake.store.master.config import GRPC_OPTIONS
from mooncake.store.master.fast_rpc import FastRpcClient, FastRpcError
from mooncake.store.proto import mooncake_master_pb2 as pb
from mooncake.store.proto import mooncake_master_pb2_grpc as pb_grpc

_log = logging.getLogger("mooncake.store.master.client")
_SERVICE = pb.DESCRIPTOR.services_by_name["MasterService"]
_REQUEST_TYPES = {m.name: getattr(pb, m.input_type.name) for m in _SERVICE.methods}


def replicate_config(replica_num: int = 1, preferred_segments=(), with_soft_pin: bool = False,
                     with_hard_pin: bool = False, soft_pin_ttl_ms: int = 0) -> pb.ReplicateConfig:
    return pb.ReplicateConfig(replica_num=replica_num, preferred_segments=list(preferred_segments),
                              with_soft_pin=with_soft_pin, with_hard_pin=with_hard_pin,
                              soft_pin_ttl_ms=soft_pin_ttl_ms)


def segment(seg_id: str, name: str, base: int, size: int, te_endpoint: str = "", protocol: str = "tcp"
            ) -> pb.Segment:
    return pb.Segment(id=seg_id, name=name, base=base, size=size, te_endpoint=te_endpoint or name,
                      protocol=protocol)


class MasterClient:
    def __init__(self, address: str, client_id: str | None = None, timeout: float = 30.0) -> None:
        self.address = address
        self.client_id = client_id or uuid.uuid4().hex
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self.stub = pb_grpc.MasterServiceStub(self._channel)
        self._segments: dict[str, pb.Segment] = {}
        self._seg_lock = threading.Lock()
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self.view_version = 0
        self.remounts = 0
        self._fast: FastRpcClient | None = None
        self._fast_wanted = False
        self.on_remount = None
        self.on_disk_drops = None
        self.offload_capacity = None
        self.on_offload = None
        self.on_ping = None
        self._drop_ack = 0  # PingReply.drop_seq of the last drop notices handled
        self._hb_wake = threading.Event()
        self._ping_lock = threading.Lock()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel connects; raises grpc.FutureTimeoutError otherwise."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def call(self, method: str, timeout: float | None = None, **fields):
        """Sends RPC `method` with a request built from `fields` (client_id added when the request has one)."""
        try:
            req_type = _REQUEST_TYPES[method]
        except KeyError:
            raise ValueError(f"unknown master RPC {method!r}") from None
        if "client_id" in req_type.DESCRIPTOR.fields_by_name and "client_id" not in fields:
            fields["client_id"] = self.client_id
        request = req_type(**fields)
        fast = self._fast
        if fast is not None:
            try:
                return fast.call(method, request, timeout or self.timeout)
            except FastRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                self._drop_fast(fast, e)
                if e.sent:
                    raise
        return getattr(self.stub, method)(request, timeout=timeout or self.timeout)

    def use_fast_path(self) -> bool:
        """Switches to the master's framed-protobuf door if it has one; True when in use."""
        self._fast_wanted = True
        info = getattr(self.stub, "GetServiceInfo")(pb.ServiceInfoRequest(), timeout=min(self.timeout, 5.0))
        if not info.fast_rpc_port:
            return False
        host = self.address.rsplit(":", 1)[0].strip("[]")
        old, self._fast = self._fast, FastRpcClient(host, info.fast_rpc_port, self.timeout)
        if old is not None:
            old.close()
        return True

    def _drop_fast(self, fast: FastRpcClient, e: FastRpcError) -> None:
        if self._fast is fast:
            self._fast = None
            fast.close()
            _log.info("master fast RPC path unavailable (%s); using gRPC until it is rediscovered", e.details())

    # -- segments with remount memory -------------------------------------------------------------------------
    def mount(self, seg: pb.Segment) -> int:
        code = self.call("MountSegment", segment=seg).code
        if code == 0:
            with self._seg_lock:
                self._segments[seg.id] = seg
        return code

    def unmount(self, seg_id: str) -> int:
        with self._seg_lock:
            self._segments.pop(seg_id, None)
        return self.call("UnmountSegment", segment_id=seg_id).code

    def ping_once(self) -> pb.PingReply:
        """One ping (its hooks run before it returns); on NEED_REMOUNT re-mounts the remembered segments
        (ReMountSegment)."""
        with self._ping_lock:
            return self._ping_locked()

    def _ping_locked(self) -> pb.PingReply:
        capacity = self.offload_capacity() if self.offload_capacity is not None else 0
        reply = self.call("Ping", timeout=min(self.timeout, 5.0), offload_capacity=max(0, capacity),
                          drop_ack=self._drop_ack)
        if self._fast_wanted and (self._fast is None or reply.view_version != self.view_version):
            self.use_fast_path()  # first ping after a master restart, or after the fast door failed
        self.view_version = reply.view_version
        if reply.drop_disk and self.on_disk_drops is not None:
            if self.on_disk_drops(list(reply.drop_disk)) is not False:
                self._drop_ack = reply.drop_seq
        elif not reply.drop_disk:
            self._drop_ack = 0
        if reply.offload and self.on_offload is not None:
            self.on_offload(list(reply.offload))
        if reply.client_status == pb.CLIENT_STATUS_NEED_REMOUNT:
            with self._seg_lock:
                segs = list(self._segments.values())
            code = self.call("ReMountSegment", segments=segs).code
            self.remounts += 1
            _log.info("master asked client %s to remount: %d segment(s), code %d", self.client_id, len(segs), code)
            if self.on_remount is not None:
                self.on_remount()
        if self.on_ping is not None:
            self.on_ping(reply)
        return reply

    def ping_for_drops(self, timeout: float = 2.0) -> None:
        """One ping that asks for no offload task and runs only ``on_disk_drops`` (before an SSD tier stops:
        the files of objects just removed go with it). Raises grpc.RpcError."""
        with self._ping_lock:
            reply = self.call("Ping", timeout=timeout, drop_ack=self._drop_ack)
            if reply.drop_disk and self.on_disk_drops is not None:
                if self.on_disk_drops(list(reply.drop_disk)) is not False:
                    self._drop_ack = reply.drop_seq

    def start_heartbeat(self, interval: float = 1.0) -> None:
        if self._hb_thread is not None:
            return
        self._hb_stop.clear()
        self._hb_thread = threading.Thread(target=self._heartbeat, args=(interval,), name="master-heartbeat",
                                           daemon=True)
        self._hb_thread.start()

    def ping_soon(self) -> None:
        """Wakes the heartbeat: it pings now (e.g. to fetch drop notices a removal just caused)."""
        self._hb_wake.set()

    def _heartbeat(self, interval: float) -> None:
        while True:
            self._hb_wake.wait(interval)
            self._hb_wake.clear()
            if self._hb_stop.is_set():
                return
            try:
                self.ping_once()
            except grpc.RpcError as e:  # the master is down or restarting: keep trying
                _log.debug("ping failed: %s", e.code())
            except Exception:  # a hook failed: a bug worth a loud line, but the heartbeat must go on
                _log.exception("heartbeat round failed")

    def close(self) -> None:
        """Stops the heartbeat and closes the channel (segments stay mounted; unmount them first if needed)."""
        self._hb_stop.set()
        self._hb_wake.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=5)
            self._hb_thread = None
        if self._fast is not None:
            self._fast.close()
            self._fast = None
        self._channel.close()

    def __enter__(self) -> "MasterClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
