"""Same-host transport between real processes: memfd mapping, cross-memory attach, selection and fallback."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from mooncake.engine import TransferEngine
from mooncake.testing.engine_peer import EnginePeer, pattern

MiB = 1 << 20


def sha(a):
    return hashlib.sha256(a).hexdigest()


@pytest.fixture(scope="module")
def local():
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = np.zeros(64 * MiB, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    yield engine, buf
    engine.close()


def carriers(engine):
    stats = json.loads(engine.get_stats())
    shm = sum(p["bytes"] for p in stats.get("shm", {}).values())
    tcp = sum(p["bytes"] for p in stats.get("tcp", {}).values())
    return shm, tcp, stats


@pytest.mark.parametrize("managed", [True, False], ids=["memfd-mapping", "cross-memory-attach"])
def test_same_host_round_trips_skip_the_network(local, managed):
    engine, buf = local
    peer = EnginePeer("P2PHANDSHAKE", size=32 * MiB, managed=managed)
    try:
        shm0, tcp0, _ = carriers(engine)
        for i, n in enumerate([1, 4096, 3 * MiB + 5, 32 * MiB]):
            buf[:n] = pattern(n, i)
            assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, n) == 0
            assert peer.digest(0, n) == sha(buf[:n])
            peer.call("fill", offset=0, length=n, seed=50 + i)
            assert engine.transfer_sync_read(peer.segment, buf.ctypes.data, peer.buffer, n) == 0
            assert sha(buf[:n]) == sha(pattern(n, 50 + i))
        bid = engine.batch_transfer_async_write(peer.segment, [buf.ctypes.data + i * MiB for i in range(8)],
                                                [peer.buffer + i * MiB for i in range(8)], [MiB] * 8)
        assert bid and engine.get_batch_transfer_status([bid]) == 0
        assert peer.digest(0, 8 * MiB) == sha(buf[:8 * MiB])
        shm1, tcp1, stats = carriers(engine)
        assert shm1 - shm0 >= 2 * (32 * MiB) and tcp1 == tcp0
        kind = "mapped_copies" if managed else "attach_copies"
        assert any(p[kind] > 0 for p in stats["shm"].values()), stats
    finally:
        peer.close()


def engine_with(env: dict) -> TransferEngine:
    """An initialized engine that read `env` (MC_* variables) at initialization."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    return engine


def shm_counters(engine, segment):
    return json.loads(engine.get_stats())["shm"][segment]


def test_large_attach_copies_run_on_two_threads_and_land_exactly():
    """One thread's cross-memory attach into another process's 4 KiB pages runs at about 2/3 of memcpy (the
    kernel pins every page), so a large copy is cut into parts that a helper thread copies alongside the
    caller. Odd lengths and offsets must land exactly, and a peer that dies fails the copy quickly."""
    engine = engine_with({"MC_SHM_COPY_THREADS": "2"})
    buf = np.zeros(64 * MiB, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    peer = EnginePeer("P2PHANDSHAKE", size=64 * MiB)  # numpy memory of its own: cross-memory attach
    try:
        local_off, remote_off = 4097, 12345
        n = 64 * MiB - remote_off - 3
        buf[local_off:local_off + n] = pattern(n, 3)
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data + local_off, peer.buffer + remote_off, n) == 0
        assert peer.digest(remote_off, n) == sha(buf[local_off:local_off + n])
        assert peer.digest(0, remote_off) == sha(np.zeros(remote_off, dtype=np.uint8))  # nothing outside the range
        peer.call("fill", offset=0, length=64 * MiB, seed=4)
        buf[:] = 0
        assert engine.transfer_sync_read(peer.segment, buf.ctypes.data + local_off, peer.buffer + remote_off, n) == 0
        assert sha(buf[local_off:local_off + n]) == sha(pattern(64 * MiB, 4)[remote_off:remote_off + n])
        assert not buf[:local_off].any() and not buf[local_off + n:].any()
        stats = shm_counters(engine, peer.segment)
        assert stats["attach_copies"] == stats["slices"] == 2 and stats["parts"] >= 2 * 16, stats
        # The helper joins as soon as it gets a core: on a loaded host that can take a few copies.
        for _ in range(20):
            if shm_counters(engine, peer.segment)["helper_parts"] > 0:
                break
            assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, 64 * MiB) == 0
        assert shm_counters(engine, peer.segment)["helper_parts"] > 0
        peer.kill()
        t0 = time.monotonic()
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, 64 * MiB) != 0
        assert time.monotonic() - t0 < 10
    finally:
        peer.kill()
        engine.close()


