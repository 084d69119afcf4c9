"""Two-process tests of mooncake.engine.TransferEngine over TCP, in both metadata modes.

Both processes run on this host, where the same-host transport would carry the data; MC_FORCE_TCP (inherited
by the peer processes) keeps these tests on the TCP transport. engine_shm_test.py covers the same-host path.
"""

import os

os.environ["MC_FORCE_TCP"] = "1"

import hashlib
import random
import socket
import time

import numpy as np
import pytest

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode
from mooncake.http_metadata_server import HttpMetadataServer
from mooncake.testing.engine_peer import EnginePeer, pattern

MiB = 1 << 20
PEER_SIZE = 128 * MiB


@pytest.fixture(scope="module")
def http_metadata():
    with HttpMetadataServer("127.0.0.1", 0) as server:
        yield server


@pytest.fixture(scope="module", params=["p2p", "http"])
def metadata(request, http_metadata):
    return "P2PHANDSHAKE" if request.param == "p2p" else http_metadata.url


def local_name(metadata, tag):
    # HTTP mode: names are used as-is and must be unique; P2P mode appends the RPC port itself.
    return "127.0.0.1" if metadata == "P2PHANDSHAKE" else f"127.0.0.1:{tag}"


@pytest.fixture(scope="module")
def peer(metadata):
    p = EnginePeer(metadata, local_name(metadata, 30001), PEER_SIZE)
    yield p
    p.close()


@pytest.fixture(scope="module")
def local(metadata, peer):
    engine = TransferEngine()
    assert engine.initialize(local_name(metadata, 30002), metadata, "tcp", "") == 0
    buf = np.zeros(PEER_SIZE, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    yield engine, buf
    engine.close()


def sha(arr):
    return hashlib.sha256(arr).hexdigest()


def test_first_buffer_address_and_probe(local, peer):
    engine, _ = local
    assert engine.get_first_buffer_address(peer.segment) == peer.buffer
    assert engine.send_probe(peer.segment) == 0
    assert engine.get_rpc_port() > 0


def test_probe_of_a_silent_peer_gives_up_after_its_timeout():
    """A peer that accepts connections but never answers (a stopped process) fails the probe in time, with
    TIMEOUT (-400), not as unreachable."""
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0  # P2P: the name is the RPC address
    try:
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(4)
            start = time.monotonic()
            assert engine.send_probe(f"127.0.0.1:{silent.getsockname()[1]}", timeout_ms=300) == -400
            assert time.monotonic() - start < 2.0
    finally:
        engine.close()


def test_random_round_trips_verify_data(local, peer):
    engine, buf = local
    rng = random.Random(1)
    sizes = [1, 7, 4096, 65536, 65537, 1 * MiB + 3, 5 * MiB, 64 * MiB]
    for i, n in enumerate(sizes):
        local_off = rng.randrange(0, PEER_SIZE - n + 1)
        remote_off = rng.randrange(0, PEER_SIZE - n + 1)
        buf[local_off:local_off + n] = pattern(n, i)
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data + local_off, peer.buffer + remote_off, n) == 0
        assert peer.digest(remote_off, n) == sha(buf[local_off:local_off + n])
        peer.call("fill", offset=remote_off, length=n, seed=100 + i)
        assert engine.transfer_sync_read(peer.segment, buf.ctypes.data + local_off, peer.buffer + remote_off, n) == 0
        assert sha(buf[local_off:local_off + n]) == sha(pattern(n, 100 + i))


def test_transfer_sync_with_opcode_and_keywords(local, peer):
    engine, buf = local
    buf[:4096] = pattern(4096, 5)
    rc = engine.transfer_sync(target_hostname=peer.segment, buffer=buf.ctypes.data,
                              peer_buffer_address=peer.buffer, length=4096, opcode=TransferOpcode.Write)
    assert rc == 0
    assert peer.digest(0, 4096) == sha(buf[:4096])
    assert TransferEngine.TransferOpcode.Read == TransferOpcode.Read


