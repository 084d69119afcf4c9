"""The coordination backends of master HA: etcd (v3 JSON gateway over HTTP) and Redis, behind one small
interface the masters (election, view, op log) and the clients (leader discovery) share.

Keys (``<cluster>`` is --cluster_id):
  ``mooncake-store/<cluster>/master_view``     JSON {"address": "host:port", "view": N}, bound to the leader's
                                               lease (etcd) / TTL (Redis): gone soon after the leader is.
  ``mooncake-store/<cluster>/oplog/<lsn:020d>`` one batch of op records (JSON list; durable.py's records, the
                                               key names the batch's first op number); written only by the
                                               leader whose view key still exists (a fenced write).
View numbers: etcd's create revision of the view key; Redis: INCR of ``.../view_counter``. Both only grow.

Errors: every call raises ``BackendError`` when no endpoint answers; a lost election or a fenced write is a
False/None result, not an exception. Thread-safe (each call is one HTTP request / one Redis command or script).
"""

from __future__ import annotations

import base64
import http.client
import json
import threading

_PREFIX = "mooncake-store"


class BackendError(OSError):
    """No endpoint of the backend answered, or it answered with an error."""


def parse_endpoints(connstring: str) -> list[str]:
    """'h1:2379;h2:2379' (also ',' separated, optional http:// or etcd:// / redis:// prefix) -> ['h1:2379', ...]."""
    if not isinstance(connstring, str):
        raise TypeError(f"connstring must be str, got {type(connstring).__name__}")
    s = connstring.strip()
    for scheme in ("etcd://", "redis://", "http://"):
        if s.startswith(scheme):
            s = s[len(scheme):]
    out = [e.strip().removeprefix("http://") for e in s.replace(",", ";").split(";") if e.strip()]
    if not out:
        raise ValueError(f"no endpoint in {connstring!r}")
    return out


def keys(cluster_id: str) -> tuple[str, str]:
    base = f"{_PREFIX}/{cluster_id}"
    return f"{base}/master_view", f"{base}/oplog/"


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s)


class EtcdBackend:
    """etcd v3 over its JSON gateway; requests go to the endpoint that answered last, then the others, over a
    kept-alive HTTP connection per thread and endpoint (a log write costs one round trip, not a TCP setup)."""

    kind = "etcd"

    def __init__(self, endpoints: list[str], cluster_id: str, timeout: float = 2.0) -> None:
        self.endpoints = list(endpoints)
        self.view_key, self.log_prefix = keys(cluster_id)
        self.timeout = timeout
        self._good = 0
        self._lease = "0"
        self._view_rev = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def _request(self, endpoint: str, path: str, data: bytes) -> bytes:
        conns = self._local.__dict__.setdefault("conns", {})
        for attempt in (0, 1):  # a kept-alive connection the server closed meanwhile: once more on a new one
            conn = conns.get(endpoint)
            if conn is None:
                host, _, port = endpoint.rpartition(":")
                conn = conns[endpoint] = http.client.HTTPConnection(host, int(port), timeout=self.timeout)
            try:
                conn.request("POST", path, data, {"Content-Type": "application/json"})
                r = conn.getresponse()
                body = r.read()
                if r.status != 200:
                    raise BackendError(f"etcd {path}: HTTP {r.status}: {body[:200]!r}")
                if r.will_close:
                    conn.close()
                    del conns[endpoint]
                return body
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conns.pop(endpoint, None)
                if attempt or isinstance(e, (ConnectionRefusedError, TimeoutError)):
                    raise
        raise AssertionError("unreachable")

    def _post(self, path: str, body: dict, timeout: float | None = None) -> dict:
        data = json.dumps(body).encode()
        last = None
        n = len(self.endpoints)
        for i in range(n):
            idx = (self._good + i) % n
            try:
                out = json.loads(self._request(self.endpoints[idx], path, data).splitlines()[0] or b"{}")
            except (OSError, ValueError, IndexError, http.client.HTTPException) as e:
                last = e
                continue
            self._good = idx
            if "error" in out and "result" not in out:
                raise BackendError(f"etcd {path}: {out['error']}")
            return out.get("result", out) if path == "/v3/lease/keepalive" else out
        raise BackendError(f"etcd unreachable ({', '.join(self.endpoints)}): {last}")

    # -- leader side ------------------------------------------------------------------------------------------
    def campaign(self, address: str, ttl: float) -> int | None:
        """Becomes leader if nobody is: a lease of `ttl` s and the view key created on it. Returns the view
        number, or None (someone leads)."""
        lease = self._post("/v3/lease/grant", {"TTL": str(max(1, int(round(ttl))))}).get("ID")
        if not lease:
            raise BackendError("etcd granted no lease")
        value = json.dumps({"address": address})
        txn = {"compare": [{"key": _b64(self.view_key), "target": "CREATE", "result": "EQUAL",
                            "create_revision": "0"}],
               "success": [{"request_put": {"key": _b64(self.view_key), "value": _b64(value), "lease": lease}}]}
        out = self._post("/v3/kv/txn", txn)
        if not out.get("succeeded"):
            self._post("/v3/lease/revoke", {"ID": lease})
            return None
        rev = int(out["header"]["revision"])
        with self._lock:
            self._lease, self._view_rev = lease, rev
        return rev

    def renew(self) -> bool:
        """Keeps the lease alive; False when it is gone (expired: this master is no longer the leader)."""
        out = self._post("/v3/lease/keepalive", {"ID": self._lease})
        return int(out.get("TTL", "0")) > 0

    def resign(self) -> None:
        if self._lease != "0":
            try:
                self._post("/v3/lease/revoke", {"ID": self._lease})
            except BackendError:
                pass
            self._lease = "0"

    def append(self, first_lsn: int, records: list[dict]) -> bool:
        """Writes one batch of op records, only while this master's view key exists (fenced)."""
        key = f"{self.log_prefix}{first_lsn:020d}"
        txn = {"compare": [{"key": _b64(self.view_key), "target": "CREATE", "result": "EQUAL",
                            "create_revision": str(self._view_rev)}],
               "success": [{"request_put": {"key": _b64(key), "value": _b64(json.dumps(records))}}]}
        return bool(self._post("/v3/kv/txn", txn).get("succeeded"))

    # -- everyone ---------------------------------------------------------------------------------------------
    def read_view(self) -> tuple[str, int] | None:
        """(leader address, view number), or None while there is no leader."""
        out = self._post("/v3/kv/range", {"key": _b64(self.view_key)})
        kvs = out.get("kvs") or []
        if not kvs:
            return None
        kv = kvs[0]
        return json.loads(_unb64(kv["value"]))["address"], int(kv["create_revision"])

    def read_log(self, from_lsn: int, limit: int = 256) -> list[list[dict]]:
        """The batches whose key is at or after `from_lsn`, in order (at most `limit`)."""
        start = f"{self.log_prefix}{max(0, from_lsn):020d}"
        end = self.log_prefix[:-1] + chr(ord(self.log_prefix[-1]) + 1)
        out = self._post("/v3/kv/range", {"key": _b64(start), "range_end": _b64(end), "limit": str(limit),
                                          "sort_order": "ASCEND", "sort_target": "KEY"})
        return [json.loads(_unb64(kv["value"])) for kv in out.get("kvs") or []]


