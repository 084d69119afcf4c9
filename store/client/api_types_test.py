"""The store's public Python API against a real master: wrong Python types raise TypeError for every public
method (one table, before and after setup, sync and async) and change nothing; the types clients pass keep
working; keys up to MAX_KEY_BYTES (64 KiB) work end to end and one byte more is refused; every batch call
answers exactly once per key, in order, with misses, duplicates and empty lists."""

import array
import asyncio
import inspect
import os
import time

import numpy as np
import pytest
import torch

from mooncake.store.client.async_store import MooncakeDistributedStoreAsync
from mooncake.store import MooncakeDistributedStore, ObjectDataType, ReplicateConfig, SoftPinAction
from mooncake.store.client.ssd import DiskTier
from mooncake.store.client.testing import local_store
from mooncake.store.client.validate import MAX_KEY_BYTES
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess

MiB = 1 << 20
T = torch.arange(4, dtype=torch.int32)
RC = ReplicateConfig()

# A well-typed call of every public method that takes arguments (keys that are never stored: "tk*").
GOOD = {
    "put": ("tk", b"v", RC), "upsert": ("tk", b"v", RC),
    "put_parts": ("tk", b"a", b"b"), "upsert_parts": ("tk", b"a", b"b"),
    "put_batch": (["tk"], [b"v"], RC), "upsert_batch": (["tk"], [b"v"], RC),
    "get": ("tk",), "get_buffer": ("tk",), "get_batch": (["tk"],), "batch_get_buffer": (["tk"],),
    "get_size": ("tk",), "is_exist": ("tk",), "batch_is_exist": (["tk"],),
    "remove": ("tk", False), "batch_remove": (["tk"], False), "remove_by_regex": ("^tk$", False),
    "remove_all": (False,),
    "register_buffer": (1, 1), "unregister_buffer": (1,),
    "put_from": ("tk", 1, 1, RC), "upsert_from": ("tk", 1, 1, RC),
    "put_from_with_metadata": ("tk", 1, 1, 1, 1, RC),
    "batch_put_from": (["tk"], [1], [1], RC), "batch_upsert_from": (["tk"], [1], [1], RC),
    "batch_put_from_multi_buffers": (["tk"], [[1]], [[1]], RC),
    "get_into": ("tk", 1, 1), "batch_get_into": (["tk"], [1], [1]),
    "batch_get_into_multi_buffers": (["tk"], [[1]], [[1]], False),
    "get_into_ranges": ([1], [["tk"]], [[[0]]], [[[0]]], [[[1]]]),
    "get_replica_desc": ("tk",), "batch_get_replica_desc": (["tk"],), "batch_replica_clear": (["tk"], "seg"),
    "create_copy_task": ("tk", ["seg"]), "create_move_task": ("tk", "a", "b"), "query_task": ("id",),
    "put_tensor": ("tk", T), "pub_tensor": ("tk", T, RC), "upsert_tensor": ("tk", T),
    "upsert_pub_tensor": ("tk", T, RC),
    "batch_put_tensor": (["tk"], [T]), "batch_pub_tensor": (["tk"], [T], RC), "batch_upsert_tensor": (["tk"], [T]),
    "batch_upsert_pub_tensor": (["tk"], [T], RC),
    "put_tensor_with_tp": ("tk", T, 0, 1, 0), "pub_tensor_with_tp": ("tk", T, RC, 0, 1, 0),
    "batch_put_tensor_with_tp": (["tk"], [T], 0, 1, 0),
    "put_tensor_from": ("tk", 1, 1), "upsert_tensor_from": ("tk", 1, 1),
    "batch_put_tensor_from": (["tk"], [1], [1]), "batch_upsert_tensor_from": (["tk"], [1], [1]),
    "get_tensor": ("tk",), "batch_get_tensor": (["tk"],), "get_tensor_with_tp": ("tk", 0, 1, 0),
    "batch_get_tensor_with_tp": (["tk"], 0, 1), "get_tensor_into": ("tk", 1, 1),
    "batch_get_tensor_into": (["tk"], [1], [1]), "get_tensor_with_tp_into": ("tk", 1, 1, 0, 1, 0),
    "batch_get_tensor_with_tp_into": (["tk"], [1], [1], 0, 1),
    "alloc_from_mem_pool": (4096,),
    "batch_get_session_start": (["tk"],), "batch_get_session_end": (["tk"],),
    "batch_get_into_multi_buffer_ranges": (["tk"], [[1]], [[1]], [[0]]),
    "batch_put_session_start": (["tk"], [1], RC), "batch_put_session_end": (["tk"],),
    "batch_put_session_revoke": (["tk"],), "batch_put_from_multi_buffer_ranges": (["tk"], [[1]], [[1]], [[0]]),
}
NO_ARGS = {"close", "health_check", "get_hostname"}
SETUPS = {"setup", "setup_dummy"}  # tested in test_setup_types / standalone_test.py (a good call sets up)
INTERNAL = {"put_many", "put_one", "get_many", "read_many", "fast_read", "fast_get_into", "cache_clear"}  # for the mixins