def test_numpy_and_torch_buffers_are_used_in_place(local, peer):
    engine, buf = local
    view = buf[: 8192]  # a registered numpy view: passed as an object, not an address
    peer.call("fill", offset=0, length=8192, seed=9)
    assert engine.transfer_sync_read(peer.segment, view, peer.buffer, 8192) == 0
    assert sha(buf[:8192]) == sha(pattern(8192, 9))
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(buf[8192:16384])
    t.fill_(3)
    assert engine.transfer_sync_write(peer.segment, t, peer.buffer, 8192) == 0
    assert peer.digest(0, 8192) == sha(np.full(8192, 3, dtype=np.uint8))
    with pytest.raises(TypeError):
        engine.transfer_sync_read(peer.segment, buf[:8192:2], peer.buffer, 4096)  # strided: would need a copy
    ro = buf[:4096]
    ro.flags.writeable = False
    with pytest.raises(TypeError):
        engine.transfer_sync_read(peer.segment, ro, peer.buffer, 4096)  # destination must be writable
    with pytest.raises(ValueError):
        engine.transfer_sync_write(peer.segment, buf[:100], peer.buffer, 4096)  # object smaller than length


def test_batch_sync_and_async(local, peer):
    engine, buf = local
    n, count = 64 * 1024, 128
    buf[: n * count] = pattern(n * count, 11)
    locals_ = [buf.ctypes.data + i * n for i in range(count)]
    remotes = [peer.buffer + (count - 1 - i) * n for i in range(count)]  # reversed layout on the peer
    assert engine.batch_transfer_sync_write(peer.segment, locals_, remotes, [n] * count) == 0
    expected = np.concatenate([buf[i * n:(i + 1) * n] for i in reversed(range(count))])
    assert peer.digest(0, n * count) == sha(expected)
    buf[: n * count] = 0
    bid = engine.batch_transfer_async_read(peer.segment, locals_, remotes, [n] * count)
    assert bid > 0
    assert engine.get_batch_transfer_status([bid]) == 0
    assert sha(buf[: n * count]) == sha(pattern(n * count, 11))
    ids = [engine.batch_transfer_async(peer.segment, [locals_[i]], [remotes[i]], [n], TransferOpcode.Write)
           for i in range(4)]
    assert all(i > 0 for i in ids)
    assert engine.get_batch_transfer_status(ids) == 0


def test_submit_and_poll(local, peer):
    engine, buf = local
    buf[:MiB] = pattern(MiB, 12)
    bid = engine.transfer_submit_write(peer.segment, buf.ctypes.data, peer.buffer, MiB)
    assert bid > 0
    deadline = time.monotonic() + 30
    status = 0
    while status == 0 and time.monotonic() < deadline:
        status = engine.transfer_check_status(bid)
        time.sleep(0.001)
    assert status == 1
    assert peer.digest(0, MiB) == sha(buf[:MiB])
    assert engine.transfer_check_status(bid) == -1  # freed after completion: unknown id


def test_notifies_arrive_after_the_data(local, peer):
    engine, buf = local
    peer.call("notifies")
    buf[:4096] = pattern(4096, 13)
    rc = engine.transfer_sync(peer.segment, buf.ctypes.data, peer.buffer, 4096, TransferOpcode.Write,
                              TransferNotify("kv-ready", "req-1"))
    assert rc == 0
    rc = engine.batch_transfer_sync(peer.segment, [buf.ctypes.data], [peer.buffer], [4096], TransferOpcode.Write,
                                    notify=TransferNotify("kv-ready", "req-2"))
    assert rc == 0
    assert engine.send_notify(peer.segment, TransferNotify("direct", "hello")) == 0
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        got += peer.call("notifies")["notifies"]
        time.sleep(0.01)
    assert sorted(got) == [["direct", "hello"], ["kv-ready", "req-1"], ["kv-ready", "req-2"]]


