"""Layer-wise sessions (sessions.py) against a real master and a peer client process holding the replicas:
per-layer range reads and writes move the right bytes with no master call between start and end, every
refusal has its code, leases and master changes end get sessions, and nothing of an unfinished or revoked
put session is ever readable."""

import threading
import time

import numpy as np
import pytest

from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from mooncake.store.client.testing import StoreWorker
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess

LAYERS, LAYER = 64, 4096  # an object = 64 layers of 4 KiB
SIZE = LAYERS * LAYER
MiB = 1 << 20


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=1500", "--eviction_high_watermark_ratio=1.0")
    yield m
    m.stop()


@pytest.fixture(scope="module")
def peer(master):
    w = StoreWorker(master.address, segment="64MB", buffer="4MB")
    yield w
    w.stop()


@pytest.fixture
def store(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "4MB", "tcp", "", master.address) == 0
    yield s
    s.remove_all(force=True)
    s.close()


class Mem:
    """A registered numpy buffer of the store."""

    def __init__(self, store, nbytes):
        self.a = np.zeros(nbytes, dtype=np.uint8)
        self.p = self.a.ctypes.data
        assert store.register_buffer(self.p, nbytes) == 0


def _objects(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, SIZE), dtype=np.uint8)


def _count_master_calls(store):
    """Every master call of `store` but its heartbeat's pings, appended to the returned list."""
    calls, master = [], store._master
    original = master.call

    def call(method, *a, **kw):
        if method != "Ping":
            calls.append(method)
        return original(method, *a, **kw)
    master.call = call
    return calls


@pytest.mark.parametrize("where", ["peer", "own segment"])
def test_get_session_reads_every_layer_without_the_master(store, peer, where):
    keys = [f"g-{where}-{i}" for i in range(8)]
    objs = _objects(len(keys))
    src = Mem(store, objs.nbytes)
    src.a[:] = objs.reshape(-1)
    cfg = ReplicateConfig(preferred_segment=peer.hostname if where == "peer" else store.get_hostname())
    assert store.batch_put_from(keys, [src.p + i * SIZE for i in range(len(keys))], [SIZE] * len(keys), cfg) == \
        [0] * len(keys)
    assert {store.get_replica_desc(k)[0].segment_name for k in keys} == {cfg.preferred_segment}
    dst = Mem(store, objs.nbytes)  # layer-major: layer l of key i at (l * n + i) * LAYER
    calls = _count_master_calls(store)
    assert store.batch_get_session_start(keys) == [0] * len(keys)
    assert calls == ["BatchGetReplicaList"]
    for layer in range(LAYERS):
        ptrs = [[dst.p + (layer * len(keys) + i) * LAYER] for i in range(len(keys))]
        got = store.batch_get_into_multi_buffer_ranges(keys, ptrs, [[LAYER]] * len(keys),
                                                       [[layer * LAYER]] * len(keys))
        assert got == [LAYER] * len(keys)
    assert store.batch_get_session_end(keys) == 0
    assert calls == ["BatchGetReplicaList"]  # 64 layers, no master call
    assert (dst.a.reshape(LAYERS, len(keys), LAYER) == objs.reshape(len(keys), LAYERS, LAYER).transpose(1, 0, 2)).all()


def test_get_session_ranges_and_refusals(store, peer):
    cfg = ReplicateConfig(preferred_segment=peer.hostname)
    obj = _objects(1, 3)[0]
    assert store.put("r", obj.tobytes(), cfg) == 0
    dst = Mem(store, 2 * SIZE)
    assert store.batch_get_session_start(["r", "missing", ""]) == [0, E.OBJECT_NOT_FOUND, E.INVALID_PARAMS]
    # several buffers per key, out of order, and a zero-length range
    got = store.batch_get_into_multi_buffer_ranges(["r"], [[dst.p + 100, dst.p, dst.p + 50]], [[10, 20, 0]],
                                                   [[SIZE - 10, 5, 0]])
    assert got == [30] and dst.a[100:110].tolist() == obj[-10:].tolist() and dst.a[:20].tolist() == obj[5:25].tolist()
    unregistered = np.zeros(64, dtype=np.uint8)
    assert store.batch_get_into_multi_buffer_ranges(
        ["r", "r", "r", "missing", "r"],
        [[dst.p], [dst.p], [unregistered.ctypes.data], [dst.p], [dst.p, dst.p]],
        [[1], [SIZE], [8], [1], [1]], [[SIZE], [1], [0], [0], [0]]) == \
        [E.BUFFER_OVERFLOW, E.BUFFER_OVERFLOW, E.INVALID_PARAMS, E.INVALID_PARAMS, E.INVALID_PARAMS]
    assert store.batch_get_into_multi_buffer_ranges(["r", "r"], [[dst.p]], [[1]], [[0]]) == [E.INVALID_PARAMS] * 2
    # starts nest: one end per start
    assert store.batch_get_session_start(["r"]) == [0]
    assert store.batch_get_session_end(["r"]) == 0
    assert store.batch_get_into_multi_buffer_ranges(["r"], [[dst.p]], [[4]], [[0]]) == [4]
    assert store.batch_get_session_end(["r", "missing"]) == E.INVALID_PARAMS  # "r" ended anyway
    assert store.batch_get_into_multi_buffer_ranges(["r"], [[dst.p]], [[4]], [[0]]) == [E.INVALID_PARAMS]
    assert store.batch_get_session_end(["r"]) == E.INVALID_PARAMS
    for bad in (lambda: store.batch_get_session_start("r"),
                lambda: store.batch_get_into_multi_buffer_ranges(["r"], [dst.p], [[1]], [[0]]),
                lambda: store.batch_get_into_multi_buffer_ranges(["r"], [[dst.p]], [[1]], [[-1]])):
        with pytest.raises(TypeError):
            bad()


