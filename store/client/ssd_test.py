"""SSD tier against a real master: the objects of a client's segment are persisted by that client (the owner,
with the offload tasks of its pings); objects evicted from memory stay readable as LOCAL_DISK replicas, by
their owner and by other client processes (served from the owner's files), hot ones return to memory, the
tier has a capacity limit and survives a client restart, removal reaches the files, and a dead owner's disk
replicas read as "not found" without hanging. (The standalone pool's tier: service_test.py.)"""

import hashlib
import os
import signal
import threading
import time

import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.client.disk_serve import DEAD_SEC
from mooncake.store.client.ssd import DiskTier, Reporter
from mooncake.store.client.store_worker import pattern
from mooncake.store.client.testing import StoreWorker
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.common.master_client import MasterClient
from mooncake.store.master.testing import MasterProcess, process_starter

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--eviction_high_watermark_ratio=0.9", "--default_kv_lease_ttl=100")
    yield m
    m.stop()


@pytest.fixture
def cluster():
    yield from process_starter()


def _client(master, path, **kw):
    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "8MB",
           "local_buffer_size": "8MB", "master_server_addr": master.address, "enable_ssd_offload": True,
           "ssd_offload_path": str(path), **kw}
    assert s.setup(cfg) == 0
    return s


def _wait(fn, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        out = fn()
        if out or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def _objects(path) -> list[str]:
    """The object files of a tier's directory (not its .mooncake-disk-id)."""
    return [n for n in os.listdir(path) if not n.startswith(".")]


def _file(path, key: str):
    return path / hashlib.sha1(key.encode()).hexdigest()


def test_evicted_objects_read_from_disk_and_promoted(master, tmp_path):
    s = _client(master, tmp_path)
    try:
        for i in range(10):
            assert s.put(f"e{i}", pattern(512 * KiB, i)) == 0
        assert s._flush_disk()                          # persisted: their offload tasks came with pings
        assert len(_objects(tmp_path)) == 10
        for i in range(30):  # 15 MiB more into the 8 MiB segment: the persisted objects are evicted first
            assert s.put(f"f{i}", pattern(512 * KiB, 100 + i)) == 0
        descs = s.get_replica_desc("e0")                # only the disk replica is left
        assert [(d.is_memory_replica(), d.is_local_disk_replica()) for d in descs] == [(False, True)]
        disk = descs[0].get_disk_descriptor()
        assert disk.object_size == 512 * KiB and disk.client_id == s._master.client_id
        assert s.is_exist("e0") == 1 and s.get_size("e0") == 512 * KiB
        assert s.get("e0") == pattern(512 * KiB, 0)     # first disk hit
        assert s.get("e0") == pattern(512 * KiB, 0)     # second: promoted back to memory
        kinds = sorted(d.is_local_disk_replica() for d in s.get_replica_desc("e0"))
        assert kinds == [False, True]                   # a memory replica again, the disk one stays
        assert s.get_batch(["e1", "e9", "none"]) == [pattern(512 * KiB, 1), pattern(512 * KiB, 9), b""]
        time.sleep(0.15)                                # the reads' 100 ms leases
        assert s.remove("e2") == 0 and s.get("e2") == b"" and s.remove("e2") == E.OBJECT_NOT_FOUND
        assert _wait(lambda: not _file(tmp_path, "e2").exists(), 0.9)  # the master's notice, at once
        assert s.remove_by_regex("^e3") == 1 and s.get("e3") == b""
        assert _wait(lambda: not _file(tmp_path, "e3").exists())  # told to delete it with a ping
    finally:
        s.remove_all(force=True)
        s.close()
    assert _objects(tmp_path) == []


def test_disk_tier_survives_restart(master, tmp_path):
    s = _client(master, tmp_path)
    try:
        assert s.put("keep", b"k" * 3000) == 0
        assert s._flush_disk()
    finally:
        s.remove("keep", force=True)  # gone from memory and disk ...
        s.close()
    s = _client(master, tmp_path)
    try:
        assert s.get("keep") == b""
        assert s.put("persist", b"p" * 3000) == 0
        assert s._flush_disk()
    finally:
        s.close()                        # ... while this one only leaves memory with the client's segment
    s = _client(master, tmp_path)
    try:
        assert s.get("persist") == b"p" * 3000  # index rebuilt from the files and reported to the master
        assert [d.is_local_disk_replica() for d in s.get_replica_desc("persist")] == [True]
    finally:
        s.remove_all(force=True)
        s.close()


class Recorder(Reporter):
    """Records the reports (also in one ordered log); confirms every stored file not in `refuse`."""

    def __init__(self, refuse=()):
        self.stored_log, self.evicted_log, self.log, self.refuse = [], [], [], set(refuse)

    def stored(self, objects):
        self.stored_log.extend(objects)
        self.log += [("stored", k, seq) for k, _, seq, _ in objects]
        return [], [(k, seq) for k, _, seq, _ in objects if k not in self.refuse], True

    def evicted(self, objects):
        self.evicted_log.extend(objects)
        self.log += [("evicted", k, seq) for k, seq in objects]


def _no_report_of_deleted_files(rec):
    """No file is reported stored after (or in the same batch as) its deletion by the capacity limit."""
    gone = set()
    for op, k, seq in rec.log:
        if op == "evicted":
            gone.add((k, seq))
        else:
            assert (k, seq) not in gone, (k, seq)


def test_disk_capacity_and_torn_files(tmp_path):
    (tmp_path / "junk").write_bytes(b"not a tier file")
    (tmp_path / "x.tmp").write_bytes(b"interrupted")

    rec = Recorder()
    d = DiskTier(str(tmp_path), capacity=10 * KiB, reporter=rec)
    try:
        for i in range(5):
            d.submit(f"k{i}", bytes([i]) * (3 * KiB))
        d.flush()
        assert [d.size(f"k{i}") for i in range(5)] == [None, None, 3 * KiB, 3 * KiB, 3 * KiB]
        assert d.used == 9 * KiB and not (tmp_path / "x.tmp").exists()
        assert d.read("k4") == (bytes([4]) * (3 * KiB), False)
        assert [(k, v) for k, _, _, v in rec.stored_log][-3:] == [(f"k{i}", 0) for i in (2, 3, 4)]
        assert [k for k, _ in rec.evicted_log] == ["k0", "k1"]
        _no_report_of_deleted_files(rec)
        seq4 = d.lookup("k4")[1]
        d.discard([("k4", seq4 + 1)])   # another version: kept
        d.submit("k3", memoryview(b"new" * 1000), 7)  # a newer file of k3: an old notice must not delete it
        d.discard([("k3", [s for k, _, s, _ in rec.stored_log if k == "k3"][0])])
        d.flush()
        assert d.read("k4", seq4) is not None and d.read("k4", seq4 + 1) is None
        assert d.read("k3") == (b"new" * 1000, False) and rec.stored_log[-1][3] == 7
        d.discard([("k4", seq4)])
        d.flush()
        assert d.size("k4") is None
    finally:
        d.close()
    d = DiskTier(str(tmp_path), capacity=10 * KiB)  # restart: the versions survive
    try:
        assert {k for k, _, _ in d.entries()} == {"k2", "k3"}
        assert max(s for _, _, s in d.entries()) == d._seq  # new files get later versions
    finally:
        d.close()


def test_ssd_setup_errors(master, tmp_path):
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "master_server_addr": master.address, "enable_ssd_offload": True}) == E.INVALID_PARAMS
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "master_server_addr": master.address, "enable_ssd_offload": True,
                    "ssd_offload_path": str(blocker / "sub")}) == E.INVALID_PARAMS
    assert s.health_check() == 1


