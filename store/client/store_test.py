"""MooncakeDistributedStore in this process against a real master process: lifecycle, the byte API, the
zero-copy API, ReplicateConfig, error codes (reference §2.2, §2.4, §7) and bad inputs."""

import ctypes
import socket

import numpy as np
import pytest

from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
from mooncake.store.client.config import parse_size
from mooncake.store.client.testing import local_store
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess

MiB = 1 << 20


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=300", "--eviction_high_watermark_ratio=1.0")
    yield m
    m.stop()


@pytest.fixture
def store(master):
    with local_store(master.address) as s:
        yield s


def test_parse_size():
    assert parse_size("16MB") == parse_size("16 mb") == 16 * MiB
    assert parse_size("1.5k") == 1536 and parse_size(7) == 7
    for bad in ("", "50%", "-1MB", "abc", -3, None):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_calls_before_setup_fail_cleanly():
    s = MooncakeDistributedStore()
    assert s.close() == 0
    assert s.health_check() == 1
    assert s.put("k", b"v") < 0
    assert s.get("k") == b""
    assert s.get_buffer("k") is None
    assert s.batch_is_exist(["a", "b"]) == [-1, -1]
    assert s.get_hostname() == ""


def test_setup_errors(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "bogus", "", master.address) != 0
    assert s.setup("", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", master.address) != 0
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "50%", "16MB", "tcp", "", master.address) != 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    import os
    os.environ["MC_RPC_CONNECT_TIMEOUT_MS"] = "500"
    try:
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", dead) == E.RPC_FAIL
    finally:
        del os.environ["MC_RPC_CONNECT_TIMEOUT_MS"]
    assert s.health_check() == 1


def test_setup_dict_form_and_lifecycle(master):
    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "16 MB",
           "local_buffer_size": "4MB", "protocol": "TCP", "master_server_address": master.address}
    assert s.setup(cfg) == 0
    assert s.setup(cfg) != 0  # already set up
    host, port = s.get_hostname().rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert s.health_check() == 0
    assert s._master._fast is not None  # the master's framed-protobuf door is in use
    assert s.put("dict-form", b"x") == 0 and s.get("dict-form") == b"x"
    assert s.close() == 0 and s.close() == 0
    assert s.health_check() == 1 and s.put("k", b"v") < 0


