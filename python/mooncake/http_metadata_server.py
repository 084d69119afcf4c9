"""HTTP metadata server for the Transfer Engine (and the store master's embedded copy).

Protocol (compatible with Mooncake's `mooncake_http_metadata_server`):
  GET    /metadata?key=K   200 + stored body | 404 "metadata not found"
  PUT    /metadata?key=K   200 "metadata updated" (body stored verbatim). A key containing "rpc_meta" that
                           already exists: 200 "metadata unchanged" for an identical body, else 400
                           "Duplicate rpc_meta key not allowed" (two engines claiming one name is an error).
  DELETE /metadata?key=K   200 "metadata deleted" | 404 "metadata not found"
  GET    /health           200 "OK"
  missing/empty/blank key  400 for every method (keys are stripped)
  other paths              404; other methods 405

Threading: one thread per connection (ThreadingHTTPServer); the store is guarded by one lock.
The store is in memory: a restart loses every key (engines re-publish on their next registration).
"""

from __future__ import annotations

import argparse
import http.server
import logging
import signal
import socket
import sys
import threading
import urllib.parse

_log = logging.getLogger("mooncake.http_metadata_server")
_MAX_BODY = 64 << 20  # a segment descriptor is a few KiB; refuse absurd bodies instead of buffering them


class MetadataStore:
    """Thread-safe in-memory key -> bytes map."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: bytes) -> tuple[int, str]:
        with self._lock:
            old = self._data.get(key)
            if old is not None and "rpc_meta" in key:
                if old == value:
                    return 200, "metadata unchanged"
                return 400, "Duplicate rpc_meta key not allowed"
            self._data[key] = value
            return 200, "metadata updated"

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._data.pop(key, None) is not None

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._data)


def send_reply(handler: http.server.BaseHTTPRequestHandler, code: int, body: bytes | str,
               content_type: str = "text/plain") -> None:
    """Writes one complete HTTP/1.1 response (with Content-Length, so keep-alive works)."""
    data = body.encode() if isinstance(body, str) else body
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "mooncake-metadata/1"
    protocol_version = "HTTP/1.1"  # keep-alive: engines reuse one connection

    @property
    def store(self) -> MetadataStore:
        return self.server.store  # type: ignore[attr-defined]

    def log_message(self, fmt: str, *args) -> None:  # route to logging instead of stderr
        _log.debug("%s %s", self.address_string(), fmt % args)

    def _reply(self, code: int, body: bytes | str, content_type: str = "text/plain") -> None:
        send_reply(self, code, body, content_type)

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
        key = self._route()
        if key is None:
            return
        value = self.store.get(key)
        if value is None:
            self._reply(404, "metadata not found")
        else:
            self._reply(200, value, "application/json")

    def do_PUT(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > _MAX_BODY:
            self.close_connection = True
            self._reply(400, "bad Content-Length")
            return
        body = self.rfile.read(length)
        key = self._route()
        if key is None:
            return
        code, message = self.store.put(key, body)
        self._reply(code, message)

    def do_DELETE(self) -> None:
        key = self._route()
        if key is None:
            return
        if self.store.delete(key):
            self._reply(200, "metadata deleted")
        else:
            self._reply(404, "metadata not found")

    def _not_allowed(self) -> None:
        self._reply(405, "method not allowed")

    do_POST = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed


class _Server(http.server.ThreadingHTTPServer):
    """Tracks open connections so stopping the server also ends its keep-alive connections (clients then
    reconnect to whatever serves the port next, as they would after a process restart)."""

    daemon_threads = True

    def __init__(self, *args, **kwargs):
        self._connections: set = set()
        self._connections_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def get_request(self):
        conn, addr = super().get_request()
        with self._connections_lock:
            self._connections.add(conn)
        return conn, addr

    def shutdown_request(self, request) -> None:
        with self._connections_lock:
            self._connections.discard(request)
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
    Usable as a context manager.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 8080, store: MetadataStore | None = None) -> None:
        self.store = store or MetadataStore()
        self._httpd = _Server((host, port), _Handler)
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