# -- several client processes ------------------------------------------------------------------------------------
# A client pinging every second would flap with a 1 s TTL (expired, remounted); a remove_all while the owner
# is expired misses its files, which come back when it re-reports them. Owners ping every 0.2 s here.
FAST = ("--client_ttl=2", "--monitor_interval_ms=50", "--default_kv_lease_ttl=200",
        "--eviction_high_watermark_ratio=0.9")
OWNER = {"MC_STORE_HEARTBEAT_INTERVAL": "0.2"}
N, SIZE = 10, 512 * KiB  # 5 MiB persisted, then 15 MiB more through the 8 MiB pool


def _descs(w, key):
    return w.request({"op": "descs", "key": key})["descs"]


def _fill_and_evict(a):
    for i in range(N):
        assert a.call("put", f"e{i}", pattern(SIZE, i)) == 0
    assert a.request({"op": "flush_disk"})["done"]
    for i in range(30):
        assert a.call("put", f"f{i}", pattern(SIZE, 100 + i)) == 0


def test_other_clients_read_disk_replicas(cluster, tmp_path):
    """A (SSD tier) writes; the master evicts; B (no SSD tier, no memory of its own) reads through A; hot
    objects return to memory; A restarts and B still reads; remove reaches A's files."""
    m = cluster(MasterProcess, *FAST)
    ssd = tmp_path / "a"
    a = cluster(StoreWorker, m.address, "8MB", "8MB", ssd=str(ssd), env=OWNER)
    b = cluster(StoreWorker, m.address, "0", "8MB")
    _fill_and_evict(a)
    a_id = a.request({"op": "client_id"})["client_id"]
    descs = _descs(b, "e0")
    assert [(d["memory"], d["local_disk"], d["size"], d["client_id"]) for d in descs] == [(False, True, SIZE, a_id)]
    assert b.call("is_exist", "e0") == 1 and b.call("get_size", "e0") == SIZE
    assert b.call("get", "e0") == pattern(SIZE, 0)                 # served from A's file
    got = b.request({"op": "get_into", "key": "e1", "size": SIZE + 100})
    assert got["n"] == SIZE and got["data"]["b64"] and b.call("get", "e1") == pattern(SIZE, 1)
    # e1 was read twice from disk: B gave it a memory replica again (the disk one stays).
    assert sorted((d["memory"], d["local_disk"]) for d in _descs(b, "e1")) == [(False, True), (True, False)]
    assert b.call("get_batch", ["e2", "e3", "nope"]) == [pattern(SIZE, 2), pattern(SIZE, 3), b""]
    assert a.call("get", "e4") == pattern(SIZE, 4)                # the owner reads its own file

    a.stop()                                                       # close: the master forgets A's tier ...
    assert _descs(b, "e5") == []
    a = cluster(StoreWorker, m.address, "8MB", "8MB", ssd=str(ssd), env=OWNER)  # ... and learns it again
    assert b.call("get", "e5") == pattern(SIZE, 5)
    assert [d["local_disk"] for d in _descs(b, "e6")] == [True]

    time.sleep(0.3)                                                # B's read leases (200 ms)
    assert b.call("remove", "e6") == 0                             # by another client than the owner
    assert b.call("get", "e6") == b"" and _descs(b, "e6") == []
    assert _wait(lambda: not _file(ssd, "e6").exists())            # A deletes the file at its next ping
    assert b.call("remove_all") >= N - 2
    assert _wait(lambda: _objects(ssd) == [])


