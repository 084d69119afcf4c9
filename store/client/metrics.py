"""Prometheus metrics of one store client (``setup(..., enable_client_http_server=True)``).

``ClientMetrics.instrument(store)`` wraps the data-path methods of one MooncakeDistributedStore *instance*
(put/get and their batch, zero-copy and upsert forms): each call is timed and its result counted; nothing is
changed for stores without metrics. ``uninstrument`` removes the wrappers. Mooncake's metric names are kept:

  mooncake_transfer_write_bytes                 bytes of successful puts (untyped counter, as Mooncake's)
  mooncake_transfer_read_bytes                  bytes of successful gets
  mooncake_transfer_put_latency                 single put latency, microseconds (histogram)
  mooncake_transfer_get_latency                 single get latency, microseconds
  mooncake_transfer_batch_put_latency           batch put latency, microseconds
  mooncake_transfer_batch_get_latency           batch get latency, microseconds
  mooncake_client_requests_total{op}            objects asked for, per API method (a batch counts each key)
  mooncake_client_request_failures_total{op}    of those, failed (negative code, empty result)
  mooncake_client_get_misses_total              gets of keys the store did not have (OBJECT_NOT_FOUND / empty)
  mooncake_client_segment_bytes                 bytes this client contributes to the pool
  mooncake_client_cached_descriptors            replica descriptors cached by this client
  mooncake_te_*                                 its Transfer Engine (mooncake.te_metrics)

Threading: the wrappers and collect() run on the caller's / the HTTP server's threads; prometheus_client
metrics are thread-safe and the byte counters take their own lock.
"""

from __future__ import annotations

import functools
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, UnknownMetricFamily

from mooncake.te_metrics import EngineCollector

# Mooncake's client latency buckets (microseconds).
LATENCY_BUCKETS_US = (125, 150, 200, 250, 300, 400, 500, 750, 1000, 1500, 2000, 3000, 5000, 7000, 15000, 20000,
                      50000, 100000, 200000, 500000, 1000000)
_NOT_FOUND = -704


def _nbytes(v) -> int:
    try:
        return memoryview(v).nbytes
    except TypeError:
        return 0


def _arg(a: tuple, k: dict, i: int, name: str):
    return a[i] if len(a) > i else k.get(name)


def _ints(results) -> tuple[int, int, int, int]:
    """(ok, failed, bytes read, misses) of per-key int results (bytes read > 0, or a negative code)."""
    ok = sum(1 for r in results if isinstance(r, int) and r >= 0)
    miss = sum(1 for r in results if r == _NOT_FOUND)
    return ok, len(results) - ok, sum(r for r in results if isinstance(r, int) and r > 0), miss


def _put_one(size_of):
    def count(a, k, r):
        return (1, 0, size_of(a, k), 0) if r == 0 else (0, 1, 0, 0)
    return count


def _put_batch(a, k, r):
    values = _arg(a, k, 1, "values") or []
    return (len(values), 0, sum(_nbytes(v) for v in values), 0) if r == 0 else (0, len(values), 0, 0)


def _put_from_batch(sizes_at: int, sizes_name: str, multi: bool):
    def count(a, k, r):
        sizes = _arg(a, k, sizes_at, sizes_name) or []
        if not isinstance(r, list):
            return 0, len(sizes), 0, 0
        ok = [i for i, x in enumerate(r) if x == 0 and i < len(sizes)]
        n = sum(sum(sizes[i]) if multi else sizes[i] for i in ok)
        return len(ok), len(r) - len(ok), n, 0
    return count


def _get_bytes(a, k, r):
    n = _nbytes(r) if r is not None else 0
    return (1, 0, n, 0) if n else (0, 1, 0, 1)


def _get_batch(a, k, r):
    sizes = [_nbytes(x) if x is not None else 0 for x in (r or [])]
    ok = sum(1 for n in sizes if n)
    return ok, len(sizes) - ok, sum(sizes), len(sizes) - ok


def _get_buffer(a, k, r):
    return (1, 0, r.size(), 0) if r is not None else (0, 1, 0, 1)


def _batch_get_buffer(a, k, r):
    got = [x for x in (r or []) if x is not None]
    return len(got), len(r or []) - len(got), sum(x.size() for x in got), len(r or []) - len(got)


def _get_into(a, k, r):
    return _ints([r])


def _batch_ints(a, k, r):
    return _ints(r if isinstance(r, list) else [])