def test_get_session_ends_with_its_lease(store, peer):
    assert store.put("lease", b"x" * 100, ReplicateConfig(preferred_segment=peer.hostname)) == 0
    dst = Mem(store, 100)
    assert store.batch_get_session_start(["lease"]) == [0]
    assert store.batch_get_into_multi_buffer_ranges(["lease"], [[dst.p]], [[100]], [[0]]) == [100]
    time.sleep(1.6)  # the master's --default_kv_lease_ttl=1500
    assert store.batch_get_into_multi_buffer_ranges(["lease"], [[dst.p]], [[100]], [[0]]) == [E.LEASE_EXPIRED]
    assert store.batch_get_session_start(["lease"]) == [0]  # a fresh start holds a fresh lease
    assert store.batch_get_into_multi_buffer_ranges(["lease"], [[dst.p]], [[100]], [[0]]) == [100]
    assert store.batch_get_session_end(["lease"]) == 0 and store.batch_get_session_end(["lease"]) == 0


def test_put_session_writes_layers_then_commits(store, peer):
    keys = [f"p{i}" for i in range(6)]
    objs = _objects(len(keys), 7)
    src = Mem(store, objs.nbytes)
    src.a[:] = objs.reshape(-1)
    calls = _count_master_calls(store)
    cfg = ReplicateConfig(replica_num=2)
    assert store.batch_put_session_start(keys, [SIZE] * len(keys), cfg) == [0] * len(keys)
    assert calls == ["BatchPutStart"]
    assert store.batch_is_exist(keys) == [0] * len(keys)  # allocated, not readable
    before = len(calls)

    def write(layers):
        for layer in layers:
            ptrs = [[src.p + i * SIZE + layer * LAYER] for i in range(len(keys))]
            assert store.batch_put_from_multi_buffer_ranges(keys, ptrs, [[LAYER]] * len(keys),
                                                            [[layer * LAYER]] * len(keys)) == [LAYER] * len(keys)
    threads = [threading.Thread(target=write, args=(range(t, LAYERS, 4),)) for t in range(4)]  # layers in parallel
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls[before:] == []  # 64 layers, no master call
    assert store.batch_put_session_end(keys) == [0] * len(keys)
    assert calls[before:] == ["BatchPutEnd"]
    assert [len(store.get_replica_desc(k)) for k in keys] == [2] * len(keys)  # every replica written
    for i, k in enumerate(keys):
        assert store.get(k) == objs[i].tobytes()
    assert peer.call("get", keys[0]) == objs[0].tobytes()
    assert store.batch_put_session_end(keys[:1]) == [E.INVALID_PARAMS]  # ended


