"""MooncakeHostMemAllocator, its C entry points and bind_to_numa_node (host_memory.py, host_memory.cc):
blocks used with a store end to end (another process holds the segment), the C functions called through
ctypes as LMCache calls them, frees of foreign / interior / freed pointers, concurrency, NUMA binding."""

import ctypes
import logging
import os
import platform
import threading

import numpy as np
import pytest

from mooncake.store import (MooncakeHostMemAllocator, ReplicateConfig, bind_to_numa_node, get_alloc_func_addr,
                            get_free_func_addr)
from mooncake.store.client.host_memory import ERR_NUMA
from mooncake.store.client.testing import StoreWorker, local_store
from mooncake.store.master.testing import MasterProcess

PAGE = os.sysconf("SC_PAGESIZE")
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)  # the documented C signatures
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def view(ptr, n):
    return np.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=np.uint8)


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=300", "--eviction_high_watermark_ratio=1.0")
    yield m
    m.stop()


def test_alloc_gives_zeroed_page_aligned_writable_blocks():
    a = MooncakeHostMemAllocator()
    before = a.live_blocks()
    ptr = a.alloc(PAGE + 1)
    assert ptr and ptr % PAGE == 0 and a.block_size(ptr) == 2 * PAGE
    v = view(ptr, PAGE + 1)
    assert not v.any()
    v[:] = 7
    assert view(ptr, PAGE + 1).sum() == 7 * (PAGE + 1)
    assert a.live_blocks() == before + 1
    MooncakeHostMemAllocator().free(ptr)  # instances share the pool
    assert a.block_size(ptr) == 0 and a.live_blocks() == before


def test_bad_sizes_and_types():
    a = MooncakeHostMemAllocator()
    assert a.alloc(0) == 0 and a.alloc(-5) == 0 and a.alloc(1 << 70) == 0
    assert a.alloc(1 << 62) == 0  # more than the kernel will map: 0, not an exception
    for bad in ("1", 1.5, None, True):
        with pytest.raises(TypeError, match="size must be an int"):
            a.alloc(bad)
        with pytest.raises(TypeError, match="ptr must be an int"):
            a.free(bad)


def test_free_refuses_foreign_interior_and_freed_pointers():
    a = MooncakeHostMemAllocator()
    ptr = a.alloc(3 * PAGE)
    view(ptr, 3 * PAGE)[:] = 9
    foreign = np.full(4 * PAGE, 5, dtype=np.uint8)
    for bad in (foreign.ctypes.data, ptr + PAGE, ptr + 1, 1 << 70, -1):
        with pytest.raises(ValueError, match="not a block of this allocator"):
            a.free(bad)
    assert (foreign == 5).all() and (view(ptr, 3 * PAGE) == 9).all()  # nothing was touched
    a.free(0)  # like free(NULL)
    a.free(ptr)
    with pytest.raises(ValueError, match="already freed"):
        a.free(ptr)


def test_c_entry_points_through_ctypes(capfd):
    alloc_addr, free_addr = get_alloc_func_addr(), get_free_func_addr()
    assert alloc_addr and free_addr and alloc_addr != free_addr
    assert get_alloc_func_addr() == alloc_addr  # stable for the life of the process
    c_alloc, c_free = ALLOC_FN(alloc_addr), FREE_FN(free_addr)
    a = MooncakeHostMemAllocator()
    before = a.live_blocks()
    ptr = c_alloc(1 << 20)
    assert ptr and a.block_size(ptr) == 1 << 20
    ctypes.memset(ptr, 0xAB, 1 << 20)
    assert view(ptr, 1 << 20)[-1] == 0xAB
    assert c_alloc(0) is None  # NULL
    c_free(ptr)
    assert a.live_blocks() == before
    capfd.readouterr()
    c_free(ptr)  # double free through C: reported, no crash
    foreign = np.zeros(PAGE, dtype=np.uint8)
    c_free(foreign.ctypes.data)
    c_free(None)  # free(NULL): silent
    err = capfd.readouterr().err
    assert err.count("ignored: not a block of this allocator") == 2, err
    # blocks from the C function can be freed by the class and the other way round
    p1, p2 = c_alloc(100), a.alloc(100)
    a.free(p1)
    c_free(p2)
    assert a.live_blocks() == before


def test_concurrent_alloc_free():
    a = MooncakeHostMemAllocator()
    before = a.live_blocks()
    c_alloc, c_free = ALLOC_FN(get_alloc_func_addr()), FREE_FN(get_free_func_addr())
    errors = []

    def worker(seed):
        try:
            rng = np.random.default_rng(seed)
            held = []
            for _ in range(300):
                if held and rng.random() < 0.5:
                    p, n, fill = held.pop(int(rng.integers(len(held))))
                    assert (view(p, n) == fill).all()
                    (c_free if fill % 2 else a.free)(p)
                else:
                    n = int(rng.integers(1, 5 * PAGE))
                    p = c_alloc(n) if seed % 2 else a.alloc(n)
                    fill = int(rng.integers(256))
                    view(p, n)[:] = fill
                    held.append((p, n, fill))
            for p, _, _ in held:
                a.free(p)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert a.live_blocks() == before