# method: (is_put, is_batch, counter(args, kwargs, result) -> (ok, failed, bytes, misses))
_OPS = {
    "put": (True, False, _put_one(lambda a, k: _nbytes(_arg(a, k, 1, "value")))),
    "upsert": (True, False, _put_one(lambda a, k: _nbytes(_arg(a, k, 1, "value")))),
    "put_parts": (True, False, _put_one(lambda a, k: sum(_nbytes(p) for p in a[1:]))),
    "upsert_parts": (True, False, _put_one(lambda a, k: sum(_nbytes(p) for p in a[1:]))),
    "put_from": (True, False, _put_one(lambda a, k: _arg(a, k, 2, "size") or 0)),
    "upsert_from": (True, False, _put_one(lambda a, k: _arg(a, k, 2, "size") or 0)),
    "put_from_with_metadata": (True, False, _put_one(lambda a, k: _arg(a, k, 3, "size") or 0)),
    "put_batch": (True, True, _put_batch),
    "upsert_batch": (True, True, _put_batch),
    "batch_put_from": (True, True, _put_from_batch(2, "sizes", False)),
    "batch_upsert_from": (True, True, _put_from_batch(2, "sizes", False)),
    "batch_put_from_multi_buffers": (True, True, _put_from_batch(2, "all_sizes", True)),
    "get": (False, False, _get_bytes),
    "get_buffer": (False, False, _get_buffer),
    "get_into": (False, False, _get_into),
    "get_batch": (False, True, _get_batch),
    "batch_get_buffer": (False, True, _batch_get_buffer),
    "batch_get_into": (False, True, _batch_ints),
    "batch_get_into_multi_buffers": (False, True, _batch_ints),
}


class ClientMetrics:
    """The metrics of one store client, in a private registry (``exposition()`` renders it)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._bytes = {"read": 0, "write": 0}
        self.requests = Counter("mooncake_client_requests", "Objects asked for per API method", ["op"], registry=r)
        self.failures = Counter("mooncake_client_request_failures", "Objects that failed per API method", ["op"],
                                registry=r)
        self.misses = Counter("mooncake_client_get_misses", "Gets of keys the store did not have", registry=r)
        self.latency = {(put, batch): Histogram(
            f"mooncake_transfer_{'batch_' if batch else ''}{'put' if put else 'get'}_latency",
            f"{'Batch ' if batch else ''}{'Put' if put else 'Get'} latency (us)", buckets=LATENCY_BUCKETS_US,
            registry=r) for put in (True, False) for batch in (True, False)}
        r.register(_BytesCollector(self))
        self._store = None
        self._wrapped: list[str] = []

    def instrument(self, store) -> None:
        """Wraps `store`'s data-path methods (instance attributes; the class is untouched). Once per metrics."""
        if self._store is not None:
            raise RuntimeError("ClientMetrics already instruments a store")
        self._store = store
        self.registry.register(_StoreCollector(store))
        self.registry.register(EngineCollector(lambda: getattr(store, "_engine", None)))
        for name, (put, batch, count) in _OPS.items():
            method = getattr(store, name, None)
            if method is None:
                continue
            setattr(store, name, self._wrap(name, method, put, batch, count))
            self._wrapped.append(name)

    def uninstrument(self) -> None:
        store, self._store = self._store, None
        for name in self._wrapped:
            store.__dict__.pop(name, None)
        self._wrapped = []

    def _wrap(self, name, method, put: bool, batch: bool, count):
        latency = self.latency[(put, batch)]
        requests, failures = self.requests.labels(op=name), self.failures.labels(op=name)
        kind = "write" if put else "read"

        @functools.wraps(method)
        def call(*a, **k):
            t0 = time.perf_counter()
            r = method(*a, **k)
            latency.observe((time.perf_counter() - t0) * 1e6)
            try:
                ok, failed, n, miss = count(a, k, r)
            except (TypeError, ValueError, AttributeError):  # a call the method itself refused
                return r
            requests.inc(ok + failed)
            if failed:
                failures.inc(failed)
            if miss:
                self.misses.inc(miss)
            if n:
                with self._lock:
                    self._bytes[kind] += n
            return r
        return call

    def bytes(self, kind: str) -> int:
        with self._lock:
            return self._bytes[kind]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _BytesCollector:
    def __init__(self, metrics: ClientMetrics) -> None:
        self._m = metrics

    def describe(self):
        return []

    def collect(self):
        for kind, doc in (("read", "Total bytes read"), ("write", "Total bytes written")):
            m = UnknownMetricFamily(f"mooncake_transfer_{kind}_bytes", doc)
            m.add_metric([], self._m.bytes(kind))
            yield m


class _StoreCollector:
    def __init__(self, store) -> None:
        self._store = store

    def describe(self):
        return []

    def collect(self):
        seg = GaugeMetricFamily("mooncake_client_segment_bytes", "Bytes this client contributes to the pool")
        seg.add_metric([], getattr(self._store, "_global", (0, 0))[1])
        cached = GaugeMetricFamily("mooncake_client_cached_descriptors", "Replica descriptors cached")
        cached.add_metric([], len(getattr(self._store, "_cache", ())))
        yield seg
        yield cached