def test_dead_owner_fails_fast(cluster, tmp_path):
    m = cluster(MasterProcess, *FAST)
    # A's staging buffer is too small to hold an object: it registers a buffer for each read it serves.
    a = cluster(StoreWorker, m.address, "8MB", "256KB", ssd=str(tmp_path / "a"), env=OWNER)
    b = cluster(StoreWorker, m.address, "0", "8MB")
    _fill_and_evict(a)
    assert b.call("get", "e0") == pattern(SIZE, 0)
    a.kill()                                                       # no close: the master learns by liveness
    t0 = time.monotonic()
    assert b.call("get", "e1") == b""                              # owner unreachable: fails at once
    got = b.request({"op": "get_into", "key": "e2", "size": SIZE})
    assert got["n"] == E.RPC_FAIL                                  # not OBJECT_NOT_FOUND: the master lists it
    assert time.monotonic() - t0 < 5
    assert _wait(lambda: b.call("is_exist", "e3") == 0)            # expired: its disk replicas are gone
    assert _descs(b, "e3") == [] and b.call("get_size", "e3") == E.OBJECT_NOT_FOUND


def test_unresponsive_owner_costs_one_timeout(cluster, tmp_path):
    """An owner that stops answering (SIGSTOP) costs its readers one MC_STORE_DISK_RPC_TIMEOUT_MS: it is then
    taken for dead for a few seconds (a batch of its keys fails at once, without the lookup retry), and asked
    again afterwards."""
    m = cluster(MasterProcess, "--client_ttl=30", "--monitor_interval_ms=50", "--default_kv_lease_ttl=200",
                "--eviction_high_watermark_ratio=0.9")
    a = cluster(StoreWorker, m.address, "8MB", "8MB", ssd=str(tmp_path / "a"), env=OWNER)
    b = cluster(StoreWorker, m.address, "0", "8MB", env={"MC_STORE_DISK_RPC_TIMEOUT_MS": "1000"})
    _fill_and_evict(a)
    assert b.call("get", "e0") == pattern(SIZE, 0)
    a.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert b.request({"op": "get_into", "key": "e1", "size": SIZE})["n"] == E.RPC_TIMEOUT
        t1 = time.monotonic()
        assert b.call("get_batch", ["e2", "e3", "e4", "e5"]) == [b""] * 4  # wholly failed: one entry per key
        assert b.request({"op": "get_into", "key": "e6", "size": SIZE})["n"] == E.RPC_FAIL
        t2 = time.monotonic()
        assert t1 - t0 < 2.5 and t2 - t1 < 1.0, (t1 - t0, t2 - t1)  # one timeout, not one per key
    finally:
        a.proc.send_signal(signal.SIGCONT)
    time.sleep(DEAD_SEC)
    assert b.call("get", "e7") == pattern(SIZE, 7)                # alive again: asked again