def test_bad_inputs_fail_cleanly(local, peer):
    engine, buf = local
    addr = buf.ctypes.data
    unregistered = np.zeros(4096, dtype=np.uint8)
    assert engine.transfer_sync_write("no-such-segment:1", addr, peer.buffer, 16) == -1
    assert engine.batch_transfer_async_write("no-such-segment:1", [addr], [peer.buffer], [16]) == 0
    assert engine.transfer_sync_write(peer.segment, unregistered.ctypes.data, peer.buffer, 16) == -3
    assert engine.batch_transfer_async_write(peer.segment, [unregistered.ctypes.data], [peer.buffer], [16]) == 0
    assert engine.transfer_sync_write(peer.segment, addr, peer.buffer + PEER_SIZE - 8, 16) == -3
    assert engine.transfer_sync_read(peer.segment, addr, 0x1000, 16) == -3
    assert engine.batch_transfer_sync_write(peer.segment, [addr, addr], [peer.buffer], [16, 16]) == -1
    assert engine.batch_transfer_async_write(peer.segment, [addr], [peer.buffer, peer.buffer], [16]) == 0
    assert engine.get_batch_transfer_status([987654321]) == -1
    assert engine.get_first_buffer_address("no-such-segment:1") == 0
    assert engine.send_probe("no-such-segment:1") != 0
    assert engine.register_memory(addr, 0) == -1
    assert engine.register_memory(addr + 100, 10) == -7  # overlaps the registered buffer
    assert engine.unregister_memory(unregistered.ctypes.data) == -3
    assert engine.free_managed_buffer(unregistered.ctypes.data, 4096) == -1


def test_peer_enforces_its_registrations(local, peer):
    """The target itself rejects ranges it no longer exposes, even if the initiator's cache says otherwise."""
    engine, buf = local
    assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, 4096) == 0  # cache descriptor
    assert peer.call("unregister")["rc"] == 0
    try:
        before = peer.digest(0, 4096)
        buf[:4096] = 0xAB
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, 4096) != 0
        assert peer.digest(0, 4096) == before  # nothing was written
    finally:
        assert peer.call("register")["rc"] == 0
    assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, 4096) == 0  # refreshed


def test_managed_buffers(local, peer):
    engine, _ = local
    sizes = [100, 8192, 3 * MiB]
    addrs = [engine.allocate_managed_buffer(n) for n in sizes]
    assert all(addrs) and len(set(addrs)) == 3
    data = bytes(pattern(3 * MiB, 14))
    assert engine.write_bytes_to_buffer(addrs[2], data, len(data)) == 0
    assert engine.transfer_sync_write(peer.segment, addrs[2], peer.buffer, len(data)) == 0
    assert peer.digest(0, len(data)) == hashlib.sha256(data).hexdigest()
    assert engine.read_bytes_from_buffer(addrs[2], 16) == data[:16]
    for a, n in zip(addrs, sizes):
        assert engine.free_managed_buffer(a, n) == 0


