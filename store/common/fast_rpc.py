"""Framed protobuf RPC over plain TCP: a low-latency second door to the same MasterServicer.

Python gRPC costs ~300 µs per call on a small host; a put needs two master calls and a cold get one, so
the store client sends its calls here when the master advertises a port (``ServiceInfoReply.fast_rpc_port``,
flag ``--fast_rpc_port``: 0 ephemeral, -1 off) and falls back to gRPC otherwise. Same messages, same
handlers, same semantics; only the framing differs.

Wire format (little endian): request = u32 payload length, u16 method index (position of the method in the
service definition in mooncake_master.proto), payload (the serialized request message). Reply = u32
payload length, u8 status (0: payload is the reply message; 1: payload is a UTF-8 error text, the call
failed like a gRPC INTERNAL / INVALID_ARGUMENT error; 2: an error text, the call was refused UNAVAILABLE, e.g.
by a master that is not the leader; 3: a u64 view number, then the reply message: an HA master's reply).
One request at a time per connection; a server
thread per connection.

Bounds (python/mooncake/listener_limits.py): a request payload is at most ``max_frame`` bytes (default
MAX_FRAME, the gRPC door's limit too); it is read as it arrives, never allocated from its announced length,
and all connections' requests in progress hold at most ``max_inflight`` bytes together. A request must
arrive completely within ``frame_timeout`` of its first byte and its reply be taken within as long. A frame
over the limit, or one that finds no room in time, is answered with an error (status 1) and the connection
closed; an unknown method index is answered with an error. At most ``max_connections`` connections are
served at once; beyond, new ones are closed at once.

Any service of mooncake_master.proto can be served this way (``service=``, default MasterService): store
clients with an SSD tier serve DiskReplicaService to readers of their disk replicas (store/client/disk_serve.py).

Client: ``FastRpcClient.call(method, request)``; one connection per calling thread, opened lazily and
reopened after an error. The reply is first polled for up to ``spin_us`` microseconds (non-blocking reads on
the calling thread) and only then waited for in a blocking read: on virtual machines a thread that sleeps
for a ~50 us reply costs another ~50 us to wake up, which is most of a small call. The poll is adaptive: a
connection whose recent replies took longer than the budget (a busy or distant master) blocks at once, so
the calling thread burns at most ``spin_us`` of CPU per call and nothing while replies are slow.
``MC_STORE_RPC_SPIN_US`` sets the default budget (``DEFAULT_SPIN_US``); 0 turns polling off. Failures raise ``FastRpcError`` (a ``grpc.RpcError``: ``code()`` UNAVAILABLE,
DEADLINE_EXCEEDED or INTERNAL), so callers handle both doors alike.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import threading
import time
import weakref

import grpc

from mooncake.listener_limits import ByteBudget, ConnectionSlots, LimitExceeded, read_exactly
from mooncake.store.common.protocol import MAX_REQUEST_BYTES
from mooncake.store.proto import mooncake_master_pb2 as pb

_log = logging.getLogger("mooncake.store.common.fast_rpc")
_REQ_HEAD = struct.Struct("<IH")
_REPLY_HEAD = struct.Struct("<IB")
MAX_FRAME = MAX_REQUEST_BYTES
MAX_INFLIGHT = 256 << 20
MAX_CONNECTIONS = 1024
FRAME_TIMEOUT_SEC = 30.0
SMALL_FRAME = 16 << 10  # requests up to this size are read into the connection's own buffer
SERVER_IDLE_SEC = 300.0  # a server closes a connection without a request for this long
CLIENT_IDLE_SEC = 120.0  # a client replaces a connection it has not used for this long (< SERVER_IDLE_SEC)
DEFAULT_SPIN_US = 150  # reply polling budget per call (module docstring); MC_STORE_RPC_SPIN_US overrides
_SPIN_DECAY = 0.125  # weight of the newest reply time in a connection's running average


def spin_budget_from_env() -> float:
    """The reply polling budget in seconds: MC_STORE_RPC_SPIN_US (microseconds, >= 0), else DEFAULT_SPIN_US.
    A malformed value is refused with ValueError (a typo must not silently change latency)."""
    raw = os.environ.get("MC_STORE_RPC_SPIN_US", "").strip()
    if not raw:
        return DEFAULT_SPIN_US * 1e-6
    try:
        us = int(raw)
    except ValueError:
        raise ValueError(f"MC_STORE_RPC_SPIN_US={raw!r}: expected a whole number of microseconds") from None
    if us < 0 or us > 100_000:
        raise ValueError(f"MC_STORE_RPC_SPIN_US={us}: expected 0..100000 microseconds")
    return us * 1e-6


def _timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int((seconds - int(seconds)) * 1e6))


class _Methods:
    """The method table of one service of mooncake_master.proto (index = position in the definition)."""

    def __init__(self, service: str) -> None:
        methods = pb.DESCRIPTOR.services_by_name[service].methods
        self.names = [m.name for m in methods]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.requests = [getattr(pb, m.input_type.name) for m in methods]
        self.replies = {m.name: getattr(pb, m.output_type.name) for m in methods}


_TABLES: dict[str, _Methods] = {}


def _methods(service: str) -> _Methods:
    table = _TABLES.get(service)
    if table is None:
        table = _TABLES[service] = _Methods(service)
    return table


class FastRpcError(grpc.RpcError):
    """`sent` is False when the request never left (connect failed): the call may safely go another way."""

    def __init__(self, code: grpc.StatusCode, details: str, sent: bool = True) -> None:
        super().__init__(details)
        self._code = code
        self._details = details
        self.sent = sent

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Abort(Exception):
    def __init__(self, code, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code


# Reply status: 0 a reply message follows; 1 failed (INTERNAL: the text follows); 2 UNAVAILABLE (e.g. this
# master is not the leader: the text follows; the client may go to another master); 3 a u64 view number
# (an HA master's, see ``_Context.set_trailing_metadata``), then the reply message.
_STATUS_UNAVAILABLE = 2
_STATUS_VIEW_REPLY = 3
_VIEW = struct.Struct("<Q")
VIEW_METADATA_KEY = "mc-view"  # gRPC trailing metadata of an HA master's replies: its view number


class _Context:
    """What the servicer's handlers use of grpc.ServicerContext; ``set_trailing_metadata`` keeps only the
    view number (VIEW_METADATA_KEY), sent ahead of the reply."""

    def __init__(self) -> None:
        self.view = 0

    def abort(self, code, details):
        raise _Abort(code, details)

    def set_trailing_metadata(self, metadata) -> None:
        for k, v in metadata:
            if k == VIEW_METADATA_KEY:
                self.view = int(v)

    def is_active(self) -> bool:
        return True


class FastRpcServer:
    """Serves `servicer` (a MasterServicer, or an object with the methods of `service`) on host:port (0:
    ephemeral), within the bounds of the module docstring. The constructor raises OSError when the port cannot
    be bound."""

    def __init__(self, servicer, host: str, port: int = 0, service: str = "MasterService",
                 thread_name: str = "master-fast-rpc", max_frame: int = MAX_FRAME, max_inflight: int = MAX_INFLIGHT,
                 max_connections: int = MAX_CONNECTIONS, frame_timeout: float = FRAME_TIMEOUT_SEC) -> None:
        self._servicer = servicer
        self._methods = _methods(service)
        self._thread_name = thread_name
        self.max_frame = max_frame
        self._budget = ByteBudget(max(max_inflight, max_frame))
        self._slots = ConnectionSlots(max_connections)
        self._frame_timeout = frame_timeout
        self.refused_connections = 0
        self._refusals = 0
        self._refusals_logged = 0
        self._last_refusal_log = -1e9
        self._sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.port = self._sock.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._threads: set[threading.Thread] = set()  # the accept thread and one per connection

    def start(self) -> "FastRpcServer":
        self._spawn(self._accept, (), self._thread_name + "-accept")
        return self

    def _spawn(self, target, args: tuple, name: str) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())
        t = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not self._slots.acquire():
                self.refused_connections += 1
                if self.refused_connections % 1000 == 1:
                    _log.warning("fast RPC: %d connections open (the limit); refusing new ones (%d so far)",
                                 self._slots.limit, self.refused_connections)
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._stopped:
                    conn.close()
                    self._slots.release()
                    return
                self._conns.add(conn)
            self._spawn(self._serve, (conn,), self._thread_name)

    def _serve(self, conn: socket.socket) -> None:
        """One connection. Hot path: the socket stays blocking (no per-request timeout switching, no poll),
        and a request of up to SMALL_FRAME bytes that arrives whole is read with one recv_into the
        connection's own buffer (a fixed, per-connection amount of memory). Only a frame that arrives in
        pieces switches to timed reads bounded by its deadline, and only a larger one takes bytes from the
        shared budget (read_exactly). A reply must be taken within frame_timeout (SO_SNDTIMEO)."""
        ctx = _Context()
        names = self._methods.names
        head_size = _REQ_HEAD.size
        buf = bytearray(SMALL_FRAME + head_size)
        view = memoryview(buf)
        have = 0  # bytes of buf holding received data (a frame's start, or more than one frame)
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(self._frame_timeout))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(SERVER_IDLE_SEC))
            while True:
                if have == 0:
                    have = conn.recv_into(buf)  # idle: SERVER_IDLE_SEC at most (SO_RCVTIMEO), then closed
                    if not have:
                        return
                deadline = time.monotonic() + self._frame_timeout
                timed = False
                while have < head_size:
                    timed = self._timed(conn, deadline, timed)
                    k = conn.recv_into(view[have:])
                    if not k:
                        return
                    have += k
                length, index = _REQ_HEAD.unpack_from(buf)
                if length > self.max_frame:
                    self._refuse(conn, f"request of {length} bytes exceeds the limit of {self.max_frame}")
                    return
                end = head_size + length
                budgeted = 0
                if end <= len(buf):  # a small frame: it fits the connection's buffer
                    while have < end:
                        timed = self._timed(conn, deadline, timed)
                        k = conn.recv_into(view[have:])
                        if not k:
                            return
                        have += k
                    payload = view[head_size:end]
                else:  # a large one: read as it arrives, within the listener's budget
                    timed = self._timed(conn, deadline, timed)
                    first = bytes(view[head_size:have])
                    have = end = 0
                    payload = read_exactly(conn.recv, length, self._budget, deadline, conn.settimeout, first)
                    budgeted = length
                try:
                    if timed:
                        conn.settimeout(None)
                    if index >= len(names):
                        out, status = f"unknown method index {index}".encode(), 1
                    else:
                        ctx.view = 0
                        out, status = self._call(index, payload, ctx), 0
                        if ctx.view:
                            out, status = _VIEW.pack(ctx.view) + out, _STATUS_VIEW_REPLY
                except _Abort as e:
                    out, status = str(e).encode(), _STATUS_UNAVAILABLE if e.code == grpc.StatusCode.UNAVAILABLE else 1
                except Exception as e:  # noqa: BLE001  (decode errors): answered, not fatal
                    out, status = str(e).encode(), 1
                finally:
                    del payload
                    self._budget.give(budgeted)
                if have > end:  # the start of the next request came with this one
                    buf[:have - end] = buf[end:have]
                have -= end
                conn.sendall(_REPLY_HEAD.pack(len(out), status) + out)
        except LimitExceeded as e:
            self._refuse(conn, str(e))
        except (OSError, ConnectionError, struct.error):  # includes timeouts
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            self._slots.release()

    @staticmethod
    def _timed(conn: socket.socket, deadline: float, timed: bool) -> bool:
        """Before a read inside a frame: bounds it by the frame's deadline (TimeoutError once passed)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request did not arrive in time")
        conn.settimeout(left)
        return True

    def _call(self, index: int, payload: bytearray, ctx: _Context) -> bytes:
        request = self._methods.requests[index].FromString(payload)
        return getattr(self._servicer, self._methods.names[index])(request, ctx).SerializeToString()

    def _refuse(self, conn: socket.socket, why: str) -> None:
        """Answers the request being read with an error, then the caller closes the connection. Logged at
        most once a second (a flood of bad frames must not flood the log)."""
        self._refusals += 1
        now = time.monotonic()
        if now - self._last_refusal_log >= 1.0:
            self._last_refusal_log = now
            _log.warning("fast RPC (%s): %s; closing the connection (%d refused since the last report)",
                         self._thread_name, why, self._refusals - self._refusals_logged)
            self._refusals_logged = self._refusals
        out = why.encode()
        try:
            conn.settimeout(1.0)
            conn.sendall(_REPLY_HEAD.pack(len(out), 1) + out)
        except OSError:
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """Closes the port and every connection, then joins the server's threads (each within `timeout`), so
        nothing of the servicer stays referenced by a thread afterwards. Idempotent; not from a handler."""
        with self._lock:
            self._stopped = True
            conns = list(self._conns)
        try:  # close() alone does not wake a thread blocked in accept(); shutdown() does (EINVAL)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)


