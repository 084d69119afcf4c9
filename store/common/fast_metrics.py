"""Counters and histograms for hot paths, exported through prometheus-client at scrape time.

prometheus-client's own metrics take a lock per update (about a microsecond each, several per RPC). These
keep per-thread cells instead: an update is a dict update in the calling thread's own cells (no lock, never
lost), and a scrape sums every thread's cells. Cells of threads that ended are folded into a common base at
the next scrape, so a server that starts a thread per connection does not grow without bound.

``FastCounter(name, doc, labelnames, registry)`` and ``FastHistogram(name, doc, labelnames, buckets, registry)``
have prometheus-client's shape where the master uses it: ``.labels(**kw)`` gives a child with ``.inc(n)`` /
``.observe(seconds)``, and ``.collect()`` yields metric families (``<name>_total`` samples; ``_bucket``,
``_count``, ``_sum`` for histograms), so /metrics output is what prometheus-client would write.

Threading: updates from any thread; ``collect`` from any thread (it reads other threads' dicts with single
C-level copies, which the interpreter does not interleave with their updates).
"""

from __future__ import annotations

import bisect
import threading

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class _Cells:
    """Per-thread dicts key -> value, summed on demand."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._threads: list[tuple[threading.Thread, dict]] = []
        self._base: dict = {}

    def mine(self) -> dict:
        try:
            return self._local.cells
        except AttributeError:
            cells = self._local.cells = {}
            with self._lock:
                self._threads.append((threading.current_thread(), cells))
            return cells

    def totals(self, merge) -> dict:
        """Every thread's cells combined with `merge(total, value) -> total` (values of one key)."""
        with self._lock:
            live = []
            for t, cells in self._threads:
                if t.is_alive():
                    live.append((t, cells))
                else:
                    for k, v in list(cells.items()):
                        self._base[k] = merge(self._base.get(k), v)
            self._threads = live
            out = dict(self._base)
            snapshots = [list(cells.items()) for _, cells in live]
        for items in snapshots:
            for k, v in items:
                out[k] = merge(out.get(k), v)
        return out


def _add(total, v):
    return v if total is None else total + v


class _CounterChild:
    __slots__ = ("_cells", "_key")

    def __init__(self, cells: _Cells, key: tuple) -> None:
        self._cells, self._key = cells, key

    def inc(self, n: float = 1) -> None:
        cells = self._cells.mine()
        cells[self._key] = cells.get(self._key, 0) + n


class FastCounter:
    def __init__(self, name: str, doc: str, labelnames=(), registry=None) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self._cells = _Cells()
        self._children: dict[tuple, _CounterChild] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, **kw) -> _CounterChild:
        key = tuple(str(kw[n]) for n in self.labelnames)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, _CounterChild(self._cells, key))
        return child

    def inc(self, n: float = 1) -> None:
        """For a counter without labels."""
        self.labels().inc(n)

    def describe(self):
        return [CounterMetricFamily(self.name, self.doc, labels=self.labelnames)]

    def collect(self):
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for key, v in sorted(self._cells.totals(_add).items()):
            fam.add_metric(list(key), v)
        yield fam


class _HistogramChild:
    __slots__ = ("_cells", "_key", "_bounds")

    def __init__(self, cells: _Cells, key: tuple, bounds: list) -> None:
        self._cells, self._key, self._bounds = cells, key, bounds

    def observe(self, v: float) -> None:
        cells = self._cells.mine()
        cell = cells.get(self._key)
        if cell is None:
            cell = cells[self._key] = [0.0] + [0] * (len(self._bounds) + 1)  # sum, then a count per bucket
        cell[0] += v
        cell[1 + bisect.bisect_left(self._bounds, v)] += 1


def _add_cells(total, v):
    return list(v) if total is None else [a + b for a, b in zip(total, v)]


class FastHistogram:
    def __init__(self, name: str, doc: str, labelnames=(), buckets=(), registry=None) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self._bounds = sorted(float(b) for b in buckets)
        self._cells = _Cells()
        self._children: dict[tuple, _HistogramChild] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, **kw) -> _HistogramChild:
        key = tuple(str(kw[n]) for n in self.labelnames)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, _HistogramChild(self._cells, key, self._bounds))
        return child

    def describe(self):
        return [HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)]

    def collect(self):
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        edges = [floatToGoString(b) for b in self._bounds] + ["+Inf"]
        for key, cell in sorted(self._cells.totals(_add_cells).items()):
            running, buckets = 0, []
            for edge, n in zip(edges, cell[1:]):
                running += n
                buckets.append((edge, running))
            fam.add_metric(list(key), buckets, cell[0])
        yield fam
