"""HTTP metadata server for the Transfer Engine (and the store master's embedded copy).

Protocol (compatible with Mooncake's `mooncake_http_metadata_server`):
  GET    /metadata?key=K   200 + stored body | 404 "metadata not found"
  PUT    /metadata?key=K   200 "metadata updated" (body stored verbatim). A key containing "rpc_meta" that
                           already exists: 200 "metadata unchanged" for an identical body, else 400
                           "Duplicate rpc_meta key not allowed" (two engines claiming one name is an error).
  DELETE /metadata?key=K   200 "metadata deleted" | 404 "metadata not found"
Versions and conditional forms (extensions; every response announces them in the header
X-Mooncake-Metadata-Features: if_absent,if_version so clients use them only against this server):
  Every stored key carries a version: an integer this server process assigns on each PUT that stores a body
  (an identical rpc_meta PUT, which stores nothing, keeps it). Versions increase monotonically from a random
  62-bit start per process, so a restarted server does not reissue a version a client may still hold.
  GET    /metadata?key=K   200 also carries the header X-Mooncake-Metadata-Version: N (the stored body's version)
  PUT    ...&if_absent=1   create-if-absent: 200 "metadata updated" | 412 "metadata exists" (left untouched)
  DELETE ...&if_version=N  delete only while the key's version is N: 200 "metadata deleted" | 404 "metadata not
                           found" | 412 "metadata changed" (left untouched, also after a PUT of the same body)
                           | 400 for an N that is not a decimal integer
  Each is atomic under the store lock.
  GET    /health           200 "OK"
  missing/empty/blank key  400 for every method (keys are stripped)
  other paths              404; other methods 405

Bounds (``BoundedHTTPServer`` / ``BoundedHandler``, shared with the master's admin HTTP server): a body is at
most MAX_BODY bytes (413 otherwise; chunked bodies: 411), read as it arrives (never allocated from its
Content-Length) and within BODY_TIMEOUT_SEC; the bodies being received hold at most MAX_BODIES_IN_FLIGHT bytes
together (503 when no room comes in time). At most MAX_CONNECTIONS connections are served at once (beyond,
new ones are closed at once) and a connection silent for IDLE_TIMEOUT_SEC is closed. A refused request
closes its connection (its body is not read).

Threading: one thread per connection (ThreadingHTTPServer); the store is guarded by one lock.
The store is in memory: a restart loses every key (engines re-publish on their next registration).
"""

from __future__ import annotations

import argparse
import http.server
import logging
import secrets
import signal
import socket
import sys
import threading
import time
import urllib.parse

from mooncake.listener_limits import ByteBudget, ConnectionSlots, LimitExceeded, read_exactly

_log = logging.getLogger("mooncake.http_metadata_server")
MAX_BODY = 64 << 20  # a segment descriptor is a few KiB; refuse absurd bodies instead of buffering them
MAX_BODIES_IN_FLIGHT = 256 << 20
BODY_TIMEOUT_SEC = 30.0
IDLE_TIMEOUT_SEC = 300.0
MAX_CONNECTIONS = 1024
FEATURES_HEADER = "X-Mooncake-Metadata-Features"
FEATURES = "if_absent,if_version"
VERSION_HEADER = "X-Mooncake-Metadata-Version"


