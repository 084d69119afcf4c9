"""The store calls of vLLM 0.33.0, SGLang 0.5.23 and LMCache 0.5.6, row by row of
shared/reference/client-callsites.md: each test makes one client's calls with the argument kinds and call
shapes listed there (our own code, not the clients') against a real master and a peer client process, and
checks the return conventions each client relies on. Layer-wise sessions, setup_dummy and the shared engine
have their own tests (sessions_test, standalone_test, shared_engine_test); here only their call shapes."""

import asyncio
import ctypes
import urllib.request

import numpy as np
import pytest
import torch

from mooncake.store import (MooncakeDistributedStore, MooncakeHostMemAllocator, ObjectDataType, ReplicateConfig,
                            bind_to_numa_node)
from mooncake.store.client.config import SetupConfig, parse_size
from mooncake.store.client.testing import StoreWorker
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess

MiB = 1 << 20
EC_SAFE_PUT = {-200, -703, -704, -705, -900, -901, -1700}  # vLLM EC: rejections it takes in its stride
EC_SAFE_GET = {-200, -600, -702, -703, -704, -705, -707, -900, -901}


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=300", "--eviction_high_watermark_ratio=1.0")
    yield m
    m.stop()


@pytest.fixture(scope="module")
def peer(master):
    w = StoreWorker(master.address, segment="64MB", buffer="4MB")
    yield w
    w.stop()


def _setup7(master, segment=32 * MiB, buffer=16 * MiB, **kw):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", segment, buffer, "tcp", "", master.address, **kw) == 0
    return s


def _close(s):
    s.remove_all(force=True)
    assert s.close() == 0


def test_protocol_names_of_the_clients_configs():
    """vLLM and SGLang default to "rdma", LMCache to "tcp": Mooncake's names reach the Transfer Engine (which
    serves them where this build has the transport); a name Mooncake does not know is a bad value."""
    base = ("127.0.0.1", "P2PHANDSHAKE", "4gb", "64MB")
    for proto in ("tcp", "rdma", "RDMA", "efa", "nvlink", "ascend"):
        assert SetupConfig.from_args(base + (proto, "", "m:1"), {}).protocol == proto.lower()
    with pytest.raises(ValueError, match="unknown protocol"):
        SetupConfig.from_args(base + ("bogus", "", "m:1"), {})
    assert parse_size("4gb") == 4 << 30 and parse_size("3355443200") == 3355443200  # SGLang's / LMCache's sizes


def test_vllm_store_connector(master, peer):
    """kv_connector/v1/mooncake/store/worker.py + distributed/mooncake_store.py."""
    s = _setup7(master, tenant_id="tenant-a")  # 7 positionals (ints parsed), tenant_id only when not "default"
    try:
        rc = ReplicateConfig()
        rc.preferred_segment = peer.hostname
        assert hasattr(rc, "group_ids")
        kv = np.zeros(8 * MiB, dtype=np.uint8)  # one KV cache region
        assert s.register_buffer(kv.ctypes.data, kv.nbytes) == 0
        kv[:MiB] = np.random.default_rng(0).integers(0, 256, MiB, dtype=np.uint8)
        keys = [f"vllm@blk{i}" for i in range(4)]
        layers = 3  # one buffer per layer per key
        addrs = [[kv.ctypes.data + (i * layers + j) * 4096 for j in range(layers)] for i in range(4)]
        sizes = [[4096] * layers for _ in keys]
        assert s.batch_is_exist(keys) == [0, 0, 0, 0]
        rc.group_ids = ["g0"] * len(keys)  # enable_group_semantics: one group id per key of the batch
        assert s.batch_put_from_multi_buffers(keys, addrs, sizes, rc) == [0] * 4
        assert s.batch_is_exist(keys) == [1] * 4
        out = [[kv.ctypes.data + 4 * MiB + (i * layers + j) * 4096 for j in range(layers)] for i in range(4)]
        got = s.batch_get_into_multi_buffers(keys + ["vllm@missing"], out + [out[0]], sizes + [sizes[0]])
        assert got[:4] == [layers * 4096] * 4 and got[4] < 0
        assert (kv[4 * MiB:4 * MiB + 12 * 4096] == kv[:12 * 4096]).all()
        descs = s.batch_get_replica_desc(keys)
        assert set(descs) == set(keys)
        d = descs[keys[0]][0]
        assert d.is_memory_replica() and not d.is_disk_replica() and not d.is_local_disk_replica()
        assert s.remove_all(force=True) >= 4
    finally:
        assert s.close() == 0
    pure = _setup7(master, segment=0)  # mode "standalone-store": no segment of its own
    assert pure.put("vllm@standalone", b"x") == 0 and pure.get("vllm@standalone") == b"x"
    _close(pure)