class _ThreadConn:
    """One calling thread's connection (kept in a threading.local): when the thread ends, the holder is freed
    and a finalizer closes the socket, so threads that come and go leave no connections behind."""

    __slots__ = ("sock", "timeout", "buf", "last_used", "wait", "__weakref__")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.timeout, self.buf, self.last_used = sock, None, bytearray(SMALL_FRAME), time.monotonic()
        self.wait = 0.0  # running average of reply times (seconds): above the polling budget, no polling


def _forget(socks: set, lock: threading.Lock, sock: socket.socket) -> None:
    with lock:
        socks.discard(sock)
    sock.close()


class FastRpcClient:
    def __init__(self, host: str, port: int, timeout: float = 30.0, service: str = "MasterService",
                 connect_timeout: float = 5.0, spin_us: float | None = None) -> None:
        """`spin_us`: reply polling budget per call (module docstring); None: MC_STORE_RPC_SPIN_US or
        DEFAULT_SPIN_US; 0: always a blocking read."""
        self.address = (host, port)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        if spin_us is not None and not 0 <= spin_us <= 100_000:
            raise ValueError(f"spin_us={spin_us}: expected 0..100000 microseconds")
        self._spin = spin_budget_from_env() if spin_us is None else spin_us * 1e-6
        self._methods = _methods(service)
        self._local = threading.local()
        self._views = threading.local()
        self._all: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def _conn(self) -> _ThreadConn:
        """This thread's connection: a blocking socket whose kernel timeouts (SO_RCVTIMEO / SO_SNDTIMEO) bound
        every read and write, so a call costs no timeout switching and no poll. A connection idle for
        CLIENT_IDLE_SEC is replaced before use (servers close theirs after the longer SERVER_IDLE_SEC, so a
        request is never sent into a connection the server is closing)."""
        c = getattr(self._local, "conn", None)
        if c is not None and time.monotonic() - c.last_used > CLIENT_IDLE_SEC:
            self._drop(c)
            c = None
        if c is None:
            if self._closed:
                raise FastRpcError(grpc.StatusCode.UNAVAILABLE, "client closed", sent=False)
            try:
                sock = socket.create_connection(self.address, timeout=min(self.timeout, self.connect_timeout))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(None)
            except OSError as e:
                raise FastRpcError(grpc.StatusCode.UNAVAILABLE, f"connect {self.address}: {e}", sent=False) from None
            c = self._local.conn = _ThreadConn(sock)
            with self._lock:
                self._all.add(sock)
            weakref.finalize(c, _forget, self._all, self._lock, sock)
        return c

    def call(self, method: str, request, timeout: float | None = None):
        """Raises FastRpcError RESOURCE_EXHAUSTED (sent=False) for a request over the servers' MAX_FRAME."""
        payload = request.SerializeToString()
        if len(payload) > MAX_FRAME:
            raise FastRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"{method}: request of {len(payload)} bytes exceeds the limit of {MAX_FRAME}",
                               sent=False)
        c = self._conn()
        sock = c.sock
        timeout = timeout or self.timeout
        try:
            if c.timeout is None or abs(c.timeout - timeout) > max(0.5, 0.1 * timeout):  # roughly right is enough
                tv = _timeval(timeout)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
                c.timeout = timeout
            sock.sendall(_REQ_HEAD.pack(len(payload), self._methods.index[method]) + payload)
            sent = time.perf_counter()
            body, status = self._reply(sock, c.buf, self._spin if c.wait <= self._spin else 0.0)
            c.wait += _SPIN_DECAY * (time.perf_counter() - sent - c.wait)
            c.last_used = time.monotonic()
        except OSError as e:  # ConnectionError too; a kernel timeout shows as EAGAIN
            self._drop(c)
            if isinstance(e, socket.timeout) or e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise FastRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: no reply in time") from None
            raise FastRpcError(grpc.StatusCode.UNAVAILABLE, f"{method}: {e}") from None
        if status == _STATUS_UNAVAILABLE:
            raise FastRpcError(grpc.StatusCode.UNAVAILABLE, f"{method}: {body.decode(errors='replace')}")
        view = 0
        if status == _STATUS_VIEW_REPLY and len(body) >= _VIEW.size:
            view, body, status = _VIEW.unpack_from(body)[0], body[_VIEW.size:], 0
        if status != 0:
            raise FastRpcError(grpc.StatusCode.INTERNAL, f"{method}: {body.decode(errors='replace')}")
        self._views.view = view
        return self._methods.replies[method].FromString(body)

    def last_view(self) -> int:
        """The view number the calling thread's last reply carried (0: none, the server has no HA)."""
        return getattr(self._views, "view", 0)

    @staticmethod
    def _reply(sock: socket.socket, buf: bytearray, spin: float = 0.0) -> tuple[bytes, int]:
        """Reads one reply: usually a single recv into this thread's buffer; a large one reads on into a
        buffer of its announced size. The first bytes are polled for up to `spin` seconds, then waited for
        (bounded by the socket's SO_RCVTIMEO)."""
        view = memoryview(buf)
        head = _REPLY_HEAD.size
        have = 0
        if spin > 0.0:
            give_up = time.perf_counter() + spin
            while True:
                try:
                    have = sock.recv_into(view, 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    if time.perf_counter() < give_up:
                        continue
                    break
                if not have:
                    raise ConnectionError("connection closed")
                break
        while have < head:
            k = sock.recv_into(view[have:])
            if not k:
                raise ConnectionError("connection closed")
            have += k
        length, status = _REPLY_HEAD.unpack_from(buf)
        if have > head + length:
            raise ConnectionError("reply longer than announced")
        if head + length <= len(buf):
            while have < head + length:
                k = sock.recv_into(view[have:head + length])
                if not k:
                    raise ConnectionError("connection closed")
                have += k
            return bytes(view[head:head + length]), status
        body = bytearray(length)
        body[:have - head] = view[head:have]
        got = have - head
        bview = memoryview(body)
        while got < length:
            k = sock.recv_into(bview[got:])
            if not k:
                raise ConnectionError("connection closed")
            got += k
        return bytes(body), status

    def _drop(self, c: _ThreadConn) -> None:
        self._local.conn = None
        _forget(self._all, self._lock, c.sock)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._all = list(self._all), set()
        for s in socks:
            s.close()
