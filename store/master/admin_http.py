"""Admin HTTP server of the master (--metrics_port, default 9003), after Mooncake's master_admin_service.

  GET /metrics          Prometheus text exposition (prometheus-client)
  GET /metrics/summary  one-screen human summary
  GET /health           JSON {"status": "ok", "role": R, "ready": true, "view_version": N, ...}: R is "single"
                        (no HA), "leader" or "standby"; /role, /ha_status, /leader: parts of it (ha_document)
  GET /status           a live HTML page for a browser (Accept: text/html), refreshing itself from
                        /status.json every 2 s (?refresh=SECONDS); any other client gets the JSON
  GET /status.json      JSON: object counts, pool usage, every segment (usage, free blocks, fragmentation), the
                        clients alive, counters (operations, failures, evictions, hit/miss), HA role
                        ("single": no HA yet) and the master's recent WARNING/ERROR log lines
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

import collections
import json
import logging
import threading
import time
import urllib.parse

from mooncake.http_metadata_server import BoundedHandler, BoundedHTTPServer, send_reply
from mooncake.store.common.errors import ErrorCode

_log = logging.getLogger("mooncake.store.master.admin")
MAX_CONNECTIONS = 256
RECENT_ERRORS = 50  # WARNING/ERROR lines of the master's loggers kept for the status page
_GET_OPS = ("get_replica_list",)  # lookups whose OBJECT_NOT_FOUND answers are misses


class RecentErrors(logging.Handler):
    """Keeps the last `n` WARNING+ records of the logger it is attached to (thread-safe: logging's lock)."""

    def __init__(self, n: int = RECENT_ERRORS) -> None:
        super().__init__(logging.WARNING)
        self._records: collections.deque = collections.deque(maxlen=n)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._records.append({"time": record.created, "level": record.levelname, "logger": record.name,
                                  "message": record.getMessage()[:500]})
        except Exception:  # noqa: BLE001  (a bad log call must not break the master)
            self.handleError(record)

    def recent(self) -> list:
        return list(self._records)[::-1]


def _clients(svc, segments: list) -> list:
    """The clients that mounted segments or are alive, with liveness, from the service's own accessors."""
    try:
        with svc.lock:
            alive = set(svc.clients.alive())
    except AttributeError:  # a service without a client registry: liveness unknown
        alive = None
    owners: dict = {}
    for seg in segments:
        owners.setdefault(seg.get("client_id", ""), []).append(seg["name"])
    ids = sorted(set(owners) | (alive or set()))
    return [{"client_id": c, "alive": None if alive is None else c in alive, "segments": sorted(owners.get(c, []))}
            for c in ids if c]


def status_document(svc, errors: RecentErrors | None) -> dict:
    """The JSON of /status.json: snapshot() plus clients, counters, hit/miss, HA role and recent errors."""
    doc = svc.snapshot()
    counters = svc.metrics.counter_values()
    gets = sum(counters["requests"].get(op, 0) for op in _GET_OPS)
    misses = sum(v for k, v in counters["failures"].items()
                 if k.split(" ")[0] in _GET_OPS and k.split(" ")[-1].startswith("OBJECT_NOT_FOUND"))
    doc.update({
        "role": getattr(svc, "role", "single"), "time": time.time(), "clients_detail": _clients(svc, doc["segments"]),
        "counters": counters, "gets": gets, "hits": gets - misses, "misses": misses,
        "evicted_objects": sum(counters["evicted_objects"].values()),
        "evicted_bytes": sum(counters["evicted_bytes"].values()),
        "recent_errors": errors.recent() if errors is not None else [],
    })
    return doc


def ha_document(svc, path: str) -> dict:
    """/health, /role, /ha_status, /leader: the master's role (leader, standby, single), view version, and
    what its durability/HA parts report (``svc.status_sources``: log lag, last snapshot, the leader's
    address)."""
    doc = {"status": "ok", "role": getattr(svc, "role", "leader"), "view_version": svc.view_version}
    doc["ready"] = doc["role"] in ("leader", "single")
    for name, source in getattr(svc, "status_sources", {}).items():
        try:
            doc[name] = source()
        except Exception as e:  # noqa: BLE001  (a status page must not fail with its source)
            doc[name] = {"error": repr(e)}
    if path == "/role":
        return {"role": doc["role"], "view_version": doc["view_version"]}
    if path == "/leader":
        ha = doc.get("ha", {})
        return {"leader": ha.get("leader", ""), "view_version": ha.get("leader_view", doc["view_version"]),
                "is_leader": doc["role"] in ("leader", "single")}
    return doc


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
        elif path in ("/health", "/role", "/ha_status", "/leader"):
            self._reply(200, ha_document(svc, path))
        elif path == "/status" and "text/html" in self.headers.get("Accept", ""):
            query = urllib.parse.parse_qs(url.query)
            try:
                refresh = min(max(float(query.get("refresh", ["2"])[0]), 0.2), 3600.0)
            except ValueError:
                refresh = 2.0
            self._reply(200, STATUS_PAGE.replace("__REFRESH_MS__", str(int(refresh * 1000))),
                        "text/html; charset=utf-8")
        elif path in ("/status", "/status.json"):
            self._reply(200, status_document(svc, self.server.errors))  # type: ignore[attr-defined]
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
        self._errors = self._httpd.errors = RecentErrors()  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> "AdminHttpServer":
        logging.getLogger("mooncake.store.master").addHandler(self._errors)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="master-admin-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        logging.getLogger("mooncake.store.master").removeHandler(self._errors)
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()
        self._httpd.close_connections()


# The live status page: static HTML + script; every number comes from /status.json (fetched every
# __REFRESH_MS__ ms). Data is inserted with textContent only (names are never parsed as HTML).
STATUS_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Mooncake master</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f5f6f8;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:baseline}
header h1{font-size:18px;margin:0}.muted{color:#8a93a6}main{padding:16px 20px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:12px;margin-bottom:16px}
.card{background:#fff;border-radius:8px;padding:10px 14px;box-shadow:0 1px 2px #0002}
.card .v{font-size:24px;font-weight:600}.card .k{color:#5b6478;font-size:12px;text-transform:uppercase}
table{border-collapse:collapse;width:100%;background:#fff;margin-bottom:16px;box-shadow:0 1px 2px #0002}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid #e6e8ee}th{background:#eef0f4;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}h2{font-size:15px;margin:18px 0 6px}
.bar{background:#e6e8ee;border-radius:4px;height:10px;width:140px;display:inline-block;vertical-align:middle}
.bar i{display:block;height:10px;border-radius:4px;background:#3a7bd5}.bad{color:#c0392b}.ok{color:#1e8449}
#state.stale{color:#f39c12}
</style></head><body>
<header><h1>Mooncake master</h1><span>role <b id="role">-</b></span><span>view <b id="view">-</b></span>
<span id="state" class="muted">loading...</span></header>
<main>
<div class="cards">
<div class="card"><div class="k">keys</div><div class="v" id="keys">-</div></div>
<div class="card"><div class="k">puts in progress</div><div class="v" id="pending">-</div></div>
<div class="card"><div class="k">pool used</div><div class="v" id="used">-</div><div class="muted" id="cap"></div></div>
<div class="card"><div class="k">clients alive</div><div class="v" id="clients">-</div></div>
<div class="card"><div class="k">lookup hit rate</div><div class="v" id="hitrate">-</div><div class="muted" id="hits"></div></div>
<div class="card"><div class="k">evictions</div><div class="v" id="evictions">-</div><div class="muted" id="evbytes"></div></div>
<div class="card"><div class="k">leases</div><div class="v" id="leases">-</div></div>
<div class="card"><div class="k">pins hard / soft</div><div class="v" id="pins">-</div></div>
</div>
<h2>Segments</h2><table><thead><tr><th>segment</th><th>client</th><th>used</th><th>capacity</th><th>use</th>
<th>free blocks</th><th>fragmentation</th></tr></thead><tbody id="segments"></tbody></table>
<h2>Clients</h2><table><thead><tr><th>client</th><th>liveness</th><th>segments</th></tr></thead>
<tbody id="clientrows"></tbody></table>
<h2>Operations</h2><table><thead><tr><th>operation</th><th>total</th><th>per second</th></tr></thead>
<tbody id="ops"></tbody></table>
<h2>Recent errors</h2><table><thead><tr><th>time</th><th>level</th><th>message</th></tr></thead>
<tbody id="errors"></tbody></table>
</main>
<script>
"use strict";
const REFRESH_MS = __REFRESH_MS__;
let last = null;
function $(id) { return document.getElementById(id); }
function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + u[i];
}
function set(id, text) { $(id).textContent = text; }
function row(cells, classes) {
  const tr = document.createElement("tr");
  cells.forEach((c, i) => {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c;
    if (classes && classes[i]) td.className = classes[i];
    tr.appendChild(td);
  });
  return tr;
}
function bar(frac) {
  const b = document.createElement("span"); b.className = "bar";
  const i = document.createElement("i"); i.style.width = Math.min(100, Math.round(frac * 100)) + "%";
  b.appendChild(i); return b;
}
function fill(id, rows) { const t = $(id); t.replaceChildren(...rows); }
function render(s) {
  set("role", s.role); set("view", String(s.view_version));
  set("keys", String(s.objects)); set("pending", String(s.pending_puts));
  set("used", (100 * s.usage).toFixed(1) + " %");
  set("cap", bytes(s.used_bytes) + " of " + bytes(s.capacity_bytes));
  set("clients", String(s.clients));
  set("hitrate", s.gets ? (100 * s.hits / s.gets).toFixed(1) + " %" : "-");
  set("hits", s.hits + " hits, " + s.misses + " misses");
  set("evictions", String(s.evicted_objects)); set("evbytes", bytes(s.evicted_bytes));
  set("leases", String(s.leases)); set("pins", s.hard_pinned + " / " + s.soft_pinned);
  fill("segments", s.segments.map(g => row([g.name, g.client_id, bytes(g.used_bytes), bytes(g.size), bar(g.usage),
    String(g.free_blocks), (100 * g.fragmentation).toFixed(1) + " %"], [null, null, "n", "n", null, "n", "n"])));
  fill("clientrows", s.clients_detail.map(c => {
    const live = document.createElement("span");
    live.textContent = c.alive === null ? "unknown" : (c.alive ? "alive" : "expired");
    live.className = c.alive ? "ok" : "bad";
    return row([c.client_id, live, c.segments.join(", ")]);
  }));
  const dt = last ? (s.time - last.time) : 0;
  fill("ops", Object.entries(s.counters.requests).sort().map(([op, n]) => {
    const prev = last && last.counters.requests[op] || 0;
    return row([op, String(n), dt > 0 ? ((n - prev) / dt).toFixed(1) : "-"], [null, "n", "n"]);
  }));
  fill("errors", s.recent_errors.map(e => row([new Date(e.time * 1000).toLocaleTimeString(), e.level, e.message],
    [null, e.level === "ERROR" ? "bad" : null, null])));
  last = s;
}
async function tick() {
  try {
    const r = await fetch("/status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    $("state").className = "muted";
    set("state", "updated " + new Date().toLocaleTimeString() + ", every " + REFRESH_MS / 1000 + " s");
  } catch (e) {
    $("state").className = "stale";
    set("state", "master not answering (" + e.message + "); retrying");
  }
  setTimeout(tick, REFRESH_MS);
}
tick();
</script></body></html>
"""
