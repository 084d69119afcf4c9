"""Synchronous replication to standbys' memory (standby_sync.py) with real servers: a 3-member etcd cluster,
master processes and store clients. What must hold: a call acknowledged while only the standbys' memory holds
its ops survives the leader's death; only a member of the stored sync set may take over; a dead member leaves
the set without failing calls; the stream port survives malformed input."""

import json
import os
import signal
import socket
import struct
import time
import urllib.request

import pytest

from mooncake.store.client.store_worker import pattern
from mooncake.store.client.testing import StoreWorker
from mooncake.store.master.ha import HaController, _Diverged
from mooncake.store.master.testing import MasterProcess
from mooncake.testing.services import EtcdCluster

TTL = 2
SIZE = 4096


def health(m: MasterProcess) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/health", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


def start_master(etcd: EtcdCluster, *extra: str) -> MasterProcess:
    return MasterProcess("--enable_ha", "--ha_backend_type=etcd", f"--ha_backend_connstring={etcd.endpoints}",
                         f"--ha_lease_ttl={TTL}", "--oplog_poll_interval_ms=50", "--client_ttl=20", *extra)


def wait_for(what: str, fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = fn()
        if out:
            return out
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def leader_of(masters) -> MasterProcess | None:
    ls = [m for m in masters if m.proc.poll() is None and health(m).get("role") == "leader"]
    return ls[0] if len(ls) == 1 else None


def members(m: MasterProcess) -> list[str]:
    return health(m).get("ha", {}).get("sync_members", [])


@pytest.fixture
def cluster():
    made = {"etcd": None, "masters": [], "workers": []}
    made["etcd"] = EtcdCluster(3)
    yield made
    for w in made["workers"]:
        w.stop()
    for m in made["masters"]:
        if m.proc.poll() is None:
            os.kill(m.proc.pid, signal.SIGCONT)
        m.stop()
    for p in made["etcd"].members:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
    made["etcd"].close()


def two_masters(cluster, *standby_extra: str):
    etcd = cluster["etcd"]
    a = start_master(etcd)
    cluster["masters"].append(a)
    leader = wait_for("a leader", lambda: leader_of([a]))
    b = start_master(etcd, *standby_extra)
    cluster["masters"].append(b)
    return leader, b


def test_ops_held_only_by_the_standbys_memory_survive_the_leaders_death(cluster):
    etcd = cluster["etcd"]
    leader, standby = two_masters(cluster)
    name = wait_for("the standby's name", lambda: health(standby).get("ha", {}).get("name"))
    wait_for("the standby in the sync set", lambda: members(leader) == [name])
    w = StoreWorker("etcd://" + etcd.endpoints, segment="64MB", buffer="8MB")
    cluster["workers"].append(w)
    acked = {}
    for i in range(20):
        assert w.call("put", f"before-{i}", pattern(SIZE, i)) == 0
        acked[f"before-{i}"] = i
    fast_before = health(leader)["ha"]["sync_fast_acks"]
    assert fast_before >= 20, health(leader)["ha"]  # answered through the standby, not the log
    # The backend stops answering: the log can no longer be written, yet the leader serves (until its lease is
    # half gone) and every call it acknowledges is held by the standby alone.
    for p in etcd.members:
        os.kill(p.pid, signal.SIGSTOP)
    paused_at = time.monotonic()
    during = 0
    while time.monotonic() - paused_at < TTL / 2 - 0.3:
        k = f"during-{during}"
        if w.call("put", k, pattern(SIZE, 1000 + during), timeout=60) != 0:
            break
        acked[k] = 1000 + during
        during += 1
    assert during > 0, "no put was acknowledged while the log could not be written"
    leader.kill()
    for p in etcd.members:
        os.kill(p.pid, signal.SIGCONT)
    new = wait_for("the standby as leader", lambda: leader_of([standby]), timeout=10 * TTL)
    assert new is standby
    got = w.call("get_batch", sorted(acked), timeout=60)
    bad = [k for k, v in zip(sorted(acked), got) if v != pattern(SIZE, acked[k])]
    assert bad == [], (during, bad[:5])
    # The new leader wrote what only its memory held to the log: a master started now finds every value.
    third = start_master(etcd)
    cluster["masters"].append(third)
    wait_for("the third master caught up", lambda: health(third).get("ha", {}).get("applied_ops", -1)
             >= health(new)["ha"]["applied_ops"] - 5)
    import re
    m = re.search(r"\((\d+) written for the previous leader\)", new.stderr_tail())
    # Some of those calls' ops reached etcd (a write in flight when it paused); the rest only the new leader's
    # memory held, and it wrote them.
    assert m and int(m.group(1)) > 0, new.stderr_tail()[-2000:]


def test_only_a_member_of_the_sync_set_may_take_over(cluster):
    etcd = cluster["etcd"]
    leader, member = two_masters(cluster)
    name = wait_for("the member's name", lambda: health(member).get("ha", {}).get("name"))
    wait_for("the member in the sync set", lambda: members(leader) == [name])
    outsider = start_master(etcd, "--ha_sync_standbys=false")  # never streams, so never joins the set
    cluster["masters"].append(outsider)
    wait_for("the outsider following", lambda: health(outsider).get("ha", {}).get("leader"))
    os.kill(member.proc.pid, signal.SIGSTOP)
    leader.kill()
    # The lease is long gone, the paused member's presence not yet (4 leases): the outsider must not lead, the
    # member may hold acknowledged ops.
    time.sleep(2 * TTL)
    assert health(outsider).get("role") == "standby", health(outsider)
    assert "not campaigning" in outsider.stderr_tail()
    os.kill(member.proc.pid, signal.SIGCONT)
    assert wait_for("the member as leader", lambda: leader_of([member, outsider]), timeout=10 * TTL) is member


def test_when_every_member_is_gone_another_standby_takes_over(cluster):
    etcd = cluster["etcd"]
    leader, member = two_masters(cluster)
    name = wait_for("the member's name", lambda: health(member).get("ha", {}).get("name"))
    wait_for("the member in the sync set", lambda: members(leader) == [name])
    outsider = start_master(etcd, "--ha_sync_standbys=false")
    cluster["masters"].append(outsider)
    w = StoreWorker("etcd://" + etcd.endpoints, segment="64MB", buffer="8MB")
    cluster["workers"].append(w)
    for i in range(20):
        assert w.call("put", f"g{i}", pattern(SIZE, i)) == 0
    wait_for("the log written", lambda: health(leader)["ha"]["log_written_lsn"] >= health(leader)["ha"]["applied_ops"])
    wait_for("the outsider caught up",
             lambda: health(outsider).get("ha", {}).get("applied_ops", -1) >= health(leader)["ha"]["applied_ops"])
    leader.kill()
    member.kill()  # both gone at once: nobody of the set is left; without presence keys this is a lockout
    assert wait_for("the outsider as leader", lambda: leader_of([outsider]), timeout=30) is outsider
    assert "every member of the sync set" in outsider.stderr_tail()
    got = w.call("get_batch", [f"g{i}" for i in range(20)], timeout=60)
    assert got == [pattern(SIZE, i) for i in range(20)]


def test_a_dead_member_leaves_the_set_and_calls_go_on(cluster):
    etcd = cluster["etcd"]
    leader, member = two_masters(cluster)
    name = wait_for("the member's name", lambda: health(member).get("ha", {}).get("name"))
    wait_for("the member in the sync set", lambda: members(leader) == [name])
    w = StoreWorker("etcd://" + etcd.endpoints, segment="64MB", buffer="8MB")
    cluster["workers"].append(w)
    # Hostile input on the stream port: a frame announcing 4 GiB, garbage, a hello that is not an object.
    port = health(leader)["ha"]["sync_port"]
    for junk in (struct.pack("<I", 0xFFFFFFFF), b"\x05\x00\x00\x00hello", b"\x02\x00\x00\x00[]", os.urandom(64)):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(junk)
            s.settimeout(6)
            try:
                while s.recv(4096):
                    pass
            except (socket.timeout, ConnectionResetError):
                pass
    os.kill(member.proc.pid, signal.SIGSTOP)  # silent, then gone
    t0 = time.monotonic()
    for i in range(30):
        assert w.call("put", f"k{i}", pattern(SIZE, i), timeout=10) == 0  # through the log meanwhile
    member.kill()
    wait_for("the set emptied", lambda: members(leader) == [])
    assert time.monotonic() - t0 < 15
    fresh = start_master(etcd)
    cluster["masters"].append(fresh)
    fresh_name = wait_for("the new standby's name", lambda: health(fresh).get("ha", {}).get("name"))
    wait_for("the new standby in the set", lambda: members(leader) == [fresh_name])
    before = health(leader)["ha"]["sync_fast_acks"]
    for i in range(10):
        assert w.call("put", f"again{i}", pattern(SIZE, i)) == 0
    assert health(leader)["ha"]["sync_fast_acks"] >= before + 10
    got = w.call("get_batch", [f"k{i}" for i in range(30)] + [f"again{i}" for i in range(10)])
    assert got == [pattern(SIZE, i) for i in range(30)] + [pattern(SIZE, i) for i in range(10)]


def test_the_log_is_compacted_and_a_new_standby_starts_from_the_leaders_snapshot(cluster):
    from mooncake.store.common.coordination import EtcdBackend

    etcd = cluster["etcd"]
    compact = ("--oplog_retain_ops=20", "--oplog_compact_interval_sec=0.2")
    a = start_master(etcd, *compact)
    cluster["masters"].append(a)
    leader = wait_for("a leader", lambda: leader_of([a]))
    member = start_master(etcd, *compact)
    cluster["masters"].append(member)
    w = StoreWorker("etcd://" + etcd.endpoints, segment="64MB", buffer="8MB")
    cluster["workers"].append(w)
    for i in range(300):
        assert w.call("put", f"c{i}", pattern(SIZE, i)) == 0
    log = EtcdBackend(etcd.endpoint_list, "mooncake_cluster")
    extra = iter(range(10_000, 10_100))

    def compacted() -> bool:  # a batch can only go whole: a few more (separate) batches let one start late
        k = next(extra)
        assert w.call("put", f"c{k}", pattern(SIZE, k)) == 0
        time.sleep(0.05)
        return (log.log_start() or 0) > 100

    wait_for("the log compacted", compacted)
    late = start_master(etcd, *compact)  # its state (none) is older than the log's start
    cluster["masters"].append(late)
    late_name = wait_for("the late standby's name", lambda: health(late).get("ha", {}).get("name"))
    wait_for("the late standby in the sync set", lambda: late_name in members(leader))
    assert "took a snapshot from the leader" in late.stderr_tail()
    for i in range(300, 320):
        assert w.call("put", f"c{i}", pattern(SIZE, i)) == 0
    leader.kill()
    member.kill()
    assert wait_for("the late standby as leader", lambda: leader_of([late]), timeout=10 * TTL) is late
    got = w.call("get_batch", [f"c{i}" for i in range(320)], timeout=60)
    assert [i for i, v in enumerate(got) if v != pattern(SIZE, i)] == []


def test_ops_from_a_dead_leaders_stream_that_the_log_contradicts_are_detected():
    c = HaController.__new__(HaController)
    import threading
    c._unlogged_lock = threading.Lock()
    c._unlogged = [{"lsn": 5, "v": 7}, {"lsn": 6, "v": 7}]
    c._check_unlogged([{"lsn": 4, "v": 7}, {"lsn": 5, "v": 7}])  # the same op: agreed, forgotten
    assert [r["lsn"] for r in c._unlogged] == [6]
    with pytest.raises(_Diverged):
        c._check_unlogged([{"lsn": 6, "v": 9}])  # the next leader's op 6 is another op
