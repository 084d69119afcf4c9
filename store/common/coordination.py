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
        self.sync_key = self.view_key + "_sync"
        self.present_prefix = self.view_key + "_present/"
        self._presence = ("", "")  # (lease, name) of announce
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
    def campaign(self, address: str, ttl: float, sync: str = "") -> int | None:
        """Becomes leader if nobody is: a lease of `ttl` s and the view key created on it (holding `address`
        and the standbys' stream address `sync`). Returns the view number, or None (someone leads)."""
        lease = self._post("/v3/lease/grant", {"TTL": str(max(1, int(round(ttl))))}).get("ID")
        if not lease:
            raise BackendError("etcd granted no lease")
        value = json.dumps({"address": address, "sync": sync})
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

    def _fenced_put(self, key: str, value: str) -> bool:
        txn = {"compare": [{"key": _b64(self.view_key), "target": "CREATE", "result": "EQUAL",
                            "create_revision": str(self._view_rev)}],
               "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}]}
        return bool(self._post("/v3/kv/txn", txn).get("succeeded"))

    def append(self, first_lsn: int, records: list[dict]) -> bool:
        """Writes one batch of op records, only while this master's view key exists (fenced)."""
        return self.append_encoded(first_lsn, json.dumps(records))

    def append_encoded(self, first_lsn: int, text: str) -> bool:
        """append of a batch already encoded as a JSON list."""
        return self._fenced_put(f"{self.log_prefix}{first_lsn:020d}", text)

    def compact_log(self, before_lsn: int) -> bool:
        """Deletes the batches whose first op number is below `before_lsn`; fenced like append."""
        end = f"{self.log_prefix}{max(0, before_lsn):020d}"
        txn = {"compare": [{"key": _b64(self.view_key), "target": "CREATE", "result": "EQUAL",
                            "create_revision": str(self._view_rev)}],
               "success": [{"request_delete_range": {"key": _b64(self.log_prefix + "0" * 20),
                                                     "range_end": _b64(end)}}]}
        return bool(self._post("/v3/kv/txn", txn).get("succeeded"))

    def log_start(self) -> int | None:
        """The first op number of the oldest batch in the log (None: the log is empty)."""
        end = self.log_prefix[:-1] + chr(ord(self.log_prefix[-1]) + 1)
        out = self._post("/v3/kv/range", {"key": _b64(self.log_prefix), "range_end": _b64(end), "limit": "1",
                                          "sort_order": "ASCEND", "sort_target": "KEY", "keys_only": True})
        kvs = out.get("kvs") or []
        return int(_unb64(kvs[0]["key"]).decode()[len(self.log_prefix):]) if kvs else None

    def announce(self, name: str, ttl: float) -> None:
        """Keeps key <view>_present/<name> alive on a lease of its own (`ttl` s): this process holds the
        memory that name stands for in the sync set. A new name replaces the previous one."""
        with self._lock:
            lease, old = self._presence
        if lease and old == name:
            out = self._post("/v3/lease/keepalive", {"ID": lease})
            if int(out.get("TTL", "0")) > 0:
                return
        if lease:
            try:
                self._post("/v3/lease/revoke", {"ID": lease})
            except BackendError:
                pass
        lease = self._post("/v3/lease/grant", {"TTL": str(max(1, int(round(ttl))))}).get("ID")
        if not lease:
            raise BackendError("etcd granted no lease")
        self._post("/v3/kv/put", {"key": _b64(self.present_prefix + name), "value": _b64("1"), "lease": lease})
        with self._lock:
            self._presence = (lease, name)

    def present(self) -> set[str]:
        """The names whose presence key lives (announce)."""
        end = self.present_prefix[:-1] + chr(ord(self.present_prefix[-1]) + 1)
        out = self._post("/v3/kv/range", {"key": _b64(self.present_prefix), "range_end": _b64(end),
                                          "keys_only": True})
        n = len(self.present_prefix)
        return {_unb64(kv["key"]).decode()[n:] for kv in out.get("kvs") or []}

    def write_sync_set(self, members: list[str]) -> bool:
        """Stores the standbys that hold every acknowledged op the log may lack (standby_sync.py); fenced."""
        return self._fenced_put(self.sync_key, json.dumps(members))

    def read_sync_set(self) -> list[str]:
        kvs = self._post("/v3/kv/range", {"key": _b64(self.sync_key)}).get("kvs") or []
        return list(json.loads(_unb64(kvs[0]["value"]))) if kvs else []

    # -- everyone ---------------------------------------------------------------------------------------------
    def read_view(self) -> tuple[str, int] | None:
        """(leader address, view number), or None while there is no leader."""
        info = self.view_info()
        return (info["address"], info["view"]) if info else None

    def view_info(self) -> dict | None:
        """{"address", "view", "sync"} of the leader, or None while there is none."""
        out = self._post("/v3/kv/range", {"key": _b64(self.view_key)})
        kvs = out.get("kvs") or []
        if not kvs:
            return None
        kv = kvs[0]
        value = json.loads(_unb64(kv["value"]))
        return {"address": value["address"], "view": int(kv["create_revision"]), "sync": value.get("sync", "")}

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
redis.call('SET', KEYS[1], cjson.encode({address=ARGV[1], view=v, sync=ARGV[3]}), 'PX', ARGV[2])
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
_REDIS_COMPACT = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if cjson.decode(cur)['view'] ~= tonumber(ARGV[1]) then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
return 1
"""
_REDIS_SET_FENCED = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if cjson.decode(cur)['view'] ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


class RedisBackend:
    """Redis: the view key with a TTL (PX), renewal and fenced appends as Lua scripts (atomic); the op log is
    a sorted set scored by each batch's first op number."""

    kind = "redis"

    def __init__(self, endpoints: list[str], cluster_id: str, timeout: float = 2.0) -> None:
        import redis

        if len(endpoints) != 1:
            # Independent Redis servers do not replicate each other: moving between them would lose the view key
            # and the log, and two leaders could hold views on different servers.
            raise ValueError(f"the redis HA backend takes exactly one endpoint (a replicated Redis behind one "
                             f"address, e.g. a Sentinel-managed address); got {len(endpoints)}: {endpoints}")
        host, _, port = endpoints[0].rpartition(":")
        self._r = redis.Redis(host=host or "127.0.0.1", port=int(port), socket_timeout=timeout,
                              socket_connect_timeout=timeout)
        self._errors = (redis.RedisError, OSError)
        self.view_key, prefix = keys(cluster_id)
        self.log_key = prefix + "batches"
        self.counter_key = self.view_key + "_counter"
        self.sync_key = self.view_key + "_sync"
        self.present_prefix = self.view_key + "_present/"
        self._present_name = ""
        self._ttl_ms = 5000
        self._view = 0

    def _do(self, fn, *a):
        try:
            return fn(*a)
        except self._errors as e:
            raise BackendError(f"redis: {e}") from None

    def campaign(self, address: str, ttl: float, sync: str = "") -> int | None:
        self._ttl_ms = int(ttl * 1000)
        v = int(self._do(self._r.eval, _REDIS_CAMPAIGN, 2, self.view_key, self.counter_key, address, self._ttl_ms,
                         sync))
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
        return self.append_encoded(first_lsn, json.dumps(records))

    def append_encoded(self, first_lsn: int, text: str) -> bool:
        member = f"{first_lsn:020d}" + text
        return bool(self._do(self._r.eval, _REDIS_APPEND, 2, self.view_key, self.log_key, self._view, first_lsn,
                             member))

    def announce(self, name: str, ttl: float) -> None:
        old = self._present_name
        if old and old != name:
            self._do(self._r.delete, self.present_prefix + old)
        self._do(self._r.set, self.present_prefix + name, "1", None, int(ttl * 1000))
        self._present_name = name

    def present(self) -> set[str]:
        n = len(self.present_prefix)
        return {k.decode()[n:] if isinstance(k, bytes) else k[n:]
                for k in self._do(self._r.keys, self.present_prefix + "*")}

    def compact_log(self, before_lsn: int) -> bool:
        return bool(self._do(self._r.eval, _REDIS_COMPACT, 2, self.view_key, self.log_key, self._view, before_lsn))

    def log_start(self) -> int | None:
        rows = self._do(self._r.zrange, self.log_key, 0, 0, False, True)
        return int(rows[0][1]) if rows else None

    def write_sync_set(self, members: list[str]) -> bool:
        return bool(self._do(self._r.eval, _REDIS_SET_FENCED, 2, self.view_key, self.sync_key, self._view,
                             json.dumps(members)))

    def read_sync_set(self) -> list[str]:
        cur = self._do(self._r.get, self.sync_key)
        return list(json.loads(cur)) if cur else []

    def read_view(self) -> tuple[str, int] | None:
        info = self.view_info()
        return (info["address"], info["view"]) if info else None

    def view_info(self) -> dict | None:
        cur = self._do(self._r.get, self.view_key)
        if not cur:
            return None
        d = json.loads(cur)
        return {"address": d["address"], "view": int(d["view"]), "sync": d.get("sync", "")}

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