def test_put_session_refusals_incomplete_and_revoke(store):
    src = Mem(store, SIZE)
    src.a[:] = _objects(1, 9)[0]
    assert store.put("exists", b"old") == 0
    assert store.batch_put_session_start(["a", "exists", "", "z", "a"], [SIZE, 8, 8, 0, 8]) == \
        [0, E.OBJECT_ALREADY_EXISTS, E.INVALID_PARAMS, E.INVALID_PARAMS, E.INVALID_PARAMS]
    assert store.get("exists") == b"old"
    assert store.batch_put_session_start(["a"], [SIZE]) == [E.INVALID_PARAMS]  # open already
    assert store.batch_put_session_start(["bad"], [1], ReplicateConfig(replica_num=0)) == [E.INVALID_PARAMS]
    assert store.batch_put_from_multi_buffer_ranges(["a", "none", "a"], [[src.p], [src.p], [src.p]],
                                                    [[SIZE]] * 3, [[1], [0], [0]]) == \
        [E.BUFFER_OVERFLOW, E.INVALID_PARAMS, SIZE]
    # bytes never written: refused, the session stays open
    assert store.batch_put_session_start(["half"], [SIZE]) == [0]
    assert store.batch_put_from_multi_buffer_ranges(["half"], [[src.p]], [[SIZE // 2]], [[0]]) == [SIZE // 2]
    assert store.batch_put_session_end(["half", "nokey"]) == [E.INVALID_WRITE, E.INVALID_PARAMS]
    assert store.is_exist("half") == 0
    assert store.batch_put_from_multi_buffer_ranges(["half"], [[src.p + SIZE // 2]], [[SIZE // 2]],
                                                    [[SIZE // 2]]) == [SIZE // 2]
    assert store.batch_put_session_end(["half", "a"]) == [0, 0]
    assert store.get("half") == store.get("a") == src.a.tobytes()
    # revoke: nothing readable, the key can be put again, no session left
    assert store.batch_put_session_start(["rv"], [SIZE]) == [0]
    assert store.batch_put_from_multi_buffer_ranges(["rv"], [[src.p]], [[SIZE]], [[0]]) == [SIZE]
    assert store.batch_put_session_revoke(["rv", "rv", "nokey"]) == [0, E.INVALID_PARAMS, E.INVALID_PARAMS]
    assert store.is_exist("rv") == 0 and store.get("rv") == b""
    assert store.batch_put_from_multi_buffer_ranges(["rv"], [[src.p]], [[SIZE]], [[0]]) == [E.INVALID_PARAMS]
    assert store.batch_put_session_end(["rv"]) == [E.INVALID_PARAMS]
    assert store.put("rv", b"again") == 0 and store.get("rv") == b"again"


def test_close_revokes_open_put_sessions(master, peer):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "4MB", "tcp", "", master.address) == 0
    assert s.batch_put_session_start(["left-open"], [4096], ReplicateConfig(preferred_segment=peer.hostname)) == [0]
    assert s.batch_get_session_start(["left-open"]) == [E.REPLICA_IS_NOT_READY]
    assert s.close() == 0
    assert s.batch_put_session_end(["left-open"]) == [-1]  # closed
    other = MooncakeDistributedStore()
    assert other.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "4MB", "tcp", "", master.address) == 0
    try:
        assert other.is_exist("left-open") == 0
        assert other.put("left-open", b"v") == 0 and other.get("left-open") == b"v"  # the master forgot it
    finally:
        other.remove_all(force=True)
        other.close()


def test_sessions_before_setup():
    s = MooncakeDistributedStore()
    assert s.batch_get_session_start(["k"]) == [-1] and s.batch_get_session_end(["k"]) == -1
    assert s.batch_put_session_start(["k"], [1]) == [-1] and s.batch_put_session_revoke(["k"]) == [-1]
    assert s.batch_get_into_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == [-1]
    assert s.batch_put_from_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == [-1]


def test_a_failed_session_write_cannot_be_ended_and_its_revoke_holds_the_buffers(master, monkeypatch):
    """A range write that failed may still land later (a timeout): ending the session is refused (a late write
    could overwrite a retry), and its revoke leaves the buffers held by the master, never reused at once."""
    import json
    import urllib.request

    def held():
        with urllib.request.urlopen(f"http://127.0.0.1:{master.metrics_port}/status.json", timeout=5) as r:
            return json.loads(r.read())["held_bytes"]

    monkeypatch.setenv("MC_FORCE_TCP", "1")  # the same-host peer over tcp: its death fails the write
    victim = StoreWorker(master.address, segment="16MB", buffer="4MB")
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "0", "4MB", "tcp", "", master.address) == 0
    try:
        src = Mem(s, SIZE)
        cfg = ReplicateConfig(replica_num=1, preferred_segments=[victim.hostname])
        assert s.batch_put_session_start(["f"], [SIZE], cfg) == [0]
        assert s.batch_put_from_multi_buffer_ranges(["f"], [[src.p]], [[LAYER]], [[0]]) == [LAYER]
        victim.kill()
        assert s.batch_put_from_multi_buffer_ranges(["f"], [[src.p + LAYER]], [[LAYER]], [[LAYER]])[0] < 0
        assert s.batch_put_session_end(["f"]) == [E.TRANSFER_FAIL]
        before = held()
        assert s.batch_put_session_revoke(["f"]) == [0]
        assert held() >= before + SIZE, "the revoked buffers went back to the free space"
        assert s.is_exist("f") == 0
    finally:
        s.close()