# A plausible wrong value per parameter name (every parameter also gets object(), wrong for every kind).
WRONG = {
    "key": 12345, "keys": "ab", "base_keys": "ab", "targets": "seg", "all_keys": ["tk"],
    "value": "a str", "parts": "a str", "values": "x", "config": 5, "force": "yes",
    "prefer_alloc_in_same_node": "yes", "buffer_ptr": 1.5, "metadata_buffer_ptr": "0x10", "size": 10.0,
    "metadata_size": -1, "buffer_ptrs": [1.5], "sizes": ["1"], "all_buffer_ptrs": [1], "all_sizes": [1],
    "all_dst_offsets": [[["x"]]], "all_src_offsets": [[[None]]], "regex_pattern": 5, "segment_name": None,
    "source": 1, "target": b"b", "task_id": 5, "tensor": [1, 2], "tensors_list": [T, "x"], "tp_rank": "0",
    "tp_size": 1.0, "split_dim": None,
}

# The issue's own examples (issue 19, item 4), verbatim.
ISSUE = [
    ("put", ("k", "a str")), ("put", ("k", 12345)), ("put", ("k", None)), ("put", (12345, b"v")),
    ("put", ("k", b"v", 5)), ("get", (12345,)), ("get_size", (None,)), ("is_exist", (3.5,)), ("remove", (12345,)),
    ("remove_by_regex", (5,)), ("batch_is_exist", ("not-a-list",)), ("put_batch", (["a"], "x")),
    ("put_batch", ("ab", [b"x", b"y"])), ("get_batch", (None,)), ("batch_get_buffer", ("ab",)),
    ("register_buffer", ("x", 10)), ("get_into", ("k", "x", 10)), ("put_from", ("k", 1.5, 10)),
    ("setup", (12345,)),
]


def _public_methods():
    return sorted(n for n, v in inspect.getmembers(MooncakeDistributedStore, callable) if not n.startswith("_"))


def _wrong_calls():
    """(method, args, kwargs, parameter) for every parameter of every public method, two wrong values each."""
    rows = []
    for name, good in GOOD.items():
        fn = getattr(MooncakeDistributedStore, name)
        sig = inspect.signature(fn)
        for param in [p for p in sig.parameters if p != "self"]:
            for bad in (WRONG[param], object()):
                ba = sig.bind(None, *good)
                if sig.parameters[param].kind == inspect.Parameter.VAR_POSITIONAL:
                    ba.arguments[param] = (b"a", bad)
                else:
                    ba.arguments[param] = bad
                rows.append((name, ba.args[1:], ba.kwargs, param))
    return rows


WRONG_CALLS = _wrong_calls()


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=200", "--eviction_high_watermark_ratio=1.0")
    yield m
    m.stop()


@pytest.fixture
def store(master):
    with local_store(master.address) as s:
        yield s


def test_table_covers_every_public_method_and_parameter():
    checked = set()
    for name in _public_methods():
        fn = getattr(MooncakeDistributedStore, name)
        if name in NO_ARGS or name in INTERNAL or name in SETUPS:
            continue
        params = [p for p in inspect.signature(fn).parameters if p != "self"]
        assert hasattr(fn, "api_kinds"), f"{name} does not check its argument types (@typed)"
        assert set(fn.api_kinds) == set(params), f"{name}: unchecked parameter(s) {set(params) - set(fn.api_kinds)}"
        assert name in GOOD, f"{name} has no row in the table"
        checked.add(name)
    assert checked == set(GOOD)
    assert len(WRONG_CALLS) > 200