def test_vllm_ec_embedding_store(master):
    """ec_transfer/ec_connector/mooncake_store_embedding/store_client.py."""
    s = _setup7(master)
    try:
        rc = ReplicateConfig()
        rc.data_type = ObjectDataType.TENSOR
        header = (ctypes.c_uint8 * 24)()  # a ctypes header
        tensor = torch.arange(4096, dtype=torch.float32)
        read = np.zeros(128 * MiB, dtype=np.uint8)  # the registered read buffer
        hp, tp = ctypes.addressof(header), tensor.data_ptr()
        for addr, n in ((hp, 24), (tp, tensor.nbytes), (read.ctypes.data, read.nbytes)):
            assert s.register_buffer(addr, n) == 0
        header[:4] = [1, 2, 3, 4]
        assert s.batch_put_from_multi_buffers(["emb0"], [[hp, tp]], [[24, tensor.nbytes]], rc) == [0]
        again = s.batch_put_from_multi_buffers(["emb0"], [[hp, tp]], [[24, tensor.nbytes]], rc)
        assert again == [0] or again[0] in EC_SAFE_PUT
        keys = ["emb0", "emb-missing"]
        exist = s.batch_is_exist(keys)
        assert len(exist) == len(keys) and exist == [1, 0]
        got = s.batch_get_into(keys + ["emb0"], [read.ctypes.data, read.ctypes.data + MiB, read.ctypes.data + 2 * MiB],
                               [MiB, MiB, 100])  # the last buffer is too small
        assert got[0] == 24 + tensor.nbytes and got[1] in EC_SAFE_GET and got[2] in EC_SAFE_GET
        assert read[:4].tolist() == [1, 2, 3, 4]
        assert np.array_equal(read[24:24 + tensor.nbytes].view(np.float32), tensor.numpy())
        for addr in (hp, tp, read.ctypes.data):
            assert s.unregister_buffer(addr) == 0
    finally:
        s.remove_all(force=True)
        assert s.close() == 0