def test_tier_declared_again_when_the_master_lost_it(cluster, tmp_path):
    """The master forgets A's tier behind its back (UnmountLocalDisk under A's id): A's next ping sees it
    (PingReply.disk_mounted), declares the tier again and reports its files: they are readable again."""
    m = cluster(MasterProcess, *FAST)
    a = cluster(StoreWorker, m.address, "8MB", "8MB", ssd=str(tmp_path / "a"), env=OWNER)
    b = cluster(StoreWorker, m.address, "0", "8MB")
    _fill_and_evict(a)
    a_id = a.request({"op": "client_id"})["client_id"]
    with MasterClient(m.address, client_id=a_id) as spoof:
        assert spoof.call("UnmountLocalDisk").count >= N
    assert _wait(lambda: [d["local_disk"] for d in _descs(b, "e0")] == [True])
    assert b.call("get", "e1") == pattern(SIZE, 1)


def test_discard_never_blocks(tmp_path, monkeypatch):
    """discard runs on the heartbeat thread: with the write queue full it returns at once, and the file
    still goes once the writer moves on."""
    d = DiskTier(str(tmp_path), capacity=10 * MiB)
    try:
        assert d.submit("k", b"v" * 100)
        d.flush()
        seq = d.lookup("k")[1]
        gate = threading.Event()
        write = d._write
        monkeypatch.setattr(d, "_write", lambda *a: gate.wait(30) and write(*a))
        while d.submit("other", b"x"):
            pass
        t0 = time.monotonic()
        d.discard([("k", seq)])
        assert time.monotonic() - t0 < 0.5
        gate.set()
        assert _wait(lambda: d.lookup("k") is None) and not _file(tmp_path, "k").exists()
    finally:
        gate.set()
        d.close()