def _assert_all_raise(s):
    for name, args, kwargs, param in WRONG_CALLS:
        with pytest.raises(TypeError, match=rf"{name}\(\): {param}"):
            getattr(s, name)(*args, **kwargs)
    for name, args in ISSUE:
        with pytest.raises(TypeError):
            getattr(s, name)(*args)


def test_wrong_types_raise_before_setup():
    s = MooncakeDistributedStore()
    _assert_all_raise(s)
    assert s.health_check() == 1 and s.close() == 0


def test_wrong_types_raise_after_setup_and_change_nothing(store):
    assert store.put("kept", b"value") == 0
    _assert_all_raise(store)
    assert store.get("kept") == b"value" and store.batch_is_exist(["k", "tk", "a"]) == [0, 0, 0]
    assert store.put("after", b"works") == 0 and store.get("after") == b"works"
    assert store.remove("after", force=True) == 0


def test_well_typed_table_calls_do_not_raise_before_setup():
    """The table's good calls are well typed: before setup each one fails cleanly, one entry per key."""
    s = MooncakeDistributedStore()
    for name, args in GOOD.items():
        r = getattr(s, name)(*args)
        assert r in (-1, 0, b"", None, {}, [], ("", -1), (None, -1), [-1], [b""], [None], [[[-1]]]), (name, r)


def test_async_wrapper_raises_the_same(store):
    async def main():
        for s in (MooncakeDistributedStoreAsync(), MooncakeDistributedStoreAsync(store)):
            for name, args, kwargs, param in WRONG_CALLS[::7]:
                with pytest.raises(TypeError, match=rf"{name}\(\): {param}"):
                    await getattr(s, "async_" + name)(*args, **kwargs)
            for name, args in ISSUE:
                with pytest.raises(TypeError):
                    await getattr(s, "async_" + name)(*args)
        assert await MooncakeDistributedStoreAsync(store).async_put("async", b"ok") == 0
    asyncio.run(main())
    assert store.get("async") == b"ok"


def test_setup_types(master):
    s = MooncakeDistributedStore()
    addr = master.address
    good = ("127.0.0.1", "P2PHANDSHAKE", "16MB", "4MB", "tcp", "", addr)
    for args, kwargs, what in [
        ((12345,), {}, "local_hostname"), ((), {}, "required"), (good[:2] + (None,) + good[3:], {}, "global_segment"),
        (good[:4] + (5,) + good[5:], {}, "protocol"), (good[:6] + (b"h:1",), {}, "master_server_addr"),
        (good, {"bogus": 1}, "unexpected"), (good, {"enable_ssd_offload": [1]}, "enable_ssd_offload"),
        (good, {"tenant_id": 7}, "tenant_id"), (good, {"local_hostname": "x"}, "multiple"),
        (({"local_hostname": 5, "metadata_server": "P2PHANDSHAKE"},), {}, "local_hostname"),
        (({1: "x"},), {}, "keys must be str"),
    ]:
        with pytest.raises(TypeError, match=what):
            s.setup(*args, **kwargs)
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "50%", "4MB", "tcp", "", addr) == E.INVALID_PARAMS  # a value
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "16MB",
                    "local_buffer_size": "4MB", "master_server_address": addr, "enable_ssd_offload": "false",
                    "client_http_port": "9300"}) == 0  # LMCache's dict of strings
    try:
        with pytest.raises(TypeError):
            s.setup(12345)  # also on a store that is set up
        assert s.setup(*good) == E.UNAVAILABLE_IN_CURRENT_STATUS
        assert s.put("after-setup", b"x") == 0 and s.get("after-setup") == b"x"
    finally:
        s.remove_all(force=True)
        s.close()