def _admin(master, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{master.metrics_port}{path}", timeout=10) as r:
        return r.read().decode()


def test_sglang_hicache_store(master, peer):
    """srt/mem_cache/storage/mooncake_store/mooncake_store.py (+ its embedding store)."""
    assert peer.hostname in _admin(master, "/get_all_segments").split()  # check_server: a non-empty body
    s = MooncakeDistributedStore()
    setup = ("127.0.0.1", "P2PHANDSHAKE", parse_size("4gb") // 256, 16 * MiB, "tcp", "", master.address, None)
    with pytest.raises(TypeError):  # an unknown keyword: SGLang retries without its keywords
        s.setup(*setup, some_future_option=True)
    assert s.setup(*setup, enable_ssd_offload=False, ssd_offload_path="", tenant_id="default") == 0
    try:
        warm = b"w" * 4096
        assert s.put("sglang_warmup", warm) == 0 and s.is_exist("sglang_warmup") == 1
        assert s.get("sglang_warmup") == warm
        alloc = MooncakeHostMemAllocator()
        ptr = alloc.alloc(4 * MiB)  # the host KV pool ("mooncake" allocator), wrapped by torch.frombuffer
        assert ptr != 0
        pool = torch.frombuffer((ctypes.c_uint8 * (4 * MiB)).from_address(ptr), dtype=torch.uint8)
        assert s.register_buffer(ptr, 4 * MiB) == 0
        pool[:MiB] = torch.randint(0, 256, (MiB,), dtype=torch.uint8)
        keys = [f"pfx_{h:x}_0_{kv}" for h in range(3) for kv in "kv"]
        assert s.batch_is_exist(keys) == [0] * 6
        page = 8192
        assert s.batch_put_from(keys[:3], [ptr + i * page for i in range(3)], [page] * 3) == [0] * 3
        assert s.batch_put_from(keys[3:], [ptr + i * page for i in range(3, 6)], [page] * 3, ReplicateConfig()) == \
            [0] * 3
        got = s.batch_get_into(keys, [ptr + MiB + i * page for i in range(6)], [page] * 6)
        assert all(g > 0 for g in got) and torch.equal(pool[MiB:MiB + 6 * page], pool[:6 * page])
        mla = ["mla_0", "mla_1"]  # layer_first MLA layout: one buffer per layer
        ptrs = [[ptr + 2 * MiB + (i * 2 + j) * 4096 for j in range(2)] for i in range(2)]
        assert s.batch_put_from_multi_buffers(mla, ptrs, [[4096, 4096]] * 2, ReplicateConfig()) == [0, 0]
        back = [[ptr + 3 * MiB + (i * 2 + j) * 4096 for j in range(2)] for i in range(2)]
        assert all(g > 0 for g in s.batch_get_into_multi_buffers(mla, back, [[4096, 4096]] * 2))
        rc = ReplicateConfig()
        assert hasattr(rc, "group_ids") and not hasattr(rc, "session_ids")  # feature-detected by SGLang
        # mooncake_direct_linker.py: layer-wise loading
        assert s.batch_get_session_start(mla) == [0, 0]
        one = [[ptr + 3 * MiB]] * 2
        assert s.batch_get_into_multi_buffer_ranges(mla, [[ptr + 3 * MiB], [ptr + 3 * MiB + 4096]], [[4096]] * 2,
                                                    [[4096]] * 2) == [4096, 4096]
        assert s.batch_get_into_multi_buffer_ranges(mla, one, [[100]] * 2, [[0]] * 2) == [100, 100]
        assert s.batch_get_session_end(mla) == 0
        assert s.remove_all() >= 0  # clear(): leased objects are skipped
        assert s.unregister_buffer(ptr) == 0
        alloc.free(ptr)
    finally:
        _close(s)
    emb = _setup7(master, tenant_id="default")  # mooncake_embedding_store.py: 7 positionals [, tenant_id]
    assert emb.batch_put_from(["e"], [0], [0]) == [E.INVALID_PARAMS]  # well typed, a bad value
    _close(emb)


def test_lmcache_remote_connector(master, peer):
    """v1/storage_backend/connector/mooncakestore_connector.py: the dict form of strings, zero copy and the
    chunk-metadata byte path; the calls run in threads (asyncio.to_thread / wait_for)."""
    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "33554432",
           "local_buffer_size": "16777216", "protocol": "tcp", "device_name": "",
           "master_server_address": master.address}
    s.setup(cfg)  # the return value is not checked: the calls below must work
    try:
        assert bind_to_numa_node(0) == 0
        rc = ReplicateConfig()
        rc.replica_num = 1
        rc.preferred_segment = s.get_hostname()  # mooncake_prefer_local_alloc
        pinned = torch.zeros(4 * MiB, dtype=torch.uint8)  # the pinned CPU pool: numel() = bytes
        assert s.register_buffer(pinned.data_ptr(), pinned.numel()) == 0
        pinned[:MiB] = torch.randint(0, 256, (MiB,), dtype=torch.uint8)
        p = pinned.data_ptr()

        async def io():
            await asyncio.wait_for(asyncio.to_thread(s.put_from, "lm@0", p, 65536, rc), timeout=5)
            await asyncio.wait_for(asyncio.to_thread(s.batch_put_from, ["lm@1", "lm@2"], [p + 65536, p + 131072],
                                                     [65536, 1000], rc), timeout=5)
            return await asyncio.to_thread(s.batch_get_into, ["lm@0", "lm@2", "lm@none"],
                                           [p + MiB, p + 2 * MiB, p + 3 * MiB], [65536, 65536, 65536])
        got = asyncio.run(io())
        assert got[0] == 65536 and got[1] == 1000 and got[2] <= 0  # n bytes: a partial chunk; <= 0: a miss
        assert torch.equal(pinned[MiB:MiB + 65536], pinned[:65536])
        assert s.get_replica_desc("lm@0")[0].segment_name == s.get_hostname()  # placed locally
        assert bool(s.is_exist("lm@0")) and not s.is_exist("lm@none")
        meta, kv = b"M" * 28, memoryview(pinned[:4096].numpy())  # save_chunk_meta: 28-byte RemoteMetadata + data
        assert s.put_parts("lm@meta", meta, kv) == 0
        bufs = s.batch_get_buffer(["lm@meta", "lm@none"])
        assert bufs[1] is None and bytes(memoryview(bufs[0])) == meta + bytes(kv)
        assert s.unregister_buffer(p) == 0
    finally:
        _close(s)


def test_lmcache_lookup_client(master, peer):
    """v1/lookup_client/mooncake_lookup_client.py: a hard-coded dict ("localhost", no segment), prefix scan."""
    assert peer.call("put", "lk@0", b"a") == 0 and peer.call("put", "lk@1", b"b") == 0
    s = MooncakeDistributedStore()
    s.setup({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "0",
             "local_buffer_size": "16777216", "protocol": "tcp", "device_name": "",
             "master_server_address": master.address})
    try:
        assert s.batch_is_exist(["lk@0", "lk@1", "lk@2", "lk@3"]) == [1, 1, 0, 0]  # "!= 1 stops" at lk@2
    finally:
        s.close()
