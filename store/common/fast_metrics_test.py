"""fast_metrics: exact totals under concurrent updates, ended threads folded in, and /metrics text the same as
prometheus-client's own metrics would give for the same updates."""

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from mooncake.store.common.fast_metrics import FastCounter, FastHistogram

BUCKETS = (50e-6, 100e-6, 400e-6, 1.6e-3, 0.1, 1.6)


def test_concurrent_increments_are_never_lost():
    c = FastCounter("t_requests", "doc", ["op"])
    child = c.labels(op="put")

    def work():
        for _ in range(20000):
            child.inc()
            c.labels(op="get").inc(2)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fam = next(c.collect())
    got = {s.labels["op"]: s.value for s in fam.samples if s.name.endswith("_total")}
    assert got == {"put": 160000, "get": 320000}


def test_cells_of_ended_threads_are_kept_and_folded():
    c = FastCounter("t_conn", "doc", ["op"])
    for i in range(50):  # a thread per connection, as the fast RPC server has
        t = threading.Thread(target=lambda: c.labels(op="x").inc(3))
        t.start()
        t.join()
    total = sum(s.value for s in next(c.collect()).samples if s.name.endswith("_total"))
    assert total == 150
    assert len(c._cells._threads) <= 1  # folded into the base at that scrape
    c.labels(op="x").inc()
    assert sum(s.value for s in next(c.collect()).samples if s.name.endswith("_total")) == 151


def test_exposition_matches_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fc = FastCounter("m_requests", "Requests", ["op"], registry=ours)
    pc = Counter("m_requests", "Requests", ["op"], registry=theirs)
    fh = FastHistogram("m_latency_seconds", "Latency", ["method"], buckets=BUCKETS, registry=ours)
    ph = Histogram("m_latency_seconds", "Latency", ["method"], buckets=BUCKETS, registry=theirs)
    for i, v in enumerate([10e-6, 50e-6, 60e-6, 5e-3, 0.1, 2.0, 1e-4]):
        for c in (fc, pc):
            c.labels(op=["put", "get"][i % 2]).inc(i + 1)
        for h in (fh, ph):
            h.labels(method=["Put", "Get"][i % 2]).observe(v)

    def lines(reg):  # prometheus-client adds _created samples; ours has none
        return sorted(x for x in generate_latest(reg).decode().splitlines() if "_created" not in x)

    assert lines(ours) == lines(theirs)
