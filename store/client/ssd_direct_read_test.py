"""Reads of another client's disk replicas straight from the owner's files (file transport), when the reader's
host sees the owner's directory: one Transfer Engine batch, no RPC to the owner (it may even be stopped); bytes
verified; the reader's own hit count promotes hot objects; a file that is not the replica's (another version,
torn) or a directory this host does not see falls back to asking the owner. Real master and client processes;
the file plugin is loaded from MC_PLUGIN_DIR."""

import os
import signal
import time

from mooncake.store.client.disk_serve import DiskPeers, DiskServer
from mooncake.store.client.ssd import DISK_ID_FILE, DiskTier, file_name, value_offset
from mooncake.store.client.store_worker import pattern
from mooncake.store.client.testing import StoreWorker
from mooncake.store.master.testing import MasterProcess, process_starter

import pytest

KiB = 1 << 10
PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "transfer_engine", "transport",
                       "file")
FAST = ("--client_ttl=2", "--monitor_interval_ms=50", "--default_kv_lease_ttl=200",
        "--eviction_high_watermark_ratio=0.9")
OWNER = {"MC_STORE_HEARTBEAT_INTERVAL": "0.2"}
READER = {"MC_PLUGIN_DIR": PLUGINS}
N, SIZE = 10, 512 * KiB


@pytest.fixture
def cluster():
    yield from process_starter()


def _fill_and_evict(a):
    for i in range(N):
        assert a.call("put", f"e{i}", pattern(SIZE, i)) == 0
    assert a.request({"op": "flush_disk"})["done"]
    for i in range(30):  # 15 MiB more through the 8 MiB segment: the persisted objects leave memory
        assert a.call("put", f"f{i}", pattern(SIZE, 100 + i)) == 0


def _descs(w, key):
    return w.request({"op": "descs", "key": key})["descs"]


def _file_bytes(w) -> int:
    stats = w.request({"op": "engine_stats"})["stats"]
    return sum(c.get("bytes", 0) for c in stats.get("file", {}).values() if isinstance(c, dict))


def test_plugin_is_there():
    assert os.path.exists(os.path.join(PLUGINS, "libmc_transport_file.so")), PLUGINS


def test_reader_reads_the_owners_file_without_asking_it(cluster, tmp_path):
    m = cluster(MasterProcess, *FAST)
    ssd = tmp_path / "a"
    a = cluster(StoreWorker, m.address, "8MB", "8MB", ssd=str(ssd), env=OWNER)
    b = cluster(StoreWorker, m.address, "0", "8MB", env=READER)
    _fill_and_evict(a)
    assert [(d["memory"], d["local_disk"]) for d in _descs(b, "e0")] == [(False, True)]
    assert b.call("get", "e0") == pattern(SIZE, 0)
    moved = _file_bytes(b)
    assert moved >= SIZE + value_offset("e0"), "the read did not go through the file transport"
    os.kill(a.proc.pid, signal.SIGSTOP)  # the owner answers nothing now: only its files can serve
    try:
        t0 = time.monotonic()
        assert b.call("get", "e1") == pattern(SIZE, 1)
        got = b.request({"op": "get_into", "key": "e2", "size": SIZE + 100})
        assert got["n"] == SIZE and b.call("get", "e3") == pattern(SIZE, 3)
        assert b.call("get_batch", ["e4", "e5"]) == [pattern(SIZE, 4), pattern(SIZE, 5)]
        assert time.monotonic() - t0 < 3, "a read waited for the stopped owner"
        assert _file_bytes(b) >= moved + 5 * SIZE
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    # e6 read twice by B: its own count promotes it (a memory replica again, the disk one stays).
    assert b.call("get", "e6") == pattern(SIZE, 6) and b.call("get", "e6") == pattern(SIZE, 6)
    deadline = time.monotonic() + 5
    while sorted((d["memory"], d["local_disk"]) for d in _descs(b, "e6")) != [(False, True), (True, False)]:
        assert time.monotonic() < deadline, _descs(b, "e6")
        time.sleep(0.05)


def test_a_file_that_is_not_the_replica_falls_back_to_the_owner(cluster, tmp_path):
    m = cluster(MasterProcess, *FAST)
    ssd = tmp_path / "a"
    a = cluster(StoreWorker, m.address, "8MB", "8MB", ssd=str(ssd), env=OWNER)
    b = cluster(StoreWorker, m.address, "0", "8MB", env=READER)
    _fill_and_evict(a)
    path = ssd / file_name("e7")
    data = bytearray(path.read_bytes())
    data[value_offset("e7") - 1] ^= 0x01  # the key's last byte: not e7's file to a reader that checks the header
    path.write_bytes(bytes(data))
    before = _file_bytes(b)
    # The owner checks version and size but not the key: it serves the value, so a correct answer proves the
    # reader refused what it read itself and asked the owner.
    assert b.call("get", "e7") == pattern(SIZE, 7)
    assert _file_bytes(b) > before  # the file was read, found wrong, and not used
    assert b.call("get", "e8") == pattern(SIZE, 8)  # others still read directly


def test_local_dir_needs_the_owners_disk_id(tmp_path):
    disk = DiskTier(str(tmp_path / "d"))
    server = DiskServer(disk, None, None, "seg", "127.0.0.1").start()
    try:
        peers = DiskPeers()
        assert peers.local_dir(server.endpoint) == os.path.abspath(disk.path)
        (tmp_path / "d" / DISK_ID_FILE).write_text("another host's tier")
        assert DiskPeers().local_dir(server.endpoint) is None  # same path, not the same directory
        assert DiskPeers().local_dir("127.0.0.1:1") is None  # nobody there
        peers.close()
    finally:
        server.close()
        disk.close()
