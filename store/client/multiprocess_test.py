"""A real master and two or three real store client processes (real Transfer Engine between them): data in
another client's segment, replicas surviving the writer's close, preferred segments, a writer killed in the
middle of a put, eviction under pressure with pins, concurrent writers and readers with verification."""

import threading
import time

import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.client.store_worker import pattern
from mooncake.store.client.testing import StoreWorker
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess, process_starter

KiB, MiB = 1 << 10, 1 << 20
FAST = ("--client_ttl=1", "--monitor_interval_ms=50", "--default_kv_lease_ttl=200")


@pytest.fixture
def cluster():
    yield from process_starter()


def test_cross_process_put_get_and_placement(cluster):
    # A 2 s read lease: on a loaded machine a batch read over a fresh Transfer Engine connection can take longer
    # than FAST's 200 ms, and a read whose lease ran out is (rightly) refused. Nothing here waits for a lease.
    m = cluster(MasterProcess, "--client_ttl=1", "--monitor_interval_ms=50", "--default_kv_lease_ttl=2000")
    a = cluster(StoreWorker, m.address)
    b = cluster(StoreWorker, m.address, env={"MC_STORE_FAST_RPC": "0"})  # b talks gRPC only
    value = pattern(300 * KiB, 7)
    cfg = {"preferred_segments": [b.hostname]}
    assert a.call("put", "k", value, config=cfg) == 0
    assert b.call("get", "k") == value
    assert a.call("get", "k") == value          # a reads b's segment through the Transfer Engine
    assert a.call("get", "k") == value          # again, from the descriptor cache
    assert b.call("get_size", "k") == len(value)
    assert a.call("batch_is_exist", ["k", "x"]) == [1, 0]
    assert a.call("put", "small", b"tiny", config={"preferred_segments": [b.hostname]}) == 0
    assert a.call("get_batch", ["small", "k", "x"]) == [b"tiny", value, b""]
    # The writer's own process cannot see remote memory directly: this one goes through b's segment too.
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, "4MB", "tcp", "", m.address) == 0  # no segment: pure client
    try:
        assert s.get("k") == value
        assert s.put("from-pure", b"p" * 5000) == 0
        assert b.call("get", "from-pure") == b"p" * 5000
    finally:
        s.close()


def test_replicas_survive_writer_close(cluster):
    m = cluster(MasterProcess, *FAST)
    a = cluster(StoreWorker, m.address)
    b = cluster(StoreWorker, m.address)
    c = cluster(StoreWorker, m.address)
    value = pattern(64 * KiB, 3)
    assert a.call("put", "rep", value, config={"replica_num": 3}) == 0
    assert len(c.call("batch_get_replica_desc", ["rep"])["rep"]) == 3
    assert a.call("put", "only-a", value, config={"preferred_segments": [a.hostname]}) == 0
    a.stop()                                    # unmounts a's segment
    assert b.call("get", "rep") == value        # two replicas left
    assert c.call("get", "rep") == value
    assert c.call("get", "only-a") == b""       # lived only in a's segment
    b.kill()                                    # b dies without unmounting: the master expires it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(c.call("get_replica_desc", "rep")) > 1:
        time.sleep(0.2)
    assert c.call("get", "rep") == value


def test_killed_writer_leaves_no_stuck_key(cluster):
    m = cluster(MasterProcess, *FAST, "--put_start_discard_timeout_sec=1")
    a = cluster(StoreWorker, m.address, "8MB")
    b = cluster(StoreWorker, m.address, "8MB")
    assert a.request({"op": "put_start_only", "key": "stuck", "size": 6 * MiB})["code"] == 0
    assert b.call("get", "stuck") == b""
    a.kill()
    deadline = time.monotonic() + 15
    value = b"s" * (6 * MiB)
    # While the dead put is in flight a put answers 0 and keeps it (Mooncake: the key exists); once the
    # master discards it (writer expired / discard timeout), the space is reclaimed and the key is free.
    while time.monotonic() < deadline:
        assert b.call("put", "stuck", value) == 0
        if b.call("get", "stuck") == value:
            break
        time.sleep(0.2)
    assert b.call("get", "stuck") == value


def test_eviction_under_pressure_keeps_hard_pins(cluster):
    m = cluster(MasterProcess, *FAST, "--eviction_high_watermark_ratio=0.9")
    a = cluster(StoreWorker, m.address, "8MB", "8MB")
    pinned = pattern(512 * KiB, 1)
    assert a.call("put", "pinned", pinned, config={"with_hard_pin": True}) == 0
    codes = {}
    for i in range(40):  # 40 x 512 KiB into an 8 MiB pool: older objects must be evicted
        c = a.call("put", f"fill{i}", pattern(512 * KiB, 100 + i))
        codes[c] = codes.get(c, 0) + 1
    assert codes.get(0, 0) >= 30, codes
    assert a.call("get", "pinned") == pinned
    assert a.call("get", "fill39") == pattern(512 * KiB, 139)
    assert a.call("is_exist", "fill0") == 0


