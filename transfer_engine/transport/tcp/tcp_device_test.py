"""Device memory over tcp between two processes, on the host emulation platform (memfd "cuda" memory, not a GPU):
host -> device, device -> host and device -> device, writes and reads, at odd offsets and lengths; both sides must
have staged through pinned buffers (their staging counters), and a device kind no platform serves is declined."""

import hashlib
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tcp_device_peer  # noqa: E402  (beside this file)
from tcp_device_peer import DeviceBuffers, DevicePeer, pattern  # noqa: E402

SIZE = 16 << 20


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(a).hexdigest()


@pytest.fixture(scope="module")
def pair():
    engine = tcp_device_peer.new_engine()
    local = DeviceBuffers(engine, SIZE)
    peer = DevicePeer(SIZE)
    yield engine, local, peer
    peer.close()
    engine.close()


def staging(stats: dict) -> dict:
    return stats["listeners"]["tcp"]["staging"]


# (local kind, remote kind, offset, length): odd offsets and lengths not a multiple of the 1 MiB slice.
CASES = [("host", "device", 0, 1 << 20), ("device", "host", 77, (5 << 20) + 123),
         ("device", "device", 4096 + 1, (3 << 20) - 7), ("device", "device", 0, SIZE), ("host", "device", 3, 1)]


@pytest.mark.parametrize("local_kind,remote_kind,offset,length", CASES)
def test_write_moves_device_memory(pair, local_kind, remote_kind, offset, length):
    engine, local, peer = pair
    data = pattern(length, offset + length)
    local.write(local_kind, offset, data)
    remote = peer.info[remote_kind] + offset
    assert engine.transfer_sync_write(peer.segment, local.addr(local_kind) + offset, remote, length) == 0
    assert peer.digest(remote_kind, offset, length) == sha(data)


@pytest.mark.parametrize("local_kind,remote_kind,offset,length", CASES)
def test_read_moves_device_memory(pair, local_kind, remote_kind, offset, length):
    engine, local, peer = pair
    seed = 1000 + offset + length
    peer.call("fill", which=remote_kind, offset=offset, length=length, seed=seed)
    local.write(local_kind, offset, np.zeros(length, dtype=np.uint8))
    remote = peer.info[remote_kind] + offset
    assert engine.transfer_sync_read(peer.segment, local.addr(local_kind) + offset, remote, length) == 0
    assert sha(local.read(local_kind, offset, length)) == sha(pattern(length, seed))


def test_batches_of_device_slices_in_flight_at_once(pair):
    engine, local, peer = pair
    n, block = 32, 256 << 10  # many staged slices in flight on both sides at once
    data = pattern(n * block, 7)
    local.write("device", 0, data)
    bid = engine.batch_transfer_async_write(peer.segment, [local.device + i * block for i in range(n)],
                                            [peer.info["device"] + i * block for i in range(n)], [block] * n)
    assert bid != 0 and engine.get_batch_transfer_status([bid]) == 0
    assert peer.digest("device", 0, n * block) == sha(data)
    bid = engine.batch_transfer_async_read(peer.segment, [local.device + SIZE // 2 + i * block for i in range(n)],
                                           [peer.info["device"] + i * block for i in range(n)], [block] * n)
    assert bid != 0 and engine.get_batch_transfer_status([bid]) == 0
    assert sha(local.read("device", SIZE // 2, n * block)) == sha(data)


def test_both_sides_staged_through_pinned_buffers(pair):
    engine, local, peer = pair
    mine = staging(json.loads(engine.get_stats()))
    theirs = staging(peer.call("stats")["stats"])
    # Every case above staged on the side(s) with device memory: the initiator for its own device buffers, the
    # target for its. Emulated device memory is host memory, so only these counters tell staging from memcpy.
    for s in (mine, theirs):
        assert s["copies"] > 0 and s["copied_bytes"] >= SIZE and s["copy_errors"] == 0, s
        assert s["pinned_bytes"] > 0, s
    # The same-host transport declines device memory, so all of it went over tcp.
    stats = json.loads(engine.get_stats())
    assert sum(p["bytes"] for p in stats.get("shm", {}).values()) == 0, stats.get("shm")
    assert sum(p["bytes"] for p in stats["tcp"].values()) >= 4 * SIZE, stats["tcp"]


def test_a_device_kind_without_a_platform_is_declined(pair):
    engine, local, peer = pair
    buf = np.zeros(1 << 16, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes, "rocm:0") == 0  # no rocm platform here
    try:
        rc = engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.info["host"], buf.nbytes)
        assert rc < 0, "tcp moved rocm memory it cannot stage"
    finally:
        assert engine.unregister_memory(buf.ctypes.data) == 0
