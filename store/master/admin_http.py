"""Admin HTTP server of the master (--metrics_port, default 9003), after Mooncake's master_admin_service.

  GET /metrics          Prometheus text exposition (prometheus-client)
  GET /metrics/summary  one-screen human summary
  GET /health           JSON {"status": "ok", "role": "leader", "ready": true, "view_version": N}
  GET /status           JSON: object counts, pool usage and every segment (usage, free blocks, fragmentation)
  GET /get_all_segments the names of the mounted segments, one per line (text, as Mooncake's: an empty body
                        while none is mounted, which SGLang's check_server waits out)
  GET /query_key?key=K  JSON {"success": true, "data": {...replicas...}}; 404 {"success": false,
                        "error_code": -704} when absent (read-only: no lease, no LRU touch)
Anything else: 404; methods other than GET: 405; a request with a body: 413 (both close the connection).
Connections are bounded as for the metadata server (http_metadata_server.BoundedHTTPServer), at most
MAX_CONNECTIONS of them.

Threading: one thread per connection (ThreadingHTTPServer); every handler reads the service through its
thread-safe methods. ``start`` raises OSError when the port cannot be bound.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse

from mooncake.http_metadata_server import BoundedHandler, BoundedHTTPServer, send_reply
from mooncake.store.master.errors import ErrorCode

_log = logging.getLogger("mooncake.store.master.admin")
MAX_CONNECTIONS = 256


def summary_text(s: dict) -> str:
    gib = 1 << 30
    return (f"objects {s['objects']} (processing {s['pending_puts']}), "
            f"used {s['used_bytes'] / gib:.3f} / {s['capacity_bytes'] / gib:.3f} GiB ({100 * s['usage']:.1f} %), "
            f"held {s['held_bytes']} B, segments {len(s['segments'])}, clients {s['clients']}, "
            f"leases {s['leases']}, pins hard {s['hard_pinned']} soft {s['soft_pinned']}, tasks {s['tasks']}\n")


class _Handler(BoundedHandler):
    server_version = "mooncake-master-admin/1"

    def log_message(self, fmt: str, *args) -> None:
        _log.debug("%s %s", self.address_string(), fmt % args)

    def _reply(self, code: int, body, content_type: str = "application/json") -> None:
        if isinstance(body, (dict, list)):
            body = json.dumps(body, indent=1)
        send_reply(self, code, body, content_type)

    def do_GET(self) -> None:
        if self.refuse_body():
            return
        svc = self.server.service  # type: ignore[attr-defined]
        url = urllib.parse.urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        if path == "/metrics":
            self._reply(200, svc.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/metrics/summary":
            self._reply(200, summary_text(svc.snapshot()), "text/plain; charset=utf-8")
        elif path == "/health":
            self._reply(200, {"status": "ok", "role": "leader", "ready": True, "view_version": svc.view_version})
        elif path == "/status":
            self._reply(200, svc.snapshot())
        elif path == "/get_all_segments":
            names = sorted({s["name"] for s in svc.snapshot()["segments"]})
            self._reply(200, "".join(n + "\n" for n in names), "text/plain; charset=utf-8")
        elif path == "/query_key":
            key = urllib.parse.parse_qs(url.query).get("key", [""])[0]
            if not key:
                self._reply(400, {"success": False, "error_code": int(ErrorCode.INVALID_PARAMS),
                                  "error": "missing ?key="})
                return
            code, info = svc.describe_key(key)
            if code == ErrorCode.OK:
                self._reply(200, {"success": True, "data": info})
            else:
                self._reply(404, {"success": False, "error_code": int(code), "error": ErrorCode(code).name})
        else:
            self._reply(404, {"success": False, "error": f"no such endpoint: {url.path}"})

    def _not_allowed(self) -> None:
        self.close_connection = True  # its body (if any) is not read
        self._reply(405, {"success": False, "error": "method not allowed"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed


class AdminHttpServer:
    def __init__(self, service, host: str = "0.0.0.0", port: int = 9003) -> None:
        self._httpd = BoundedHTTPServer((host, port), _Handler, max_connections=MAX_CONNECTIONS)  # binds now
        self._httpd.service = service  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> "AdminHttpServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="master-admin-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()
        self._httpd.close_connections()