def _libc_mmap(pages, prot):
    """`pages` anonymous pages with protection `prot` (mmap.PROT_*); returns (address, munmap)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    size = pages * mmap.PAGESIZE
    addr = libc.mmap(None, size, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    return addr, lambda: libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))


def test_byte_helpers_copy_on_any_mapping_and_never_crash():
    """write_bytes_to_buffer / read_bytes_from_buffer are plain copies on any memory of the process (Mooncake):
    unregistered staging memory works, with or without initialize(); an unmapped, read-only or PROT_NONE address
    is a ValueError and nothing is written."""
    import mmap

    engine = TransferEngine()  # never initialized: the helpers do not need it
    staging = np.zeros(1 << 20, dtype=np.uint8)  # never registered
    data = bytes(pattern(1 << 20, 21))
    assert engine.write_bytes_to_buffer(staging.ctypes.data, data, len(data)) == 0
    assert sha(staging) == hashlib.sha256(data).hexdigest()
    assert engine.read_bytes_from_buffer(staging.ctypes.data + 5, 100) == data[5:105]
    assert engine.read_bytes_from_buffer(staging.ctypes.data, 0) == b""
    ro, unmap_ro = _libc_mmap(1, mmap.PROT_READ)
    none, unmap_none = _libc_mmap(1, 0)  # PROT_NONE
    gone, unmap_gone = _libc_mmap(1, mmap.PROT_READ | mmap.PROT_WRITE)
    unmap_gone()
    try:
        assert engine.read_bytes_from_buffer(ro, 16) == bytes(16)  # reading read-only memory is fine
        with pytest.raises(ValueError, match="not writable"):
            engine.write_bytes_to_buffer(ro, b"x" * 16, 16)
        assert engine.read_bytes_from_buffer(ro, 16) == bytes(16)
        with pytest.raises(ValueError, match="not readable"):
            engine.read_bytes_from_buffer(none, 16)
        with pytest.raises(ValueError):
            engine.write_bytes_to_buffer(none, b"x" * 16, 16)
        for addr in (gone, 16):
            with pytest.raises(ValueError, match="not mapped"):
                engine.read_bytes_from_buffer(addr, 16)
            with pytest.raises(ValueError, match="not mapped"):
                engine.write_bytes_to_buffer(addr, b"x" * 16, 16)
        with pytest.raises(ValueError, match="not mapped"):
            engine.read_bytes_from_buffer(staging.ctypes.data, 1 << 62)  # runs far past the mapping
        with pytest.raises(ValueError, match="too large"):
            engine.read_bytes_from_buffer(staging.ctypes.data, 1 << 63)
        with pytest.raises(ValueError):
            engine.write_bytes_to_buffer(staging.ctypes.data, b"x", 2)  # longer than the bytes given
    finally:
        unmap_ro()
        unmap_none()
    assert sha(staging) == hashlib.sha256(data).hexdigest()  # the failed writes changed nothing


def test_uninitialized_engine_and_bad_metadata():
    engine = TransferEngine()
    assert engine.transfer_sync_write("x", 1, 1, 1) == -1
    assert engine.register_memory(1, 1) == -1
    t0 = time.monotonic()
    assert engine.initialize("127.0.0.1:30099", "http://127.0.0.1:1/metadata", "tcp", "") == -1
    assert engine.initialize("127.0.0.1", "etcd://127.0.0.1:1", "tcp", "") == -1  # not built in yet
    assert engine.initialize("", "P2PHANDSHAKE", "tcp", "") == -1
    assert time.monotonic() - t0 < 20
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1  # already initialized
    engine.close()


def test_killed_peer_fails_within_timeout_then_fast(metadata):
    engine = TransferEngine()
    assert engine.initialize(local_name(metadata, 30003), metadata, "tcp", "") == 0
    buf = np.zeros(4 * MiB, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    victim = EnginePeer(metadata, local_name(metadata, 30004), 4 * MiB)
    try:
        assert engine.transfer_sync_write(victim.segment, buf.ctypes.data, victim.buffer, 4 * MiB) == 0
        victim.kill()
        t0 = time.monotonic()
        assert engine.transfer_sync_write(victim.segment, buf.ctypes.data, victim.buffer, 4 * MiB) != 0
        assert time.monotonic() - t0 < 10
        t0 = time.monotonic()
        assert engine.transfer_sync_read(victim.segment, buf.ctypes.data, victim.buffer, 4096) != 0
        assert time.monotonic() - t0 < 5
    finally:
        victim.close()
        engine.close()


def test_stalled_peer_times_out(metadata):
    """A peer that stops answering (SIGSTOP) fails the in-flight transfer once its only path moved no data for
    MC_TCP_STALL_TIMEOUT_MS, well within MC_TRANSFER_TIMEOUT."""
    os.environ["MC_TCP_STALL_TIMEOUT_MS"] = "2000"
    try:
        engine = TransferEngine()
        assert engine.initialize(local_name(metadata, 30005), metadata, "tcp", "") == 0
    finally:
        del os.environ["MC_TCP_STALL_TIMEOUT_MS"]
    buf = np.zeros(32 * MiB, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    victim = EnginePeer(metadata, local_name(metadata, 30006), 32 * MiB)
    try:
        assert engine.transfer_sync_write(victim.segment, buf.ctypes.data, victim.buffer, 4096) == 0
        victim.stop()
        t0 = time.monotonic()
        assert engine.transfer_sync_write(victim.segment, buf.ctypes.data, victim.buffer, 32 * MiB) != 0
        elapsed = time.monotonic() - t0
        assert 1.5 < elapsed < 15, elapsed
    finally:
        victim.kill()
        engine.close()