def test_bytes_api_semantics(store):
    assert store.put("a", b"hello") == 0
    assert store.put("a", b"other") == 0          # existing key: success, old value kept
    assert store.get("a") == b"hello"
    assert store.upsert("a", b"new value!") == 0  # upsert overwrites (other size)
    assert store.get("a") == b"new value!"
    assert store.put_parts("p", b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert store.get("p") == b"abcdef"
    assert store.get("missing") == b""
    assert store.get_buffer("missing") is None
    h = store.get_buffer("p")
    assert bytes(h) == b"abcdef" and h.size() == len(h) == 6 and ctypes.string_at(h.ptr(), 6) == b"abcdef"
    assert store.get_size("p") == 6 and store.get_size("missing") == E.OBJECT_NOT_FOUND
    assert store.is_exist("p") == 1 and store.is_exist("missing") == 0
    assert store.batch_is_exist(["p", "missing"]) == [1, 0] and store.batch_is_exist([]) == []
    assert store.put_batch([], []) == 0
    vals = [bytes([i]) * (1000 * (i + 1)) for i in range(5)]
    assert store.put_batch([f"b{i}" for i in range(5)], vals) == 0
    assert store.get_batch([f"b{i}" for i in range(5)] + ["missing"]) == vals + [b""]
    assert store.get_batch([]) == []  # one entry per key (Mooncake answers [b""])
    assert [bytes(h) for h in store.batch_get_buffer(["b0", "b1"])] == vals[:2]
    assert store.upsert_batch(["b0", "new"], [b"z", b"y"]) == 0 and store.get_batch(["b0", "new"]) == [b"z", b"y"]


def test_large_values_and_pool_limits(store):
    big = np.random.default_rng(1).integers(0, 256, 12 * MiB, dtype=np.uint8).tobytes()  # > local buffer
    assert store.put("big", big) == 0
    assert store.get("big") == big
    assert store.put("too-big", b"x" * (40 * MiB)) == E.NO_AVAILABLE_HANDLE


def test_remove_codes(store):
    assert store.remove("nope") == E.OBJECT_NOT_FOUND
    assert store.put("r", b"1") == 0
    assert store.remove("r") == 0                     # never read: no lease
    assert store.put("r", b"1") == 0 and store.get("r") == b"1"
    assert store.remove("r") == E.OBJECT_HAS_LEASE    # leased by the get
    assert store.remove("r", force=True) == 0 and store.get("r") == b""
    assert store.put_batch(["x1", "x2", "y1"], [b"1", b"2", b"3"]) == 0
    assert store.batch_remove(["x1", "nope"]) == [0, E.OBJECT_NOT_FOUND]
    assert store.remove_by_regex("^x") == 1
    assert store.remove_all() == 1 and store.remove_all() == 0


def test_bad_inputs(store):
    assert store.put("", b"x") == E.INVALID_PARAMS
    with pytest.raises(TypeError):  # wrong types: api_types_test.py
        store.put(5, b"x")
    assert store.put("k", b"") == E.INVALID_PARAMS
    assert store.put_batch(["a", "b"], [b"1"]) == E.INVALID_PARAMS
    assert store.get("") == b""
    assert store.remove("") == E.INVALID_PARAMS
    assert store.batch_put_from(["a", "b"], [1], [1, 2]) == [E.INVALID_PARAMS] * 2
    assert store.register_buffer(0, 10) == E.INVALID_PARAMS
    assert store.unregister_buffer(12345) == E.INVALID_PARAMS


def test_replicate_config(store):
    c = ReplicateConfig()
    assert c.replica_num == 1 and c.soft_pin_action == SoftPinAction.PRESERVE and c.soft_pin_ttl_ms is None
    assert "replica_num=1" in str(c)
    with pytest.raises(TypeError):
        c.soft_pin_ttl_ms = -1
    with pytest.raises(TypeError):
        c.soft_pin_ttl_ms = 2**64
    c.soft_pin_ttl_ms = 1000  # without SoftPinAction.ENABLE: rejected by put
    assert store.put("pin", b"x", c) == E.INVALID_PARAMS
    c.soft_pin_action = SoftPinAction.ENABLE
    assert store.put("pin", b"x", config=c) == 0
    c = ReplicateConfig(replica_num=0)
    assert store.put("zero", b"x", c) == E.INVALID_PARAMS
    c = ReplicateConfig(with_hard_pin=True)
    c.preferred_segment = store.get_hostname()
    assert c.preferred_segments == [store.get_hostname()]
    assert store.put("hard", b"x", c) == 0
    descs = store.get_replica_desc("hard")
    assert len(descs) == 1 and descs[0].is_memory_replica()
    assert descs[0].get_memory_descriptor().buffer_descriptor.transport_endpoint == store.get_hostname()
    assert store.put("two", b"x", ReplicateConfig(replica_num=2)) == 0  # best effort: one segment here
    assert len(store.get_replica_desc("two")) == 1
    assert store.batch_get_replica_desc(["two", "missing"])["missing"] == []


def test_zero_copy(store):
    buf = np.zeros(4 * MiB, dtype=np.uint8)
    ptr = buf.ctypes.data
    assert store.register_buffer(ptr, buf.nbytes) == 0
    assert store.register_buffer(ptr + 100, 10) == E.INVALID_PARAMS  # already registered
    buf[:1000] = np.arange(1000) % 251
    assert store.put_from("zc", ptr, 1000) == 0
    assert store.get_into("zc", ptr + MiB, 999) == E.INVALID_PARAMS  # too small
    assert store.get_into("zc", ptr + MiB, 4096) == 1000
    assert (buf[MiB:MiB + 1000] == buf[:1000]).all()
    assert store.get_into("missing", ptr, 10) == E.OBJECT_NOT_FOUND
    unreg = np.zeros(100, dtype=np.uint8)
    assert store.put_from("u", unreg.ctypes.data, 100) == E.INVALID_PARAMS
    assert store.batch_put_from(["z1", "z2"], [ptr, ptr + 10], [10, 20]) == [0, 0]
    assert store.batch_get_into(["z1", "z2", "nope"], [ptr + 2 * MiB, ptr + 3 * MiB, ptr], [64, 64, 64]) == \
        [10, 20, E.OBJECT_NOT_FOUND]
    assert (buf[3 * MiB:3 * MiB + 20] == buf[10:30]).all()
    assert store.batch_put_from([], [], []) == []
    assert store.batch_put_from_multi_buffers(["m"], [[ptr, ptr + 500]], [[100, 50]]) == [0]
    want = np.concatenate([buf[:100], buf[500:550]]).tobytes()
    assert store.get("m") == want
    assert store.batch_get_into_multi_buffers(["m"], [[ptr + MiB, ptr + 2 * MiB]], [[120, 30]]) == [150]
    assert buf[MiB:MiB + 120].tobytes() + buf[2 * MiB:2 * MiB + 30].tobytes() == want
    assert store.put_from_with_metadata("md", ptr + 10, ptr, 5, 3) == 0
    assert store.get("md") == buf[:3].tobytes() + buf[10:15].tobytes()
    res = store.get_into_ranges([ptr + MiB], [["m", "nope"]], [[[0, 10], [0]]], [[[5, 140], [0]]],
                                [[[4, 20], [1]]])
    assert res == [[[4, E.BUFFER_OVERFLOW], [E.OBJECT_NOT_FOUND]]]
    assert buf[MiB:MiB + 4].tobytes() == want[5:9]
    assert store.upsert_from("zc", ptr + 7, 64) == 0 and store.get_size("zc") == 64
    assert store.unregister_buffer(ptr) == 0 and store.unregister_buffer(ptr) == E.INVALID_PARAMS
    assert store.get_into("zc", ptr, 64) == E.INVALID_PARAMS