_REDIS_CAMPAIGN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local v = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], cjson.encode({address=ARGV[1], view=v}), 'PX', ARGV[2])
return v
"""
_REDIS_RENEW = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if cjson.decode(cur)['view'] ~= tonumber(ARGV[1]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
_REDIS_APPEND = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if cjson.decode(cur)['view'] ~= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""


class RedisBackend:
    """Redis: the view key with a TTL (PX), renewal and fenced appends as Lua scripts (atomic); the op log is
    a sorted set scored by each batch's first op number."""

    kind = "redis"

    def __init__(self, endpoints: list[str], cluster_id: str, timeout: float = 2.0) -> None:
        import redis

        host, _, port = endpoints[0].rpartition(":")
        self._r = redis.Redis(host=host or "127.0.0.1", port=int(port), socket_timeout=timeout,
                              socket_connect_timeout=timeout)
        self._errors = (redis.RedisError, OSError)
        self.view_key, prefix = keys(cluster_id)
        self.log_key = prefix + "batches"
        self.counter_key = self.view_key + "_counter"
        self._ttl_ms = 5000
        self._view = 0

    def _do(self, fn, *a):
        try:
            return fn(*a)
        except self._errors as e:
            raise BackendError(f"redis: {e}") from None

    def campaign(self, address: str, ttl: float) -> int | None:
        self._ttl_ms = int(ttl * 1000)
        v = int(self._do(self._r.eval, _REDIS_CAMPAIGN, 2, self.view_key, self.counter_key, address, self._ttl_ms))
        if not v:
            return None
        self._view = v
        return v

    def renew(self) -> bool:
        return bool(self._do(self._r.eval, _REDIS_RENEW, 1, self.view_key, self._view, self._ttl_ms))

    def resign(self) -> None:
        try:
            cur = self._r.get(self.view_key)
            if cur and json.loads(cur).get("view") == self._view:
                self._r.delete(self.view_key)
        except self._errors:
            pass

    def append(self, first_lsn: int, records: list[dict]) -> bool:
        member = f"{first_lsn:020d}" + json.dumps(records)
        return bool(self._do(self._r.eval, _REDIS_APPEND, 2, self.view_key, self.log_key, self._view, first_lsn,
                             member))

    def read_view(self) -> tuple[str, int] | None:
        cur = self._do(self._r.get, self.view_key)
        if not cur:
            return None
        d = json.loads(cur)
        return d["address"], int(d["view"])

    def read_log(self, from_lsn: int, limit: int = 256) -> list[list[dict]]:
        rows = self._do(self._r.zrangebyscore, self.log_key, max(0, from_lsn), "+inf", 0, limit)
        return [json.loads(m[20:]) for m in rows]


def backend(kind: str, connstring: str, cluster_id: str):
    """The backend named `kind` ("etcd" or "redis") on the endpoints of `connstring`."""
    endpoints = parse_endpoints(connstring)
    if kind == "etcd":
        return EtcdBackend(endpoints, cluster_id)
    if kind == "redis":
        return RedisBackend(endpoints, cluster_id)
    raise ValueError(f"unknown HA backend {kind!r} (etcd or redis)")


def backend_of_url(url: str, cluster_id: str):
    """The backend of a client's ``master_server_address`` "etcd://h1:2379;h2:2379" or "redis://h:p"."""
    if url.startswith("etcd://"):
        return backend("etcd", url, cluster_id)
    if url.startswith("redis://"):
        return backend("redis", url, cluster_id)
    raise ValueError(f"not an HA master address: {url!r}")
