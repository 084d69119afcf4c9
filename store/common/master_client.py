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
cannot be opened goes over gRPC instead (nothing was sent); after a call that failed once sent, the fast path
is dropped until the heartbeat rediscovers it (e.g. after a master restart) and the call follows the rule below.

Master restarts and outages (``call``): a call waits for an unreachable master and retries with backoff,
all within its timeout (``MC_RPC_TIMEOUT_MS`` for store clients), where retrying is safe:
- a request that never left (no connection) is always resent;
- reads and idempotent calls (``IDEMPOTENT``) are resent after any broken connection;
- any other call that may have reached the master (the connection broke after sending) is resent only when
  the master answering now is another process (its ``view_version`` differs from the one this client knew
  when it sent): the process that may have run it is gone, and its state with it. Otherwise it raises (it
  may have run: resending a PutStart would find its own put in progress);
- a call that timed out is never resent (no time is left), nor is ``Ping`` (the heartbeat is its own loop).
A view change seen this way (or by the heartbeat) makes the calling thread ping at once, so this client
re-mounts its segments before the call is resent. A put start refused with NO_AVAILABLE_HANDLE by a master
that restarted lately (``RESTART_WAIT_SEC``; the master holds back remounted segments for a moment,
segments.py) is resent too, until its timeout, unless some key of the batch got space.
``limit_timeout`` caps every later call's wait (``close``: a master that is away is not waited for).

HA (``address`` = "etcd://h1:2379;h2:2379" or "redis://h:p", masters run with --enable_ha): a
``LeaderDirectory`` follows the master view the leader publishes (polled every ``MC_STORE_HA_POLL_MS``, 100 ms;
cluster ``MC_STORE_CLUSTER_ID``, default mooncake_cluster, the masters' --cluster_id). Every attempt goes to the
leader known then; a call to a master that is gone or not the leader fails UNAVAILABLE at once (no waiting for
a dead address) and follows the rules above: the new leader has another view, so the call is resent there.
Replies carry the answering master's view number: a read (``IDEMPOTENT``) answered by a view older than the
leader's is dropped and asked again; other replies stand (an HA master answers a change only once its op is
in the log, which a deposed leader cannot write: such a reply reports a change the new leader has).

Threading: a MasterClient may be shared by threads (gRPC channels are thread-safe); the heartbeat runs in
its own daemon thread and stops with ``close``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import grpc

from mooncake.store.common.protocol import GRPC_OPTIONS
from mooncake.store.common.fast_rpc import VIEW_METADATA_KEY, FastRpcClient, FastRpcError
from mooncake.store.proto import mooncake_master_pb2 as pb
from mooncake.store.proto import mooncake_master_pb2_grpc as pb_grpc

_log = logging.getLogger("mooncake.store.master.client")
_SERVICE = pb.DESCRIPTOR.services_by_name["MasterService"]
_REQUEST_TYPES = {m.name: getattr(pb, m.input_type.name) for m in _SERVICE.methods}
_WITH_CLIENT_ID = frozenset(name for name, t in _REQUEST_TYPES.items() if "client_id" in t.DESCRIPTOR.fields_by_name)

# Calls that may be resent after a broken connection whatever became of the first attempt: reads (a second
# lookup grants one more lease, nothing else) and calls whose repetition answers OK without another effect.
IDEMPOTENT = frozenset({"GetServiceInfo", "ExistKey", "BatchExistKey", "GetReplicaList", "BatchGetReplicaList",
                        "GetReplicaListByRegex", "QueryTask", "MountSegment", "ReMountSegment", "UnmountSegment"})
_NEVER_RESENT = frozenset({"Ping"})
_PUT_STARTS = frozenset({"PutStart", "BatchPutStart", "UpsertStart", "BatchUpsertStart"})
RESTART_WAIT_SEC = 6.0  # after a master restart, a put start without space waits (segments.REMOUNT_HOLD_SEC)
_BACKOFF_SEC = (0.02, 0.5)  # first and longest pause between attempts
_MIN_ATTEMPT_SEC = 0.01
_NO_SPACE = -200  # ErrorCode.NO_AVAILABLE_HANDLE
# A lost master is retried at least every 0.5 s (gRPC's default backoff grows to 2 minutes).
_CHANNEL_OPTIONS = GRPC_OPTIONS + [("grpc.initial_reconnect_backoff_ms", 100),
                                   ("grpc.min_reconnect_backoff_ms", 100),
                                   ("grpc.max_reconnect_backoff_ms", 500)]


