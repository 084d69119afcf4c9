"""Tensor API against a real master: header layout (reference §2.3), round trips of every dtype, TP shards,
zero-copy forms, and a second process reading tensors this one wrote."""

import struct

import numpy as np
import pytest
import torch

from mooncake.store import _deserialize_tensor, _serialize_tensor, _tensor_metadata_size
from mooncake.store.client.testing import StoreWorker, local_store
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess

MiB = 1 << 20


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=200")
    yield m
    m.stop()


@pytest.fixture
def store(master):
    with local_store(master.address) as s:
        yield s


def test_header_layout():
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    raw = _serialize_tensor(t)
    assert _tensor_metadata_size() == 304 and len(raw) == 304 + 24
    magic, version, hsize, dtype, ndim, layout, _, offset, nbytes = struct.unpack_from("<IHHiiIIQQ", raw)
    assert (magic, version, hsize, dtype, ndim, layout, offset, nbytes) == (0x4D4F4F4E, 1, 304, 6, 2, 0, 304, 24)
    shapes = struct.unpack_from("<8q8qII", raw, 40)
    assert shapes[:8] == (2, 3, -1, -1, -1, -1, -1, -1) and shapes[8:16] == shapes[:8] and shapes[16] == 0
    assert raw[304:] == t.numpy().tobytes()
    assert torch.equal(_deserialize_tensor(raw), t)
    with pytest.raises(ValueError):
        _deserialize_tensor(b"x" * 400)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
                                   torch.int32, torch.int64, torch.bool, torch.float16, torch.bfloat16])
def test_round_trip_dtypes(store, dtype):
    t = (torch.rand(4, 5, 3) * 100).to(dtype)
    assert store.put_tensor("t", t) == 0
    got = store.get_tensor("t")
    assert got.dtype == dtype and got.shape == t.shape and torch.equal(got, t)


def test_tensor_api(store):
    assert store.get_tensor("missing") is None
    with pytest.raises(TypeError):  # not a tensor (api_types_test.py)
        store.put_tensor("bad", [1, 2])
    nc = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous
    scalar = torch.tensor(3.5)
    assert store.batch_put_tensor(["nc", "s"], [nc, scalar]) == [0, 0]
    got = store.batch_get_tensor(["nc", "s", "missing"])
    assert torch.equal(got[0], nc) and torch.equal(got[1], scalar) and got[2] is None
    assert store.upsert_tensor("s", torch.ones(2)) == 0 and torch.equal(store.get_tensor("s"), torch.ones(2))
    big = torch.rand(3 * MiB // 4)
    assert store.pub_tensor("big", big) == 0 and torch.equal(store.get_tensor("big"), big)


def test_tp_shards(store):
    t = torch.arange(24.0).reshape(4, 6)
    assert store.put_tensor_with_tp("w", t, tp_size=2, split_dim=1) == 0
    assert torch.equal(store.get_tensor_with_tp("w", tp_rank=1, tp_size=2, split_dim=1), t[:, 3:])
    raw = store.get("w_tp_1")
    assert struct.unpack_from("<I", raw, 16)[0] == 1  # layout SHARD
    shapes = struct.unpack_from("<8q8qII", raw, 40)
    assert shapes[:2] == (4, 6) and shapes[8:10] == (4, 3) and shapes[16] == 1
    assert struct.unpack_from("<6i", raw, 176) == (1, 0, 1, 2, 1, 0)
    assert store.batch_put_tensor_with_tp(["a", "b"], [t, t * 2], tp_size=2) == [0, 0]
    got = store.batch_get_tensor_with_tp(["a", "b"], tp_rank=0, tp_size=2)
    assert torch.equal(got[0], t[:2]) and torch.equal(got[1], t[:2] * 2)


def test_zero_copy_tensors(store):
    buf = np.zeros(MiB, dtype=np.uint8)
    ptr = buf.ctypes.data
    assert store.register_buffer(ptr, buf.nbytes) == 0
    t = torch.randn(16, 16)
    raw = _serialize_tensor(t)
    buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    assert store.put_tensor_from("zt", ptr, len(raw)) == 0
    view = store.get_tensor_into("zt", ptr + 512 * 1024, 512 * 1024)
    assert torch.equal(view, t) and view.data_ptr() == ptr + 512 * 1024 + 304
    assert store.get_tensor_into("zt", ptr, 100) is None  # buffer too small
    assert store.batch_get_tensor_into(["zt", "missing"], [ptr + 4096, ptr], [8192, 8192])[1] is None
    store.unregister_buffer(ptr)


def test_tensor_read_by_another_process(store, master):
    w = StoreWorker(master.address)
    try:
        t = torch.randn(64, 128)
        assert store.put_tensor("shared", t, ) == 0
        raw = w.call("get", "shared")
        assert torch.equal(_deserialize_tensor(raw), t)
        assert w.call("put", "from-worker", _serialize_tensor(t * 3)) == 0
        assert torch.equal(store.get_tensor("from-worker"), t * 3)
    finally:
        w.stop()
