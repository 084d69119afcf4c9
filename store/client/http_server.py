"""The store client's HTTP server (``setup(..., enable_client_http_server=True, client_http_port=N)``).

  GET /metrics          Prometheus text exposition of this client and its Transfer Engine (metrics.py)
  GET /health           JSON {"status": "ok"} while the client is set up and the master answers, else 503
Anything else: 404; other methods: 405. Connections are bounded as for the metadata server.

Threading: one thread per connection; handlers only read the metrics and call store.health_check().
``ClientHttpServer(...)`` binds at once and raises OSError when the port cannot be bound.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse

from mooncake.http_metadata_server import BoundedHandler, BoundedHTTPServer, send_reply

_log = logging.getLogger("mooncake.store.client.http")
MAX_CONNECTIONS = 64


class _Handler(BoundedHandler):
    server_version = "mooncake-client-http/1"

    def log_message(self, fmt: str, *args) -> None:
        _log.debug("%s %s", self.address_string(), fmt % args)

    def do_GET(self) -> None:
        if self.refuse_body():
            return
        path = urllib.parse.urlsplit(self.path).path.rstrip("/") or "/"
        if path == "/metrics":
            send_reply(self, 200, self.server.metrics.exposition(),  # type: ignore[attr-defined]
                       "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/health":
            code = self.server.store.health_check()  # type: ignore[attr-defined]
            send_reply(self, 200 if code == 0 else 503, json.dumps({"status": "ok" if code == 0 else "unhealthy",
                                                                    "code": code}), "application/json")
        else:
            send_reply(self, 404, json.dumps({"error": f"no such endpoint: {path}"}), "application/json")

    def _not_allowed(self) -> None:
        self.close_connection = True
        send_reply(self, 405, json.dumps({"error": "method not allowed"}), "application/json")

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed


class ClientHttpServer:
    def __init__(self, store, metrics, host: str = "0.0.0.0", port: int = 9300) -> None:
        self._httpd = BoundedHTTPServer((host, port), _Handler, max_connections=MAX_CONNECTIONS)
        self._httpd.store = store  # type: ignore[attr-defined]
        self._httpd.metrics = metrics  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> "ClientHttpServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="store-client-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()
        self._httpd.close_connections()