class MetadataStore:
    """Thread-safe in-memory key -> (bytes, version) map; versions as in the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, tuple[bytes, int]] = {}
        self._last_version = secrets.randbits(62)

    def _store(self, key: str, value: bytes) -> None:
        self._last_version += 1
        self._data[key] = (value, self._last_version)

    def get(self, key: str) -> bytes | None:
        entry = self.get_versioned(key)
        return None if entry is None else entry[0]

    def get_versioned(self, key: str) -> tuple[bytes, int] | None:
        """(body, version) of `key`, or None when absent."""
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: bytes) -> tuple[int, str]:
        with self._lock:
            old = self._data.get(key)
            if old is not None and "rpc_meta" in key:
                if old[0] == value:
                    return 200, "metadata unchanged"
                return 400, "Duplicate rpc_meta key not allowed"
            self._store(key, value)
            return 200, "metadata updated"

    def set(self, key: str, value: bytes) -> None:
        """Stores `value` unconditionally (rpc_meta keys included) with a new version."""
        with self._lock:
            self._store(key, value)

    def create(self, key: str, value: bytes) -> bool:
        """Stores `value` only if `key` is absent: whether it was stored."""
        with self._lock:
            if key in self._data:
                return False
            self._store(key, value)
            return True

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._data.pop(key, None) is not None

    def delete_if_version(self, key: str, version: int) -> int:
        """Deletes `key` only while its version is `version`: 200 deleted, 404 absent, 412 stored anew since."""
        with self._lock:
            old = self._data.get(key)
            if old is None:
                return 404
            if old[1] != version:
                return 412
            del self._data[key]
            return 200

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._data)


def send_reply(handler: http.server.BaseHTTPRequestHandler, code: int, body: bytes | str,
               content_type: str = "text/plain", headers: dict[str, str] | None = None) -> None:
    """Writes one complete HTTP/1.1 response (with Content-Length, so keep-alive works) with `headers` added."""
    data = body.encode() if isinstance(body, str) else body
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class BoundedHandler(http.server.BaseHTTPRequestHandler):
    """Request handler of a BoundedHTTPServer: keep-alive, idle timeout, bounded request bodies."""

    protocol_version = "HTTP/1.1"  # keep-alive: engines reuse one connection
    # A reply is written as headers then body: with Nagle on, the body waits for the client's delayed ACK of
    # the headers (~40 ms per request; every register_memory publishes through here).
    disable_nagle_algorithm = True
    timeout = IDLE_TIMEOUT_SEC  # socket timeout while waiting for a request (StreamRequestHandler.setup)

    def refuse(self, code: int, message: str) -> None:
        """Replies `code` and closes the connection (whatever of the request is unread stays unread)."""
        self.close_connection = True
        send_reply(self, code, message)

    def read_body(self) -> bytes | None:
        """The request's body (b"" without one), or None after refusing the request (see module docstring)."""
        if self.headers.get("Transfer-Encoding"):
            self.refuse(411, "a Content-Length body is required (no Transfer-Encoding)")
            return None
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self.refuse(400, "bad Content-Length")
            return None
        if length > MAX_BODY:
            self.refuse(413, f"body of {length} bytes exceeds the limit of {MAX_BODY}")
            return None
        if length == 0:
            return b""
        budget = self.server.body_budget  # type: ignore[attr-defined]
        try:
            # read1: one recv at most per call, so every read is bounded by the time left (read() would wait
            # for a whole chunk with each recv getting the full time left).
            body = read_exactly(self.rfile.read1, length, budget,
                                time.monotonic() + self.server.body_timeout,  # type: ignore[attr-defined]
                                self.connection.settimeout)
        except LimitExceeded as e:
            self.refuse(503, str(e))
            return None
        except (OSError, ConnectionError):  # the body did not arrive (in time): nobody to answer
            self.close_connection = True
            return None
        try:
            return bytes(body)
        finally:
            del body
            budget.give(length)
            self.connection.settimeout(self.timeout)

    def refuse_body(self) -> bool:
        """For endpoints without a body: True after refusing (413) a request that has one."""
        if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length", "0").strip() not in ("", "0"):
            self.refuse(413, "this endpoint takes no request body")
            return True
        return False


