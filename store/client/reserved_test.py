"""One-round-trip puts (reserved.py, store/master/reservations.py) against a real master: the path is taken,
data lands where it should, existing keys stay unchanged, blocks are renewed, freed when idle and on close,
and puts fall back to two calls when the master grants nothing or the path is off."""

import re
import time
import urllib.request

import numpy as np
import pytest

from mooncake.store import ReplicateConfig
from mooncake.store.client.testing import local_store
from mooncake.store.master.testing import MasterProcess

MiB = 1 << 20


def metrics(master) -> dict:
    """{name or name{op}: value} of the master's counters and gauges this test looks at."""
    with urllib.request.urlopen(f"http://127.0.0.1:{master.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {"reserved": 0.0}
    for m in re.finditer(r'^master_requests_total\{op="(\w+)"\} (\S+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    m = re.search(r"^master_reserved_bytes (\S+)$", text, re.M)
    if m:
        out["reserved"] = float(m.group(1))
    return out


def value(i, size=MiB):
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.fixture
def master(request):
    m = MasterProcess("--eviction_high_watermark_ratio=1.0", *getattr(request, "param", ()))
    yield m
    m.stop()


def test_puts_take_one_master_call_and_land_in_the_preferred_segment(master):
    with local_store(master.address) as a, local_store(master.address, segment="64MB") as b:
        cfg = ReplicateConfig()
        cfg.preferred_segment = b.get_hostname()
        before = metrics(master)
        for i in range(40):
            assert a.put(f"k{i}", value(i), cfg) == 0
        after = metrics(master)
        assert after.get("put_reserved", 0) - before.get("put_reserved", 0) == 40
        assert after.get("put_start", 0) == before.get("put_start", 0)
        assert after.get("reserve_space", 0) - before.get("reserve_space", 0) <= 6  # blocks of 8+ MiB
        for i in range(40):
            assert b.get(f"k{i}") == value(i) and a.get(f"k{i}") == value(i)
            assert [d.segment_name for d in a.get_replica_desc(f"k{i}")] == [b.get_hostname()]
        assert a.put("k3", value(99), cfg) == 0  # an existing key: OK, unchanged
        assert b.get("k3") == value(3)
        assert metrics(master)["reserved"] > 0
        a.close()
        assert metrics(master)["reserved"] == 0  # close gives the rest of its blocks back
        assert b.get("k7") == value(7)  # the objects stay (they are in b's segment)


def test_small_values_and_the_local_segment(master):
    with local_store(master.address) as a:
        for i in range(200):
            assert a.put(f"s{i}", value(i, 4096 + i)) == 0
        assert all(a.get(f"s{i}") == value(i, 4096 + i) for i in range(200))
        assert metrics(master).get("put_reserved", 0) == 200


def test_batches_take_one_master_call(master):
    """put_batch (bytes: one gather, one write) and batch_put_from (registered memory) commit a whole batch
    with one BatchPutReserved; existing and duplicate keys keep their value and report 0, like put."""
    with local_store(master.address) as a, local_store(master.address, segment="64MB") as b:
        cfg = ReplicateConfig(preferred_segment=b.get_hostname())
        assert a.put("x3", value(99, 1000), cfg) == 0
        before = metrics(master)
        for r in range(3):
            keys = [f"x{r * 10 + j}" for j in range(10)]
            vals = [value(r * 10 + j, 1000 + 37 * j) for j in range(10)]
            assert a.put_batch(keys, vals, cfg) == 0
        buf = np.frombuffer(b"".join(value(100 + j, 4096) for j in range(8)), dtype=np.uint8).copy()
        assert a.register_buffer(buf.ctypes.data, buf.nbytes) == 0
        ptrs = [buf.ctypes.data + 4096 * j for j in range(8)]
        keys = [f"z{j}" for j in range(7)] + ["z0"]  # a duplicate: the first one wins
        assert a.batch_put_from(keys, ptrs, [4096] * 8, cfg) == [0] * 8
        after = metrics(master)
        assert after.get("batch_put_reserved", 0) - before.get("batch_put_reserved", 0) == 4
        assert after.get("put_start", 0) == before.get("put_start", 0)
        assert after.get("put_reserved", 0) == before.get("put_reserved", 0)
        for i in range(30):
            want = value(99, 1000) if i == 3 else value(i, 1000 + 37 * (i % 10))
            assert b.get(f"x{i}") == want and a.get(f"x{i}") == want, i
            assert [d.segment_name for d in a.get_replica_desc(f"x{i}")] == [b.get_hostname()]
        assert [b.get(f"z{j}") for j in range(7)] == [value(100 + j, 4096) for j in range(7)]
        assert a.unregister_buffer(buf.ctypes.data) == 0
        local = ReplicateConfig(preferred_segment=a.get_hostname())  # into this client's own segment: memcpy
        assert a.put_batch(["l0", "l1"], [value(5, 70), value(6, 7000)], local) == 0
        assert a.get("l0") == value(5, 70) and a.get("l1") == value(6, 7000)
        assert metrics(master).get("batch_put_reserved", 0) - before.get("batch_put_reserved", 0) == 5


@pytest.mark.parametrize("master", [("--reservation_idle_sec=4",)], indirect=True)
def test_a_quiet_block_is_renewed_before_use(master):
    with local_store(master.address) as a:
        assert a.put("a", value(1)) == 0
        time.sleep(1.3)  # no longer fresh (1 s), still held (4 s idle)
        assert a.put("b", value(2)) == 0
        m = metrics(master)
        assert m["reserve_space"] == 1 and m["renew_space"] == 1 and m["put_reserved"] == 2
        assert m.get("put_start", 0) == 0
        assert a.get("a") == value(1) and a.get("b") == value(2)


@pytest.mark.parametrize("master", [("--reservation_idle_sec=1",)], indirect=True)
def test_idle_blocks_are_freed_by_the_master(master):
    with local_store(master.address) as a:
        assert a.put("a", value(1)) == 0
        assert metrics(master)["reserved"] > 0
        deadline = time.monotonic() + 10
        while metrics(master)["reserved"] > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert metrics(master)["reserved"] == 0
        assert a.put("b", value(2)) == 0  # a new block
        assert a.get("a") == value(1) and a.get("b") == value(2)


@pytest.mark.parametrize("master", [("--reservation_idle_sec=0",)], indirect=True)
def test_without_reservations_puts_take_two_calls(master):
    with local_store(master.address) as a:
        for i in range(5):
            assert a.put(f"k{i}", value(i)) == 0
        assert all(a.get(f"k{i}") == value(i) for i in range(5))
        assert a.put_batch(["b0", "b1"], [value(7), value(8)]) == 0
        assert a.get_batch(["b0", "b1"]) == [value(7), value(8)]
        m = metrics(master)
        assert m.get("put_start", 0) == 7 and m.get("put_reserved", 0) == 0
        assert m.get("batch_put_reserved", 0) == 0


def test_the_path_can_be_turned_off(master, monkeypatch):
    monkeypatch.setenv("MC_STORE_RESERVED_PUT", "0")
    with local_store(master.address) as a:
        assert a.put("k", value(1)) == 0 and a.get("k") == value(1)
        m = metrics(master)
        assert m.get("put_start", 0) == 1 and m.get("reserve_space", 0) == 0


def status(master) -> dict:
    import json

    with urllib.request.urlopen(f"http://127.0.0.1:{master.metrics_port}/status.json", timeout=5) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("replicas", [1, 2], ids=["reserved", "two_calls"])
def test_a_failed_write_leaves_its_buffers_held_not_reused(master, monkeypatch, replicas):
    """A put whose write into another client's segment fails may still land there later (a timeout leaves it
    in flight): the master must not hand those bytes to the next put. Reserved path: the block's rest is
    released as held; two-call path: the keys are revoked with their buffers held (as a discarded put's)."""
    from mooncake.store.client.testing import StoreWorker

    monkeypatch.setenv("MC_FORCE_TCP", "1")  # a same-host peer is reached over tcp: its death fails the write
    peers = [StoreWorker(master.address, segment="64MB", buffer="8MB") for _ in range(replicas)]
    try:
        with local_store(master.address, segment="0", buffer="32MB") as s:
            cfg = ReplicateConfig(replica_num=replicas, preferred_segments=[p.hostname for p in peers])
            assert s.put("first", value(1, 64 << 10), cfg) == 0  # a block of the peer reserved for this client
            assert status(master)["held_bytes"] == 0
            peers[0].kill()
            assert s.put("second", value(2, 64 << 10), cfg) < 0
            held = status(master)["held_bytes"]
            assert held >= 64 << 10, f"held {held}: the failed write's buffers went back to the free space"
            assert s.is_exist("second") == 0
    finally:
        for p in peers[1:]:
            p.stop()
