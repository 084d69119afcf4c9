"""A single master with --enable_snapshot killed (SIGKILL) and restarted on its port: objects (with their
bytes), pins and disk replicas are back, the clients' segments stay mounted and the clients carry on without a
restart; a put in flight at the kill is finished or revoked, never stuck."""

import json
import signal
import time
import urllib.request

import pytest

from mooncake.store.client.store_worker import pattern
from mooncake.store.client.testing import StoreWorker
from mooncake.store.master.testing import MasterProcess
from mooncake.testing.services import free_port

KiB = 1 << 10


def admin(m: MasterProcess, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}{path}", timeout=5) as r:
        return json.loads(r.read())


def query(m: MasterProcess, key: str) -> dict:
    try:
        return admin(m, f"/query_key?key={key}")["data"]
    except urllib.error.HTTPError as e:
        return {"missing": e.code}


@pytest.fixture
def cluster(tmp_path):
    started = []

    def start(kind, *a, **kw):
        p = kind(*a, **kw)
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop()


def test_restarted_master_keeps_objects_pins_and_disk_replicas(cluster, tmp_path):
    port = free_port()
    args = (f"--port={port}", "--enable_snapshot", f"--snapshot_dir={tmp_path / 'meta'}",
            "--snapshot_interval_seconds=3600", "--fast_rpc_port=-1")  # snapshots only on SIGUSR1
    m = MasterProcess(*args)
    addr = f"127.0.0.1:{port}"
    a = cluster(StoreWorker, addr, segment="32MB", buffer="8MB")
    b = cluster(StoreWorker, addr, segment="32MB", buffer="8MB", ssd=str(tmp_path / "ssd"))
    assert a.request({"op": "fill", "prefix": "a", "count": 40, "size": 4 * KiB, "seed": 1})["codes"] == {"0": 40}
    for i in range(40):  # in b's own segment: b's SSD tier persists them
        assert b.call("put", f"b{i}", pattern(4 * KiB, 2 + i), config={"preferred_segment": b.hostname}) == 0
    assert a.call("put", "pinned", b"p" * 1000, config={"with_hard_pin": True}) == 0
    assert admin(m, "/health")["durability"]["last_snapshot_seq"] is None
    m.proc.send_signal(signal.SIGUSR1)  # one snapshot now; every later op is only in the log
    deadline = time.monotonic() + 10
    while (snap_seq := admin(m, "/health")["durability"]["last_snapshot_seq"]) is None:
        assert time.monotonic() < deadline, "no snapshot after SIGUSR1"
        time.sleep(0.1)
    assert a.request({"op": "fill", "prefix": "late", "count": 20, "size": 8 * KiB, "seed": 3})["codes"] == {"0": 20}
    deadline = time.monotonic() + 20  # offload tasks come with the owner's pings (about one a second)
    while True:
        b.request({"op": "flush_disk"})
        on_disk = [k for k in (f"b{i}" for i in range(40)) if query(m, k).get("disk_replica")]
        if len(on_disk) == 40 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert on_disk, "the SSD tier persisted nothing"
    assert query(m, "pinned")["hard_pinned"]
    before = admin(m, "/health")
    m.kill()

    m = cluster(MasterProcess, *args)
    health = admin(m, "/health")
    assert health["view_version"] != before["view_version"]
    restored = health["durability"]["restored"]
    assert restored["snapshot"] == snap_seq and restored["ops"] > 0, health
    for w, prefix, count, size, seed in ((a, "a", 40, 4 * KiB, 1), (b, "b", 40, 4 * KiB, 2),
                                         (a, "late", 20, 8 * KiB, 3), (b, "a", 40, 4 * KiB, 1)):
        got = w.request({"op": "verify", "prefix": prefix, "count": count, "size": size, "seed": seed})
        assert got["bad"] == [], (prefix, got)
    assert a.call("get", "pinned") == b"p" * 1000 and query(m, "pinned")["hard_pinned"]
    assert all(query(m, k).get("disk_replica") for k in on_disk)
    # The clients' segments are still mounted (no re-mount needed) and new puts land in them.
    status = admin(m, "/status.json")
    assert len(status["segments"]) == 2 and status["clients"] == 2
    assert b.call("put", "after", pattern(5000, 9)) == 0 and a.call("get", "after") == pattern(5000, 9)
    assert status["pending_puts"] == 0


def test_put_in_flight_at_the_kill_is_never_stuck(cluster, tmp_path):
    port = free_port()
    args = (f"--port={port}", "--enable_snapshot", f"--snapshot_dir={tmp_path / 'meta'}",
            "--put_start_discard_timeout_sec=2", "--put_start_release_timeout_sec=2")
    m = MasterProcess(*args)
    addr = f"127.0.0.1:{port}"
    a = cluster(StoreWorker, addr, segment="16MB", buffer="4MB")
    assert a.request({"op": "put_start_only", "key": "half", "size": 4096})["code"] == 0
    m.kill()
    m = cluster(MasterProcess, *args)
    assert query(m, "half") == {"missing": 404}  # in progress: not readable
    deadline = time.monotonic() + 10
    while admin(m, "/status.json")["pending_puts"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert admin(m, "/status.json")["pending_puts"] == 0
    assert a.call("put", "half", b"x" * 4096) == 0 and a.call("get", "half") == b"x" * 4096


def test_ssd_tier_reindexed_after_a_restart_without_snapshots(cluster, tmp_path):
    """Without --enable_snapshot a restarted master forgets the memory objects, but the SSD tier's owner
    declares its tier again and reports its files: every persisted object is readable again (from disk)."""
    port = free_port()
    m = MasterProcess(f"--port={port}")
    addr = f"127.0.0.1:{port}"
    b = cluster(StoreWorker, addr, segment="32MB", buffer="8MB", ssd=str(tmp_path / "ssd"))
    r = cluster(StoreWorker, addr, segment="0", buffer="8MB")
    for i in range(20):
        assert b.call("put", f"d{i}", pattern(4 * KiB, i), config={"preferred_segment": b.hostname}) == 0
    deadline = time.monotonic() + 20
    while not all(query(m, f"d{i}").get("disk_replica") for i in range(20)) and time.monotonic() < deadline:
        b.request({"op": "flush_disk"})
        time.sleep(0.3)
    assert all(query(m, f"d{i}").get("disk_replica") for i in range(20))
    m.kill()
    m = cluster(MasterProcess, f"--port={port}")
    deadline = time.monotonic() + 20
    while not all(query(m, f"d{i}").get("disk_replica") for i in range(20)) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert all(query(m, f"d{i}").get("disk_replica") for i in range(20)), [query(m, f"d{i}") for i in range(3)]
    assert all(r.call("get", f"d{i}") == pattern(4 * KiB, i) for i in range(20))