def test_replicate_config_types():
    for kwargs in ({"replica_num": "two"}, {"replica_num": -1}, {"replica_num": 2**64}, {"replica_num": 1.0},
                   {"replica_num": None}, {"with_hard_pin": "yes"}, {"with_hard_pin": None}, {"with_hard_pin": 2},
                   {"soft_pin_ttl_ms": -5}, {"soft_pin_action": "ENABLE"}, {"soft_pin_action": 7},
                   {"data_type": "TENSOR"}, {"preferred_segments": "seg"}, {"preferred_segments": [1]},
                   {"preferred_segment": 5}, {"group_ids": "g"}, {"prefer_alloc_in_same_node": "no"},
                   {"nof_replica_num": -1}):
        with pytest.raises(TypeError, match=f"ReplicateConfig.{next(iter(kwargs))}"):
            ReplicateConfig(**kwargs)
        c = ReplicateConfig()
        with pytest.raises(TypeError):
            setattr(c, *next(iter(kwargs.items())))
        assert str(c) == str(ReplicateConfig())  # a refused assignment changes nothing
    c = ReplicateConfig(replica_num=np.int64(2), with_hard_pin=1, soft_pin_action=1, soft_pin_ttl_ms=np.uint32(5),
                        preferred_segments=("a", "b"), data_type=ObjectDataType.TENSOR, group_ids=("g",))
    assert (c.replica_num, c.with_hard_pin, c.soft_pin_action, c.soft_pin_ttl_ms) == (2, True, SoftPinAction.ENABLE, 5)
    assert type(c.replica_num) is int and c.preferred_segments == ["a", "b"] and c.group_ids == ["g"]
    segs = ["x"]
    c.preferred_segments = segs
    segs.append("y")
    assert c.preferred_segments == ["x"]  # the config keeps its own list
    c.preferred_segment = "only"
    assert c.preferred_segments == ["only"] and c.preferred_segment == "only"
    c.group_ids = None
    c.replica_num = 0  # the right type: accepted here, refused by a put (a value)
    assert c.validate() == E.INVALID_PARAMS
    with pytest.raises(AttributeError):
        c.no_such_field = 1


def test_types_clients_pass_keep_working(store):
    buf = np.zeros(2 * MiB, dtype=np.uint8)
    ptr = buf.ctypes.data
    assert store.register_buffer(np.uint64(ptr), np.int64(buf.nbytes)) == 0
    try:
        class Key(str):
            pass
        assert store.put(Key("sub"), bytearray(b"ba")) == 0 and store.get("sub") == b"ba"
        assert store.put("mv", memoryview(b"xmvx")[1:3]) == 0 and store.get("mv") == b"mv"
        assert store.put("np", np.arange(4, dtype=np.uint16)) == 0 and store.get_size("np") == 8
        assert store.put("arr", array.array("i", [1, 2])) == 0 and store.get_size("arr") == 8
        assert store.put_parts("pp", b"a", bytearray(b"b"), np.frombuffer(b"c", dtype=np.uint8)) == 0
        assert store.put_batch(("t1", "t2"), (b"1", bytearray(b"2"))) == 0
        assert store.get_batch(("t1", "t2")) == [b"1", b"2"] and store.get_batch(np.array(["t2"])) == [b"2"]
        assert store.batch_is_exist(("t1", "zz")) == [1, 0] and store.remove("pp", force=np.bool_(True)) == 0
        buf[:4] = [1, 2, 3, 4]
        assert store.put_from("zc", np.uint64(ptr), np.int32(4)) == 0
        assert store.get_into("zc", ptr + 100, np.uint64(64)) == 4 and buf[100:104].tolist() == [1, 2, 3, 4]
        assert store.batch_put_from(("z1", "z2"), np.array([ptr, ptr + 1], dtype=np.uint64), range(1, 3)) == [0, 0]
        assert store.batch_get_into(["z1", "z2"], (ptr + 200, ptr + 300), [8, 8]) == [1, 2]
        assert store.batch_put_from_multi_buffers(["zm"], ((ptr, ptr + 2),), [(1, np.int64(1))]) == [0]
        assert store.batch_get_into_multi_buffers(("zm",), [[ptr + 400]], [[2]], 0) == [2]
        assert store.get_into_ranges((ptr + 500,), (("zm",),), [[(0,)]], [[(1,)]], [[(1,)]]) == [[[1]]]
        assert buf[400:402].tolist() == [1, 3] and buf[500] == 3
        assert store.put_tensor("tt", T) == 0 and torch.equal(store.get_tensor("tt"), T)
        assert store.put_tensor_with_tp("tp", T, tp_rank=np.int64(0), tp_size=np.int64(2)) == 0
        assert torch.equal(store.get_tensor_with_tp("tp", np.int64(1), 2), T[2:])
        assert store.remove_all(force=1) >= 1
    finally:
        assert store.unregister_buffer(ptr) == 0