class _Handler(BoundedHandler):
    server_version = "mooncake-metadata/1"

    @property
    def store(self) -> MetadataStore:
        return self.server.store  # type: ignore[attr-defined]

    def log_message(self, fmt: str, *args) -> None:  # route to logging instead of stderr
        _log.debug("%s %s", self.address_string(), fmt % args)

    def _reply(self, code: int, body: bytes | str, content_type: str = "text/plain",
               headers: dict[str, str] | None = None) -> None:
        send_reply(self, code, body, content_type, headers)

    def end_headers(self) -> None:
        self.send_header(FEATURES_HEADER, FEATURES)
        super().end_headers()

    def _param(self, name: str) -> str | None:
        """The query parameter's first value ("" when given blank), None when absent."""
        values = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True).get(name)
        return values[0] if values else None

    def _route(self) -> str | None:
        """Returns the key for /metadata requests (replying 400/404 itself when invalid), else None."""
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/health" and self.command == "GET":
            self._reply(200, "OK")
            return None
        if url.path != "/metadata":
            self._reply(404, "not found")
            return None
        key = urllib.parse.parse_qs(url.query).get("key", [""])[0].strip()
        if not key:
            self._reply(400, "missing or empty key")
            return None
        return key

    def do_GET(self) -> None:
        if self.refuse_body():
            return
        key = self._route()
        if key is None:
            return
        entry = self.store.get_versioned(key)
        if entry is None:
            self._reply(404, "metadata not found")
        else:
            self._reply(200, entry[0], "application/json", {VERSION_HEADER: str(entry[1])})

    def do_PUT(self) -> None:
        body = self.read_body()
        if body is None:
            return
        key = self._route()
        if key is None:
            return
        if self._param("if_absent") not in (None, "", "0"):
            if self.store.create(key, body):
                self._reply(200, "metadata updated")
            else:
                self._reply(412, "metadata exists")
            return
        code, message = self.store.put(key, body)
        self._reply(code, message)

    def do_DELETE(self) -> None:
        if self.refuse_body():
            return
        key = self._route()
        if key is None:
            return
        version = self._param("if_version")
        if version is not None:
            version = version.strip()
            if not (version.isascii() and version.isdigit()):
                self._reply(400, "if_version must be a decimal integer")
                return
            code = self.store.delete_if_version(key, int(version))
            self._reply(code, {200: "metadata deleted", 404: "metadata not found", 412: "metadata changed"}[code])
            return
        if self.store.delete(key):
            self._reply(200, "metadata deleted")
        else:
            self._reply(404, "metadata not found")

    def _not_allowed(self) -> None:
        self.refuse(405, "method not allowed")  # its body (if any) is not read: the connection ends

    do_POST = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed


class BoundedHTTPServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer within the bounds of the module docstring (its handler: a BoundedHandler).

    Tracks open connections so stopping the server also ends its keep-alive connections (clients then
    reconnect to whatever serves the port next, as they would after a process restart)."""

    daemon_threads = True

    def __init__(self, *args, max_connections: int = MAX_CONNECTIONS, max_bodies_in_flight: int = MAX_BODIES_IN_FLIGHT,
                 body_timeout: float = BODY_TIMEOUT_SEC, **kwargs):
        self._connections: set = set()
        self._connections_lock = threading.Lock()
        self.slots = ConnectionSlots(max_connections)
        self.body_budget = ByteBudget(max_bodies_in_flight)
        self.body_timeout = body_timeout
        self.refused_connections = 0
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire():
            self.refused_connections += 1
            if self.refused_connections % 1000 == 1:
                _log.warning("%d HTTP connections open (the limit); refusing new ones (%d so far)",
                             self.slots.limit, self.refused_connections)
            super().shutdown_request(request)
            return
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._connections_lock:
            tracked = request in self._connections
            self._connections.discard(request)
        if tracked:
            self.slots.release()
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request, client_address) -> None:  # a client that vanished mid-request
        _log.debug("request from %s failed", client_address, exc_info=True)


class HttpMetadataServer:
    """Serves the metadata protocol above on (host, port); port 0 picks a free port.

    Lifecycle: start() serves in a daemon thread and returns self; stop() shuts down and joins (idempotent).
    Usable as a context manager. `limits`: BoundedHTTPServer's max_connections, max_bodies_in_flight,
    body_timeout.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 8080, store: MetadataStore | None = None,
                 **limits) -> None:
        self.store = store or MetadataStore()
        self._httpd = BoundedHTTPServer((host, port), _Handler, **limits)
        self._httpd.store = self.store  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return self._httpd.server_address[0]

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/metadata"

    def start(self) -> "HttpMetadataServer":
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, name="http-metadata", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        self._httpd.close_connections()

    def __enter__(self) -> "HttpMetadataServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mooncake_http_metadata_server",
        description="In-memory HTTP metadata server for Mooncake Transfer Engines "
        "(GET/PUT/DELETE /metadata?key=K, GET /health).",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="port to bind, 0 = any free (default: %(default)s)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = HttpMetadataServer(args.host, args.port)
    except OSError as e:
        _log.error("cannot bind %s:%d: %s (is another server using the port? pick one with --port)",
                   args.host, args.port, e)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server._httpd.shutdown).start())
    _log.info("serving metadata on http://%s:%d/metadata", args.host, server.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
