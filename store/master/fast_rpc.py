"""Framed protobuf RPC over plain TCP: a low-latency second door to the same MasterServicer.

Python gRPC costs ~300 µs per call on a small host; a put needs two master calls and a cold get one, so
the store client sends its calls here when the master advertises a port (``ServiceInfoReply.fast_rpc_port``,
flag ``--fast_rpc_port``: 0 ephemeral, -1 off) and falls back to gRPC otherwise. Same messages, same
handlers, same semantics; only the framing differs.

Wire format (little endian): request = u32 payload length, u16 method index (position of the method in the
service definition in mooncake_master.proto), payload (the serialized request message). Reply = u32
payload length, u8 status (0: payload is the reply message; 1: payload is a UTF-8 error text, the call
failed like a gRPC INTERNAL / INVALID_ARGUMENT error). One request at a time per connection; a server
thread per connection. Frames above MAX_FRAME bytes close the connection.

Any service of mooncake_master.proto can be served this way (``service=``, default MasterService): store
clients with an SSD tier serve DiskReplicaService to readers of their disk replicas (store/client/disk_serve.py).

Client: ``FastRpcClient.call(method, request)``; one connection per calling thread, opened lazily and
reopened after an error. Failures raise ``FastRpcError`` (a ``grpc.RpcError``: ``code()`` UNAVAILABLE,
DEADLINE_EXCEEDED or INTERNAL), so callers handle both doors alike.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading

import grpc

from mooncake.store.proto import mooncake_master_pb2 as pb

_log = logging.getLogger("mooncake.store.master.fast_rpc")
_REQ_HEAD = struct.Struct("<IH")
_REPLY_HEAD = struct.Struct("<IB")
MAX_FRAME = 256 << 20


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
    pass


class _Context:
    """What the servicer's handlers use of grpc.ServicerContext."""

    def abort(self, code, details):
        raise _Abort(f"{code}: {details}")

    def is_active(self) -> bool:
        return True


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed")
        got += k
    return bytes(buf)


class FastRpcServer:
    """Serves `servicer` (a MasterServicer, or an object with the methods of `service`) on host:port (0:
    ephemeral). The constructor raises OSError when the port cannot be bound."""

    def __init__(self, servicer, host: str, port: int = 0, service: str = "MasterService",
                 thread_name: str = "master-fast-rpc") -> None:
        self._servicer = servicer
        self._methods = _methods(service)
        self._thread_name = thread_name
        self._sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.port = self._sock.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> "FastRpcServer":
        threading.Thread(target=self._accept, name=self._thread_name + "-accept", daemon=True).start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name=self._thread_name, daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        ctx = _Context()
        names, requests = self._methods.names, self._methods.requests
        try:
            while True:
                length, index = _REQ_HEAD.unpack(_recv_exact(conn, _REQ_HEAD.size))
                if length > MAX_FRAME or index >= len(names):
                    _log.warning("fast RPC: bad frame (length %d, method %d); closing", length, index)
                    return
                payload = _recv_exact(conn, length)
                try:
                    request = requests[index].FromString(payload)
                    out, status = getattr(self._servicer, names[index])(request, ctx).SerializeToString(), 0
                except Exception as e:  # noqa: BLE001  (decode errors, aborted handlers): answered, not fatal
                    out, status = str(e).encode(), 1
                conn.sendall(_REPLY_HEAD.pack(len(out), status) + out)
        except (OSError, ConnectionError, struct.error):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            conns = list(self._conns)
        self._sock.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


class FastRpcClient:
    def __init__(self, host: str, port: int, timeout: float = 30.0, service: str = "MasterService",
                 connect_timeout: float = 5.0) -> None:
        self.address = (host, port)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._methods = _methods(service)
        self._local = threading.local()
        self._all: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def _conn(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            if self._closed:
                raise FastRpcError(grpc.StatusCode.UNAVAILABLE, "client closed", sent=False)
            try:
                sock = socket.create_connection(self.address, timeout=min(self.timeout, self.connect_timeout))
            except OSError as e:
                raise FastRpcError(grpc.StatusCode.UNAVAILABLE, f"connect {self.address}: {e}", sent=False) from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.sock = sock
            with self._lock:
                self._all.append(sock)
        return sock

    def call(self, method: str, request, timeout: float | None = None):
        sock = self._conn()
        payload = request.SerializeToString()
        try:
            sock.settimeout(timeout or self.timeout)
            sock.sendall(_REQ_HEAD.pack(len(payload), self._methods.index[method]) + payload)
            length, status = _REPLY_HEAD.unpack(_recv_exact(sock, _REPLY_HEAD.size))
            body = _recv_exact(sock, length)
        except socket.timeout:
            self._drop(sock)
            raise FastRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: no reply in time") from None
        except (OSError, ConnectionError) as e:
            self._drop(sock)
            raise FastRpcError(grpc.StatusCode.UNAVAILABLE, f"{method}: {e}") from None
        if status != 0:
            raise FastRpcError(grpc.StatusCode.INTERNAL, f"{method}: {body.decode(errors='replace')}")
        return self._methods.replies[method].FromString(body)

    def _drop(self, sock: socket.socket) -> None:
        self._local.sock = None
        with self._lock:
            if sock in self._all:
                self._all.remove(sock)
        sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._all = self._all, []
        for s in socks:
            s.close()
