"""Zero-copy store calls with "device" buffers, on the host emulation (MC_PLATFORM_EMULATION=1: memfd memory the
platform classifies as cuda:0; not a GPU): register_buffer of a device pointer, put_from / get_into and their batch
forms through it, the objects living in another client's (host) segment, so every byte crosses the Transfer
Engine, which stages device memory through pinned host buffers (tcp). A store with a segment of its own copies
between that (host) segment and a device buffer with the platform's copy, never memmove."""

import hashlib
import json

import numpy as np
import pytest

from mooncake._native import platform
from mooncake.store.client.testing import StoreWorker, local_store
from mooncake.store.master.testing import MasterProcess

MiB = 1 << 20
SIZE = 8 * MiB


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=300")
    yield m
    m.stop()


@pytest.fixture(scope="module")
def holder(master):
    w = StoreWorker(master.address, segment="64MB", buffer="8MB")  # where the objects land
    yield w
    w.stop()


@pytest.fixture()
def device():
    emu = platform.get("host_emulation")
    assert emu.probe()["usable"], emu.probe()
    ptr = emu.allocate(SIZE, "device", 0)
    assert platform.classify(ptr) == "cuda:0"
    yield emu, ptr
    emu.free(ptr, SIZE, "device")


def fill(emu, ptr, n, seed):
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    emu.copy(ptr, data.ctypes.data, n)
    return data


def read(emu, ptr, n):
    out = np.empty(n, dtype=np.uint8)
    emu.copy(out.ctypes.data, ptr, n)
    return out


def sha(a) -> str:
    return hashlib.sha256(a).hexdigest()


def test_put_from_and_get_into_device_memory(master, holder, device):
    emu, ptr = device
    with local_store(master.address, segment="0") as s:
        assert s.register_buffer(ptr, SIZE) == 0
        data = fill(emu, ptr, 3 * MiB + 17, seed=1)
        assert s.put_from("dev/one", ptr, data.size) == 0
        # The object is in the holder's host segment, byte for byte.
        assert sha(np.frombuffer(holder.call("get", "dev/one"), dtype=np.uint8)) == sha(data)
        emu.copy(ptr + 4 * MiB, np.zeros(data.size, dtype=np.uint8).ctypes.data, data.size)
        assert s.get_into("dev/one", ptr + 4 * MiB, data.size) == data.size
        assert sha(read(emu, ptr + 4 * MiB, data.size)) == sha(data)
        assert s.unregister_buffer(ptr) == 0


def test_batch_forms_with_device_memory(master, holder, device):
    emu, ptr = device
    with local_store(master.address, segment="0") as s:
        assert s.register_buffer(ptr, SIZE) == 0
        n, block = 8, 256 * 1024
        data = fill(emu, ptr, n * block, seed=2)
        keys = [f"dev/batch{i}" for i in range(n)]
        assert s.batch_put_from(keys, [ptr + i * block for i in range(n)], [block] * n) == [0] * n
        half = SIZE // 2
        emu.copy(ptr + half, np.zeros(n * block, dtype=np.uint8).ctypes.data, n * block)
        got = s.batch_get_into(keys, [ptr + half + i * block for i in range(n)], [block] * n)
        assert got == [block] * n
        assert sha(read(emu, ptr + half, n * block)) == sha(data)
        # This process's engine staged its device memory through pinned buffers (emulated device memory is host
        # memory, so only these counters tell staging from a plain copy); nothing went over the same-host
        # transport, which declines device memory.
        stats = json.loads(s._engine.get_stats())
        staging = stats["listeners"]["tcp"]["staging"]
        assert staging["copies"] >= 2 * n and staging["copied_bytes"] >= 2 * n * block, staging
        assert sum(p["bytes"] for p in stats.get("shm", {}).values()) == 0, stats.get("shm")
        assert s.unregister_buffer(ptr) == 0


class _RecordingPlatform:
    """The real platform, with its copies counted (device_memory.py must pick it for device buffers)."""

    def __init__(self, real) -> None:
        self.real, self.copies = real, 0

    def copy(self, dst, src, n):
        self.copies += 1
        self.real.copy(dst, src, n)


def test_own_segment_copies_of_device_memory_use_the_platform(master, device, monkeypatch):
    from mooncake.store import ReplicateConfig
    from mooncake.store.client import device_memory

    emu, ptr = device
    rec = _RecordingPlatform(emu)
    monkeypatch.setattr(device_memory, "_platform_for", lambda kind: rec if kind.startswith("cuda") else None)
    with local_store(master.address, segment="32MB") as s:
        here = ReplicateConfig(preferred_segments=[s.get_hostname()])
        assert s.register_buffer(ptr, SIZE) == 0
        data = fill(emu, ptr, MiB + 5, seed=3)
        assert s.put_from("dev/own", ptr, data.size, here) == 0
        assert rec.copies == 1  # into the own segment, by the platform
        emu.copy(ptr + 2 * MiB, np.zeros(data.size, dtype=np.uint8).ctypes.data, data.size)
        assert s.get_into("dev/own", ptr + 2 * MiB, data.size) == data.size
        assert rec.copies == 2
        assert sha(read(emu, ptr + 2 * MiB, data.size)) == sha(data)
        n, block = 4, 128 * 1024
        batch = fill(emu, ptr, n * block, seed=4)
        keys = [f"dev/own{i}" for i in range(n)]
        assert s.batch_put_from(keys, [ptr + i * block for i in range(n)], [block] * n, here) == [0] * n
        half = SIZE // 2
        assert s.batch_get_into(keys, [ptr + half + i * block for i in range(n)], [block] * n) == [block] * n
        assert sha(read(emu, ptr + half, n * block)) == sha(batch)
        assert rec.copies >= 2 + 2 * n
        # Host memory still takes memmove: a host buffer registered beside it adds no platform copy.
        host = np.arange(4096, dtype=np.uint8)
        assert s.register_buffer(host.ctypes.data, host.nbytes) == 0
        before = rec.copies
        assert s.put_from("host/own", host.ctypes.data, host.nbytes, here) == 0
        assert rec.copies == before and s.get("host/own") == host.tobytes()
        assert s.unregister_buffer(host.ctypes.data) == 0 and s.unregister_buffer(ptr) == 0


def test_a_copy_over_a_device_buffers_edge_is_refused():
    """Neither memmove (device pointer) nor one platform copy (past the allocation) is safe for a range that
    runs over a registered device buffer's edge: nothing is copied."""
    from mooncake.store.client.device_memory import DeviceBuffers

    class CountingPlatform:
        calls = 0

        def copy(self, dst, src, n):
            CountingPlatform.calls += 1

    host = np.zeros(8192, dtype=np.uint8)
    dst = np.full(8192, 7, dtype=np.uint8)
    base = host.ctypes.data + 4096  # stands for a device buffer [base, base + 2048)
    bufs = DeviceBuffers()
    bufs._add(base, 2048, CountingPlatform())
    assert not bufs.copy(dst.ctypes.data, base + 1024, 2048, device_side=base + 1024)  # runs off the end
    assert not bufs.copy(dst.ctypes.data, base - 1024, 2048, device_side=base - 1024)  # host running into it
    assert CountingPlatform.calls == 0 and (dst == 7).all()
    assert bufs.copy(dst.ctypes.data, base, 2048, device_side=base) and CountingPlatform.calls == 1
    assert bufs.copy(dst.ctypes.data, host.ctypes.data, 4096, device_side=host.ctypes.data)  # host only
    assert (dst[:4096] == 0).all()