def test_key_length_limit(store, master, monkeypatch):
    assert MAX_KEY_BYTES == 65536
    at, past = "k" * MAX_KEY_BYTES, "k" * (MAX_KEY_BYTES + 1)
    wide = "é" * (MAX_KEY_BYTES // 2)  # 2 UTF-8 bytes a char: at the limit
    for key in ("k" * 4096, at, wide):
        assert store.put(key, b"long") == 0, len(key)
        assert store.get(key) == b"long" and store.is_exist(key) == 1 and store.get_size(key) == 4
        assert store.batch_is_exist([key, key[:-1] + "x"]) == [1, 0] and store.get_batch([key]) == [b"long"]
        assert len(store.get_replica_desc(key)) == 1
    assert store.upsert(at, b"longer") == 0 and store.get(at) == b"longer"
    assert store.put_batch([at[:-1] + "a", at[:-1] + "b"], [b"A", b"B"]) == 0  # two-call path (BatchPutStart)
    assert store.get_batch([at[:-1] + "a", at[:-1] + "b"]) == [b"A", b"B"]
    assert store.remove_by_regex("^k+[ab]$", force=True) == 2
    for key in (past, wide + "x"):
        assert store.put(key, b"v") == E.INVALID_PARAMS and store.upsert(key, b"v") == E.INVALID_PARAMS
        assert store.get(key) == b"" and store.get_size(key) == E.INVALID_PARAMS
        assert store.is_exist(key) == E.INVALID_PARAMS and store.remove(key) == E.INVALID_PARAMS
        assert store.batch_is_exist([key, at]) == [-1, 1] and store.get_batch([key, at]) == [b"", b"longer"]
    assert store.remove(at, force=True) == 0 and store.remove("k" * 4096, force=True) == 0
    monkeypatch.setenv("MC_STORE_FAST_RPC", "0")  # the gRPC door takes the same keys
    with local_store(master.address) as grpc_store:
        assert grpc_store._master._fast is None
        assert grpc_store.put(at, b"grpc") == 0 and grpc_store.get(at) == b"grpc"
        assert grpc_store.put(past, b"v") == E.INVALID_PARAMS


def test_key_length_limit_in_the_ssd_tier(tmp_path, master):
    at = "s" * MAX_KEY_BYTES
    d = DiskTier(str(tmp_path / "unit"), capacity=MiB)
    try:
        assert d.submit(at, b"on disk") and d.submit(at[:-1] + "t", b"other")
        d.flush()
        assert d.read(at) == (b"on disk", False) and d.read(at[:-1] + "t")[0] == b"other"
    finally:
        d.close()
    names = [n for n in os.listdir(tmp_path / "unit") if not n.startswith(".")]  # not the disk id
    assert len(names) == 2 and all(len(n) == 40 for n in names)  # files are named by a hash of the key
    d = DiskTier(str(tmp_path / "unit"), capacity=MiB)  # a restart rebuilds the index from the files
    try:
        assert sorted(k for k, _, _ in d.entries()) == [at, at[:-1] + "t"]
    finally:
        d.close()

    # End to end: the owner persists a 64 KiB key, the master records the file, memory eviction leaves only
    # the disk replica, and another client reads it through the owner's DiskReplicaService.
    owner = MooncakeDistributedStore()
    assert owner.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                        "global_segment_size": "8MB", "local_buffer_size": "8MB", "master_server_addr": master.address,
                        "enable_ssd_offload": True, "ssd_offload_path": str(tmp_path / "tier")}) == 0
    value = np.random.default_rng(5).integers(0, 256, 512 << 10, dtype=np.uint8).tobytes()
    try:
        assert owner.put(at, value) == 0 and owner._flush_disk()
        assert [r.is_local_disk_replica() for r in owner.get_replica_desc(at)] == [False, True]
        time.sleep(0.3)  # the lease of that lookup (200 ms) ends: the object may be evicted
        for i in range(30):  # 15 MiB into the 8 MiB segment: the persisted object is evicted first
            assert owner.put(f"fill{i}", value) == 0
        assert [r.is_local_disk_replica() for r in owner.get_replica_desc(at)] == [True]
        with local_store(master.address, segment="0") as reader:
            assert reader.get(at) == value
    finally:
        owner.remove_all(force=True)
        owner.close()