def test_concurrent_writers_and_readers_verify(cluster):
    m = cluster(MasterProcess, *FAST)
    workers = [cluster(StoreWorker, m.address, "32MB") for _ in range(3)]
    errors = []

    def fill(w, i):
        try:
            out = w.request({"op": "fill", "prefix": f"w{i}-", "count": 30, "size": 40 * KiB, "seed": 1000 * i})
            assert out["codes"] == {"0": 30}, out
        except Exception as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=fill, args=(w, i)) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    results = []

    def verify(w, i):
        j = (i + 1) % len(workers)  # each reads the keys another one wrote
        results.append(w.request({"op": "verify", "prefix": f"w{j}-", "count": 30, "size": 40 * KiB,
                                  "seed": 1000 * j}))
    threads = [threading.Thread(target=verify, args=(w, i)) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r["good"] for r in results] == [30, 30, 30], results


def test_put_larger_than_pool_and_replica_clear(cluster):
    m = cluster(MasterProcess, *FAST)
    a = cluster(StoreWorker, m.address, "8MB")
    assert a.call("put", "huge", b"h" * (9 * MiB)) == E.NO_AVAILABLE_HANDLE
    assert a.call("put", "c1", b"1") == 0
    time.sleep(0.3)  # PutEnd's lease is 0 ms; nothing read it since
    assert a.call("batch_replica_clear", ["c1", "nope"]) == ["c1"]
    assert a.call("get", "c1") == b""


def _wait(fn, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        out = fn()
        if out or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_copy_and_move_tasks(cluster):
    # A 2 s read lease: the copy's first Transfer Engine connection may take longer than FAST's 200 ms on a
    # loaded machine, and a read whose lease ran out is (rightly) refused.
    m = cluster(MasterProcess, "--client_ttl=1", "--monitor_interval_ms=50", "--default_kv_lease_ttl=2000")
    a, b, c = (cluster(StoreWorker, m.address, env={"MC_STORE_TASK_POLL_MS": "50"}) for _ in range(3))
    value = pattern(200 * KiB, 5)
    assert a.call("put", "t", value, config={"preferred_segments": [a.hostname]}) == 0
    task_id, code = a.call("create_copy_task", "t", [b.hostname])
    assert code == 0 and task_id
    assert _wait(lambda: "status=SUCCESS" in str(a.call("query_task", task_id)[0]))
    segs = lambda: sorted(d["segment"] for d in _descs(c, "t"))  # noqa: E731
    assert segs() == sorted([a.hostname, b.hostname])
    task_id, code = a.call("create_move_task", "t", a.hostname, c.hostname)
    assert code == 0
    assert _wait(lambda: "status=SUCCESS" in str(a.call("query_task", task_id)[0]))
    assert _wait(lambda: segs() == sorted([b.hostname, c.hostname]))
    assert c.call("get", "t") == value and a.call("get", "t") == value
    assert a.call("create_copy_task", "missing", [b.hostname])[1] == E.OBJECT_NOT_FOUND
    assert a.call("query_task", "no-such-task") == [None, E.TASK_NOT_FOUND]


def _descs(w, key):
    return [{"segment": r.split("segment=")[1].split("'")[1]} for r in w.call("get_replica_desc", key)]


def test_master_restart_remount(cluster):
    from mooncake.testing.services import free_port
    port = free_port()
    m = cluster(MasterProcess, *FAST, f"--port={port}")
    a = cluster(StoreWorker, m.address)
    b = cluster(StoreWorker, m.address)
    assert a.call("put", "before", b"x" * 1000) == 0
    m.stop()
    m2 = cluster(MasterProcess, *FAST, f"--port={port}")
    assert m2.address == m.address
    assert b.call("get", "before") == b""  # the new master forgot everything; the client cache is dropped
    # Both clients re-mount their segments at their next heartbeat; puts then land again.
    assert _wait(lambda: b.call("put", "after", b"y" * 5000, config={"preferred_segments": [a.hostname]}) == 0
                 and len(b.call("get_replica_desc", "after")) == 1)
    # a may still be reconnecting to the new master (its next heartbeat): give it the same grace.
    assert _wait(lambda: a.call("get", "after") == b"y" * 5000)
    assert b.call("health_check") == 0