def test_files_evicted_in_their_batch_are_not_reported(tmp_path):
    rec = Recorder()
    d = DiskTier(str(tmp_path), capacity=10 * KiB, reporter=rec)
    try:
        with d._lock:  # the writer stops at a first write: the others make one batch, with evictions
            d.submit("z", b"z")
            time.sleep(0.2)
            for i in range(5):
                d.submit(f"k{i}", bytes([i]) * (3 * KiB))
        d.flush()
        assert {k for k, _ in rec.evicted_log} == {"z", "k0", "k1"}
        assert [k for op, k, _ in rec.log if op == "stored"] == ["z", "k2", "k3", "k4"]  # z: in its own batch
        _no_report_of_deleted_files(rec)
    finally:
        d.close()


def test_only_confirmed_files_survive_a_restart(tmp_path):
    rec = Recorder(refuse={"refused"})
    d = DiskTier(str(tmp_path), capacity=1 * MiB, reporter=rec)
    try:
        d.submit("ok", b"a" * 100)
        d.submit("refused", b"b" * 100)
        d.flush()
        assert d.read("refused") == (b"b" * 100, False)  # readable while unconfirmed
        assert d.pending() == [("refused", d.lookup("refused")[1])]
        assert [k for k, _, _ in d.entries()] == ["ok"]
    finally:
        d.close()
    assert _file(tmp_path, "refused").exists()
    d = DiskTier(str(tmp_path), capacity=1 * MiB)  # restart: the unconfirmed file goes
    try:
        assert [k for k, _, _ in d.entries()] == ["ok"] and d.read("ok") == (b"a" * 100, False)
        assert not _file(tmp_path, "refused").exists() and d.pending() == []
    finally:
        d.close()


def test_close_drops_queued_writes(tmp_path):
    rec = Recorder()
    d = DiskTier(str(tmp_path), capacity=1 * MiB, reporter=rec)
    with d._lock:  # the writer stops at its first write; close is asked meanwhile
        for i in range(5):
            d.submit(f"k{i}", bytes([i]) * KiB)
        time.sleep(0.2)
        d._closing = True  # what close() sets first
    d.close()
    assert not d._thread.is_alive()
    assert [k for k, _, _ in d.entries()] == ["k0"] and d.dropped == 4  # only the write in progress
    assert [k for _, k, _ in rec.log] == ["k0"]


def test_disk_hold_reclaimed_during_a_slow_pull_fails_the_read(tmp_path, monkeypatch):
    """The owner reclaims a hold (on its timer, no other read needed) the reader still pulls from: the reader
    must not trust the bytes. A pull in time reads fine."""
    import ctypes

    from mooncake.store.client.disk_serve import DiskPeers, DiskServer

    class Staging:
        def __init__(self):
            self.buf = ctypes.create_string_buffer(64 * KiB)
            self.freed = 0

        def alloc(self, size):
            return ctypes.addressof(self.buf)

        def free(self, addr):
            self.freed += 1

    monkeypatch.setenv("MC_STORE_DISK_HOLD_MS", "200")
    d = DiskTier(str(tmp_path), capacity=1 * MiB)
    d.submit("k", b"v" * KiB)
    d.flush()
    staging = Staging()
    server = DiskServer(d, None, staging, "seg", "127.0.0.1").start()
    peers = DiskPeers()
    try:
        got = []

        def pull(segment, addr, size, wait=0.0):
            time.sleep(wait)
            got.append(ctypes.string_at(addr, size))
            return True
        assert peers.read(server.endpoint, "k", 0, pull) == (KiB, False) and got == [b"v" * KiB]
        assert peers.read(server.endpoint, "k", 0, lambda *a: pull(*a, wait=1.0)) == (E.TRANSFER_FAIL, False)
        assert staging.freed == 2 and not server._holds
    finally:
        peers.close()
        server.close()
        d.close()