# Every batch method with empty lists, and what it answers.
EMPTY = {
    "put_batch": (([], []), 0), "upsert_batch": (([], []), 0), "get_batch": (([],), []),
    "batch_get_buffer": (([],), []), "batch_is_exist": (([],), []), "batch_remove": (([],), []),
    "batch_put_from": (([], [], []), []), "batch_upsert_from": (([], [], []), []),
    "batch_put_from_multi_buffers": (([], [], []), []), "batch_get_into": (([], [], []), []),
    "batch_get_into_multi_buffers": (([], [], []), []), "get_into_ranges": (([], [], [], [], []), []),
    "batch_get_replica_desc": (([],), {}), "batch_replica_clear": (([],), []),
    "batch_put_tensor": (([], []), []), "batch_pub_tensor": (([], []), []), "batch_upsert_tensor": (([], []), []),
    "batch_upsert_pub_tensor": (([], []), []), "batch_put_tensor_with_tp": (([], []), []),
    "batch_put_tensor_from": (([], [], []), []), "batch_upsert_tensor_from": (([], [], []), []),
    "batch_get_tensor": (([],), []), "batch_get_tensor_with_tp": (([],), []),
    "batch_get_tensor_into": (([], [], []), []), "batch_get_tensor_with_tp_into": (([], [], []), []),
    "batch_get_session_start": (([],), []), "batch_get_session_end": (([],), 0),
    "batch_get_into_multi_buffer_ranges": (([], [], [], []), []), "batch_put_session_start": (([], []), []),
    "batch_put_from_multi_buffer_ranges": (([], [], [], []), []), "batch_put_session_end": (([],), []),
    "batch_put_session_revoke": (([],), []),
}