def test_blocks_serve_zero_copy_store_calls(master):
    """put_from out of an allocator block into a segment another process holds, get_into another block."""
    a = MooncakeHostMemAllocator()
    n = 3 << 20
    src, dst = a.alloc(n), a.alloc(n)
    worker = StoreWorker(master.address, segment="32MB", buffer="8MB")
    try:
        with local_store(master.address, segment="0", buffer="8MB") as store:
            data = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
            view(src, n)[:] = data
            assert store.register_buffer(src, n) == 0 and store.register_buffer(dst, n) == 0
            assert store.put_from("hm/one", src, n, ReplicateConfig()) == 0
            assert worker.call("get", "hm/one") == data.tobytes()  # the bytes reached the other process
            assert store.get_into("hm/one", dst, n) == n
            assert (view(dst, n) == data).all()
            half = n // 2
            assert store.batch_put_from(["hm/a", "hm/b"], [src, src + half], [half, half]) == [0, 0]
            view(dst, n)[:] = 0
            assert store.batch_get_into(["hm/b", "hm/a"], [dst, dst + half], [half, half]) == [half, half]
            assert (view(dst, half) == data[half:]).all() and (view(dst + half, half) == data[:half]).all()
            assert store.unregister_buffer(src) == 0 and store.unregister_buffer(dst) == 0
    finally:
        worker.stop()
    a.free(src)
    a.free(dst)


# --- NUMA ---------------------------------------------------------------------------------------------
_GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}.get(platform.machine())
MPOL_PREFERRED, MPOL_F_NODE, MPOL_F_ADDR = 1, 1, 2


def node_cpus(node):
    cpus = set()
    with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
        for part in f.read().strip().split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def mempolicy(addr=None):
    """(mode, nodemask) of the calling thread, or the node of the page at addr; None if the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    mode, mask = ctypes.c_int(-1), ctypes.c_ulong(0)
    flags = MPOL_F_NODE | MPOL_F_ADDR if addr else 0
    rc = libc.syscall(_GET_MEMPOLICY, ctypes.byref(mode), ctypes.byref(mask), ctypes.c_ulong(64),
                      ctypes.c_void_p(addr), ctypes.c_ulong(flags))
    return None if rc != 0 else (mode.value, mask.value)


def in_thread(fn):
    """fn() on a fresh thread (affinity and memory policy are per thread: the test's own stay as they are)."""
    out = {}
    t = threading.Thread(target=lambda: out.update(r=fn()))
    t.start()
    t.join(30)
    return out["r"]


@pytest.mark.skipif(not os.path.exists("/sys/devices/system/node/node0"), reason="no NUMA information in sysfs")
def test_bind_to_numa_node(caplog):
    allowed = os.sched_getaffinity(0)

    def bind():
        os.sched_setaffinity(0, {min(allowed)})  # narrower than the node, so that binding visibly widens it
        caplog.clear()
        rc = bind_to_numa_node(0)
        a = MooncakeHostMemAllocator()
        p = a.alloc(PAGE)
        ctypes.memset(p, 1, PAGE)  # the page appears now, under the new policy
        out = rc, os.sched_getaffinity(0), mempolicy(), mempolicy(p), caplog.text
        a.free(p)
        return out

    rc, cpus, policy, page, log = in_thread(bind)
    assert rc == 0, log
    assert node_cpus(0) & allowed <= cpus <= node_cpus(0), (cpus, allowed)
    if policy is None or "memory policy was refused" in log:  # a container's seccomp profile may forbid it
        assert "memory policy was refused" in log, log
    else:
        assert policy == (MPOL_PREFERRED, 1), policy
        assert page is None or page[0] == 0, page
    assert os.sched_getaffinity(0) == allowed  # this thread kept its own


def test_bind_to_missing_numa_node(caplog):
    def bind(node):
        before = (os.sched_getaffinity(0), mempolicy())
        with caplog.at_level(logging.ERROR, logger="mooncake.store"):
            caplog.clear()
            rc = bind_to_numa_node(node)
        return rc, before == (os.sched_getaffinity(0), mempolicy()), caplog.text

    for node in (4095, -1, 1 << 40):
        rc, unchanged, log = in_thread(lambda: bind(node))
        assert rc == ERR_NUMA and unchanged and "does not exist" in log, (node, rc, log)
    with pytest.raises(TypeError, match="node must be an int"):
        bind_to_numa_node("0")