def test_one_copy_thread_does_not_split():
    engine = engine_with({"MC_SHM_COPY_THREADS": "1"})
    buf = np.full(16 * MiB, 9, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    peer = EnginePeer("P2PHANDSHAKE", size=16 * MiB)
    try:
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, 16 * MiB) == 0
        assert peer.digest(0, 16 * MiB) == sha(buf)
        stats = shm_counters(engine, peer.segment)
        assert stats["parts"] == stats["slices"] == 1 and stats["helper_parts"] == 0, stats
    finally:
        peer.close()
        engine.close()


def test_stopped_peer_still_served_and_killed_peer_fails_fast(local):
    engine, buf = local
    peer = EnginePeer("P2PHANDSHAKE", size=MiB)
    try:
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, MiB) == 0
        peer.stop()  # SIGSTOP: one copy needs no help from the target
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, MiB) == 0
        peer.kill()
        t0 = time.monotonic()
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, MiB) != 0
        assert time.monotonic() - t0 < 10
    finally:
        peer.kill()


def test_withdrawn_memory_is_never_touched(local):
    engine, buf = local
    peer = EnginePeer("P2PHANDSHAKE", size=MiB)
    try:
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, 4096) == 0  # cached
        before = peer.digest(0, 4096)
        assert peer.call("unregister")["rc"] == 0
        buf[:4096] = 0xEE
        # The shared epoch shows the descriptor is stale; after a refresh the range is gone: -3, nothing written.
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, 4096) == -3
        assert peer.digest(0, 4096) == before
    finally:
        peer.close()