def replicate_config(replica_num: int = 1, preferred_segments=(), with_soft_pin: bool = False,
                     with_hard_pin: bool = False, soft_pin_ttl_ms: int = 0) -> pb.ReplicateConfig:
    return pb.ReplicateConfig(replica_num=replica_num, preferred_segments=list(preferred_segments),
                              with_soft_pin=with_soft_pin, with_hard_pin=with_hard_pin,
                              soft_pin_ttl_ms=soft_pin_ttl_ms)


def segment(seg_id: str, name: str, base: int, size: int, te_endpoint: str = "", protocol: str = "tcp"
            ) -> pb.Segment:
    return pb.Segment(id=seg_id, name=name, base=base, size=size, te_endpoint=te_endpoint or name,
                      protocol=protocol)


class LeaderDirectory:
    """The current leader (address, view) of an HA master group, refreshed by a daemon thread."""

    def __init__(self, url: str, cluster_id: str, poll: float = 0.1) -> None:
        from mooncake.store.common.coordination import backend_of_url

        self._store = backend_of_url(url, cluster_id)
        self._poll = poll
        self._cond = threading.Condition()
        self.leader: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._refresh()
        self._thread = threading.Thread(target=self._loop, name="master-directory", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        try:
            view = self._store.read_view()
        except OSError as e:
            _log.debug("master view unreadable: %s", e)
            return
        with self._cond:
            if view != self.leader:
                if view is not None:
                    _log.info("master leader: %s (view %d)", view[0], view[1])
                self.leader = view
                self._cond.notify_all()

    def _loop(self) -> None:
        while not self._stop.wait(self._poll):
            self._refresh()

    def wait_leader(self, timeout: float) -> tuple[str, int] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.leader is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self.leader

    def close(self) -> None:
        self._stop.set()


class MasterClient:
    def __init__(self, address: str, client_id: str | None = None, timeout: float = 30.0) -> None:
        self.client_id = client_id or uuid.uuid4().hex
        self.timeout = timeout
        self._directory: LeaderDirectory | None = None
        self._switch_lock = threading.Lock()
        self._old_channels: list = []
        self._views = threading.local()
        self.old_view_replies = 0  # HA: reads answered by a deposed master, dropped and asked again
        if address.startswith(("etcd://", "redis://")):
            self._directory = LeaderDirectory(address, os.environ.get("MC_STORE_CLUSTER_ID", "mooncake_cluster"),
                                              float(os.environ.get("MC_STORE_HA_POLL_MS", 100)) / 1000)
            leader = self._directory.wait_leader(min(timeout, 5.0))
            address = leader[0] if leader else "127.0.0.1:9"  # none yet: calls wait for one (_follow_leader)
        self.address = address
        self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
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
        self._pinging = 0  # thread id holding _ping_lock (a hook's call must not ping again)
        self.restarted_at = float("-inf")  # time.monotonic() when this client last saw a new view
        # (view_version, time.monotonic() when it was sent) of the last answered ping: that master was alive then
        self.confirmed = (0, float("-inf"))
        self._closed = False

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel connects (HA: to a leader); raises grpc.FutureTimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        if self._directory is not None and self._directory.wait_leader(timeout) is None:
            raise grpc.FutureTimeoutError()
        self._follow_leader(deadline)
        grpc.channel_ready_future(self._channel).result(timeout=max(0.01, deadline - time.monotonic()))

    def _follow_leader(self, deadline: float) -> None:
        """HA: points the channel at the leader the directory knows now (waiting for one until `deadline`)."""
        d = self._directory
        if d is None:
            return
        leader = d.wait_leader(max(0.0, deadline - time.monotonic()))
        if leader is None or leader[0] == self.address:
            return
        with self._switch_lock:
            if leader[0] == self.address:
                return
            _log.info("client %s follows the master leader to %s (view %d)", self.client_id, leader[0], leader[1])
            old = self._channel
            self._channel = grpc.insecure_channel(leader[0], options=_CHANNEL_OPTIONS)
            self.stub = pb_grpc.MasterServiceStub(self._channel)
            self.address = leader[0]
            fast, self._fast = self._fast, None
            if fast is not None:
                fast.close()
            # Calls in flight on the old channel finish or fail there; it is closed a switch later.
            self._old_channels.append(old)
            while len(self._old_channels) > 1:
                self._old_channels.pop(0).close()

    def call(self, method: str, timeout: float | None = None, **fields):
        """Sends RPC `method` with a request built from `fields` (client_id added when the request has one),
        waiting for an unreachable master and resending where safe (module docstring), all within `timeout`
        (default: the client's). Raises grpc.RpcError when no attempt got a reply."""
        try:
            req_type = _REQUEST_TYPES[method]
        except KeyError:
            raise ValueError(f"unknown master RPC {method!r}") from None
        if method in _WITH_CLIENT_ID and "client_id" not in fields:
            fields["client_id"] = self.client_id
        request = req_type(**fields)
        deadline = time.monotonic() + min(timeout or self.timeout, self.timeout)
        pause = _BACKOFF_SEC[0]
        while True:
            if self._closed:
                raise FastRpcError(grpc.StatusCode.UNAVAILABLE, f"{method}: the master client is closed", sent=False)
            view = self.view_version
            try:
                reply = self._send(method, request, deadline)
                if self._directory is not None and method in IDEMPOTENT and self._old_view(self._reply_view):
                    # A read answered by a master whose view is older than the leader's: dropped (the leader
                    # rule makes this rare: a deposed leader stops before another is elected), asked again.
                    self.old_view_replies += 1
                    raise FastRpcError(grpc.StatusCode.UNAVAILABLE, f"{method}: reply from an old master view",
                                       sent=True)
            except grpc.RpcError as e:
                if method in _NEVER_RESENT or not self._may_resend(method, e, view, deadline):
                    raise
                outcome = e
            else:
                if method not in _PUT_STARTS or not self._no_space_after_restart(reply, view, deadline):
                    return reply
                outcome = reply
            wait = min(pause, deadline - time.monotonic() - _MIN_ATTEMPT_SEC)
            if wait < 0:
                if isinstance(outcome, grpc.RpcError):
                    raise outcome
                return outcome
            time.sleep(wait)
            pause = min(pause * 2, _BACKOFF_SEC[1])

    def _send(self, method: str, request, deadline: float):
        """One attempt: the fast path when in use (a connection that cannot be opened falls through to gRPC),
        else gRPC, which waits for the channel to (re)connect until `deadline`."""
        if self._directory is not None:
            self._follow_leader(deadline)
        left = max(_MIN_ATTEMPT_SEC, deadline - time.monotonic())
        fast = self._fast
        if fast is not None:
            try:
                reply = fast.call(method, request, left)
                if self._directory is not None:  # the only reader of _reply_view (call)
                    self._reply_view = fast.last_view()
                return reply
            except FastRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                self._drop_fast(fast, e)
                if e.sent:
                    raise
                left = max(_MIN_ATTEMPT_SEC, deadline - time.monotonic())
        try:
            if self._directory is None:
                return getattr(self.stub, method)(request, timeout=left, wait_for_ready=True)
            # HA: no waiting for a master that may be gone for good (the retry loop follows the leader); the
            # reply's trailing metadata names the view of the master that answered.
            reply, rpc = getattr(self.stub, method).with_call(request, timeout=left, wait_for_ready=False)
            md = dict(rpc.trailing_metadata() or ())
            self._reply_view = int(md.get(VIEW_METADATA_KEY, 0) or 0)
            return reply
        except ValueError:  # the channel was closed meanwhile (close)
            raise FastRpcError(grpc.StatusCode.UNAVAILABLE, f"{method}: the master client is closed",
                               sent=False) from None

    @property
    def _reply_view(self) -> int:
        """The view number the calling thread's last reply carried (HA masters; 0: none)."""
        return getattr(self._views, "view", 0)

    @_reply_view.setter
    def _reply_view(self, view: int) -> None:
        self._views.view = view

    def _old_view(self, view: int) -> bool:
        """Whether a reply of master view `view` comes from before the leader the directory knows now."""
        leader = self._directory.leader
        return bool(view) and leader is not None and view < leader[1]

    def _may_resend(self, method: str, e: grpc.RpcError, view: int, deadline: float) -> bool:
        """Whether a call that raised `e` (sent while this client knew master view `view`) is safe to send again."""
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            return False  # timed out (no time left), refused or failed inside the master: its answer stands
        if isinstance(e, FastRpcError) and not e.sent:
            return True
        if method in IDEMPOTENT:
            return True
        if self._master_changed(view, deadline):
            return True
        _log.warning("%s failed after it was sent (%s) and the master did not restart: not resent (it may have "
                     "run)", method, e.details() if hasattr(e, "details") else e.code())
        return False

    def _no_space_after_restart(self, reply, view: int, deadline: float) -> bool:
        """Whether a put start's reply is a restarted master's "no space yet" (its segments are being
        remounted, or held back): no key got space and one was refused NO_AVAILABLE_HANDLE."""
        codes = [r.code for r in reply.results] if hasattr(reply, "results") else [reply.code]
        if _NO_SPACE not in codes or 0 in codes:
            return False
        changed = self._master_changed(view, deadline)
        return changed or time.monotonic() - self.restarted_at < RESTART_WAIT_SEC

    def _master_changed(self, view: int, deadline: float) -> bool:
        """Asks the master for its view (waiting for it until `deadline`): True when it is not `view`, i.e. a
        new master process answers; then this thread pings it so that this client's segments are remounted."""
        try:  # GetServiceInfo is idempotent: this waits for a master that is away (resending it)
            now_view = self.call("GetServiceInfo", timeout=max(_MIN_ATTEMPT_SEC, deadline - time.monotonic())
                                 ).view_version
        except grpc.RpcError as e:
            _log.debug("master view unknown: %s", e.code())
            return False
        if now_view == view:
            return False
        self.restarted_at = time.monotonic()
        if self._pinging != threading.get_ident():
            try:
                self.ping_once()
            except grpc.RpcError as e:
                _log.debug("ping after a master restart failed: %s", e.code())
        return True

    def limit_timeout(self, seconds: float) -> None:
        """Every later call waits for the master at most `seconds` (e.g. while closing)."""
        self.timeout = min(self.timeout, seconds)

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
            self._pinging = threading.get_ident()
            try:
                return self._ping_locked()
            finally:
                self._pinging = 0

    def _ping_locked(self) -> pb.PingReply:
        capacity = self.offload_capacity() if self.offload_capacity is not None else 0
        sent = time.monotonic()
        reply = self.call("Ping", timeout=min(self.timeout, 5.0), offload_capacity=max(0, capacity),
                          drop_ack=self._drop_ack)
        if reply.view_version != self.view_version:
            self.restarted_at = time.monotonic()
        if self._fast_wanted and (self._fast is None or reply.view_version != self.view_version):
            self.use_fast_path()  # first ping after a master restart, or after the fast door failed
        self.view_version = reply.view_version
        self.confirmed = (reply.view_version, sent)
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
        """Stops the heartbeat and closes the channel (segments stay mounted; unmount them first if needed).
        Calls in flight in other threads then fail (RPC_FAIL), later ones at once."""
        self._closed = True
        self._hb_stop.set()
        self._hb_wake.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=5)
            self._hb_thread = None
        if self._fast is not None:
            self._fast.close()
            self._fast = None
        if self._directory is not None:
            self._directory.close()
        for ch in self._old_channels:
            ch.close()
        self._channel.close()

    def __enter__(self) -> "MasterClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