def test_batch_calls_answer_once_per_key(store):
    batch_methods = {n for n in GOOD if n.startswith("batch_") or n.endswith("_batch") or n == "get_into_ranges"}
    assert batch_methods == set(EMPTY)
    for name, (args, want) in EMPTY.items():
        assert getattr(store, name)(*args) == want, name
    miss = ["m1", "m2"]
    assert store.get_batch(miss) == [b"", b""] and store.get_batch([]) == []
    assert store.batch_get_buffer(miss) == [None, None] and store.batch_get_buffer([]) == []
    assert store.batch_is_exist(miss) == [0, 0] and store.batch_remove(miss) == [E.OBJECT_NOT_FOUND] * 2
    assert store.batch_get_tensor(miss) == [None, None] and store.batch_get_tensor([]) == []
    assert store.put_batch(["d", "d", "e"], [b"first", b"second", b"e"]) == 0  # a put keeps the first
    assert store.get_batch(["d", "m1", "d", "e", "d"]) == [b"first", b"", b"first", b"e", b"first"]
    assert [bytes(h) if h else None for h in store.batch_get_buffer(["d", "m1", "d"])] == [b"first", None, b"first"]
    assert store.batch_is_exist(["d", "m1", "d", ""]) == [1, 0, 1, -1]
    assert store.get_batch(["", "d"]) == [b"", b"first"] and store.batch_remove(["", "m1"]) == [E.INVALID_PARAMS,
                                                                                                  E.OBJECT_NOT_FOUND]
    assert list(store.batch_get_replica_desc(["d", "m1", "d"])) == ["d", "m1"]
    assert store.batch_remove(["d", "d"], force=True) == [0, E.OBJECT_NOT_FOUND]

    buf = np.zeros(MiB, dtype=np.uint8)
    ptr = buf.ctypes.data
    assert store.register_buffer(ptr, buf.nbytes) == 0
    try:
        buf[:8] = np.arange(1, 9)
        assert store.batch_put_from([], [], []) == [] and store.batch_get_into([], [], []) == []
        assert store.batch_put_from(["z", "z", "y"], [ptr, ptr + 1, ptr + 2], [2, 2, 2]) == [0, 0, 0]
        assert store.batch_get_into(["z", "m1", "z", "y"], [ptr + 100, ptr + 200, ptr + 300, ptr + 400],
                                    [8] * 4) == [2, E.OBJECT_NOT_FOUND, 2, 2]
        assert buf[300:302].tolist() == [1, 2] and buf[400:402].tolist() == [3, 4]
        assert store.batch_put_from(["a", "b", "c"], [ptr], [1, 2]) == [E.INVALID_PARAMS] * 3  # mismatched lists
        assert store.batch_get_into(["a", "b"], [ptr], [1]) == [E.INVALID_PARAMS] * 2
        assert store.batch_put_from_multi_buffers(["w", "w"], [[ptr], [ptr + 1]], [[3], [3]]) == [0, 0]
        assert store.batch_put_from_multi_buffers([], [], []) == []
        assert store.batch_get_into_multi_buffers(["w", "m1", "w"], [[ptr + 500], [ptr + 600], [ptr + 700]],
                                                  [[4], [4], [4]]) == [3, E.OBJECT_NOT_FOUND, 3]
        assert store.batch_get_into_multi_buffers(["w", "x"], [[ptr]], [[1]]) == [E.INVALID_PARAMS] * 2
        assert store.get_into_ranges([ptr + 800], [["w", "m1", "w"]], [[[0], [0], [1, 2]]], [[[0], [0], [0, 1]]],
                                     [[[1], [1], [1, 1]]]) == [[[1], [E.OBJECT_NOT_FOUND], [1, 1]]]
        assert store.get_into_ranges([ptr, ptr], [["w"]], [[[0]]], [[[0]]], [[[1]]]) == \
            [[[E.INVALID_PARAMS]], []]  # mismatched outer lists: one answer per key still
        assert store.get_into_ranges([], [], [], [], []) == []
        assert store.batch_upsert_from(["u", "v"], [ptr, ptr], [1, 2]) == [0, 0]
        r = store.batch_upsert_from(["u", "u", "v"], [ptr, ptr, ptr], [3, 4, 5])
        assert len(r) == 3 and r[0] == 0 and r[2] == 0  # (the second "u" finds the first one's write busy)
        assert store.batch_get_tensor_into(["w", "m1", "w"], [ptr], [8]) == [None] * 3  # mismatched: every key
        assert store.batch_put_tensor_from(["raw", "raw"], [ptr, ptr], [8, 8]) == [0, 0]  # bytes, not a tensor
        assert store.batch_get_tensor_into(["raw", "m1"], [ptr, ptr], [8, 8]) == [None, None]
        assert store.batch_put_tensor(["tz"], [T]) == [0]
        got = store.batch_get_tensor_into(["tz", "m1", "tz"], [ptr, ptr + 4096, ptr + 8192], [4096] * 3)
        assert [g is None for g in got] == [False, True, False] and torch.equal(got[0], T) and torch.equal(got[2], T)
    finally:
        assert store.unregister_buffer(ptr) == 0

    t2 = torch.ones(3, dtype=torch.float32)
    assert store.batch_put_tensor(["t", "t", "s"], [T, t2, t2]) == [0, 0, 0]
    got = store.batch_get_tensor(["t", "m1", "t", "s"])
    assert [g is None for g in got] == [False, True, False, False] and torch.equal(got[0], T) and torch.equal(got[2], T)
    assert store.batch_put_tensor(["t", "s"], [T]) == [E.INVALID_PARAMS] * 2
    assert store.batch_upsert_tensor([], []) == [] and store.batch_put_tensor_with_tp([], []) == []
    assert store.batch_put_tensor_with_tp(["p", "p"], [T, T], tp_size=2) == [0, 0]
    assert [g is None for g in store.batch_get_tensor_with_tp(["p", "m1", "p"], tp_rank=1, tp_size=2)] == \
        [False, True, False]
    assert store.batch_get_tensor_with_tp(["p", "p"], tp_rank=5, tp_size=2) == [None, None]
    assert store.batch_upsert_pub_tensor(["t", "m1"], [t2, t2], RC) == [0, 0] and store.remove("m1", force=True) == 0

    s = MooncakeDistributedStore()  # before setup: still one entry per key
    assert s.get_batch(miss) == [b"", b""] and s.batch_is_exist(miss) == [-1, -1] and s.batch_remove(miss) == [-1, -1]
    assert s.batch_get_buffer(miss) == [None, None] and s.batch_get_into(miss, [1, 2], [1, 1]) == [-1, -1]
    assert s.batch_get_tensor(miss) == [None, None] and s.batch_put_tensor(miss, [T, T]) == [-1, -1]
    assert s.get_into_ranges([1], [miss], [[[0], [0, 1]]], [[[0], [0, 1]]], [[[1], [1, 1]]]) == [[[-1], [-1, -1]]]