def test_forbidden_same_host_access_falls_back_to_tcp():
    """A target that refuses ptrace-style access (non-dumpable) from an initiator without CAP_SYS_PTRACE."""
    peer = EnginePeer("P2PHANDSHAKE", size=MiB, env={"MC_TEST_NONDUMPABLE": "1"})
    code = textwrap.dedent(f"""
        import json, numpy as np
        from mooncake.engine import TransferEngine
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        buf = np.full(1 << 20, 7, dtype=np.uint8)
        assert e.register_memory(buf.ctypes.data, buf.nbytes) == 0
        rcs = [e.transfer_sync_write("{peer.segment}", buf.ctypes.data, {peer.buffer}, 1 << 20) for _ in range(3)]
        print(json.dumps({{"rcs": rcs, "stats": json.loads(e.get_stats())}}))
    """)
    try:
        out = subprocess.run(["setpriv", "--bounding-set=-sys_ptrace", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["rcs"] == [0, 0, 0]
        tcp = sum(p["bytes"] for p in result["stats"]["tcp"].values())
        assert tcp == 3 * MiB
        assert out.stderr.count("same-host transport cannot reach") == 1  # said once, with the reason
        assert "refused" in out.stderr
        assert peer.digest(0, MiB) == sha(np.full(MiB, 7, dtype=np.uint8))
    finally:
        peer.close()


def test_force_tcp_and_cross_namespace_peers_use_the_network(local):
    engine, buf = local
    os.environ["MC_FORCE_TCP"] = "1"
    try:
        forced = TransferEngine()
        assert forced.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    finally:
        del os.environ["MC_FORCE_TCP"]
    peer = EnginePeer("P2PHANDSHAKE", size=MiB)
    try:
        b = np.zeros(MiB, dtype=np.uint8)
        assert forced.register_memory(b.ctypes.data, b.nbytes) == 0
        assert forced.transfer_sync_write(peer.segment, b.ctypes.data, peer.buffer, MiB) == 0
        shm, tcp, _ = carriers(forced)
        assert tcp == MiB and shm == 0
    finally:
        peer.close()
        forced.close()


def test_freed_and_reallocated_managed_memory_gets_the_data(local):
    """The peer frees a memfd-backed buffer and allocates another, which reuses the memfd's number: the copy
    must go to the new buffer, not to the old file still mapped here."""
    engine, buf = local
    size_a, size_b = 300 * MiB, 600 * MiB  # above the slab classes: one memfd each, closed on free
    code = textwrap.dedent(f"""
        import ctypes, hashlib, json, sys
        from mooncake.engine import TransferEngine
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        a = e.allocate_managed_buffer({size_a})
        print(json.dumps({{"segment": e.get_local_segment_name(), "a": a}}), flush=True)
        sys.stdin.readline()
        assert e.free_managed_buffer(a, {size_a}) == 0
        b = e.allocate_managed_buffer({size_b})
        print(json.dumps({{"b": b}}), flush=True)
        sys.stdin.readline()
        view = (ctypes.c_uint8 * 4096).from_address(b)
        print(json.dumps({{"sha": hashlib.sha256(bytes(view)).hexdigest()}}), flush=True)
        sys.stdin.readline()
        e.close()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        info = json.loads(child.stdout.readline())
        buf[:4096] = pattern(4096, 1)
        assert engine.transfer_sync_write(info["segment"], buf.ctypes.data, info["a"], 4096) == 0
        child.stdin.write("\n")
        child.stdin.flush()
        b = json.loads(child.stdout.readline())["b"]
        buf[:4096] = pattern(4096, 2)
        assert engine.transfer_sync_write(info["segment"], buf.ctypes.data, b, 4096) == 0
        child.stdin.write("\n")
        child.stdin.flush()
        assert json.loads(child.stdout.readline())["sha"] == sha(buf[:4096])
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _memfd_committed(pid: int) -> int:
    """Bytes the peer's engine-allocated memfds hold (st_blocks), summed."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if "mooncake-managed" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                total += os.stat(f"/proc/{pid}/fd/{fd}").st_blocks * 512
        except OSError:
            pass
    return total


def test_mapping_a_peer_does_not_commit_its_unused_memory(local):
    """The background page-table fill after mapping a peer's segment touches only pages the peer holds: a
    256 MiB segment of which 1 MiB was written stays ~1 MiB committed (populating it all would allocate it)."""
    engine, buf = local
    peer = EnginePeer("P2PHANDSHAKE", size=256 * MiB, managed=True)
    try:
        peer.call("fill", offset=0, length=MiB, seed=7)
        before = _memfd_committed(peer.proc.pid)
        assert MiB <= before < 8 * MiB, before
        buf[:4096] = pattern(4096, 1)
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer + 128 * MiB, 4096) == 0
        _, _, stats = carriers(engine)
        assert any(p["mapped_copies"] > 0 for p in stats["shm"].values()), stats
        deadline = time.monotonic() + 10  # the fill thread reports when it is done (stats: filling_mappings)
        while time.monotonic() < deadline and any(p["filling_mappings"] for p in carriers(engine)[2]["shm"].values()):
            time.sleep(0.05)
        assert not any(p["filling_mappings"] for p in carriers(engine)[2]["shm"].values())
        time.sleep(0.2)
        after = _memfd_committed(peer.proc.pid)
        assert after < before + 8 * MiB, f"{after - before} bytes of the peer's memory committed by mapping it"
        assert engine.transfer_sync_read(peer.segment, buf.ctypes.data, peer.buffer, MiB) == 0
        assert sha(buf[:MiB]) == sha(pattern(MiB, 7))
    finally:
        peer.close()
