"""Master HA with real servers: a 3-member etcd cluster (or Redis), 2-3 masters, store clients that find the
leader through ``etcd://...``. The leader is killed (SIGKILL) again and again while clients put and get:
every acknowledged value reads back with its bytes, no key stays in PROCESSING, no client is restarted."""

import json
import threading
import time
import urllib.request

import pytest

from mooncake.store.client.store_worker import pattern
from mooncake.store.client.testing import StoreWorker
from mooncake.store.master.testing import MasterProcess
from mooncake.testing.services import EtcdCluster, Redis

KiB = 1 << 10
TTL = 2  # seconds: the election lease


def health(m: MasterProcess) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/health", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


def start_args(kind: str, connstring: str) -> tuple:
    return ("--enable_ha", f"--ha_backend_type={kind}", f"--ha_backend_connstring={connstring}",
            f"--ha_lease_ttl={TTL}", "--oplog_poll_interval_ms=50", "--put_start_discard_timeout_sec=3",
            "--put_start_release_timeout_sec=3", "--client_ttl=20")


def start_master(kind: str, connstring: str) -> MasterProcess:
    return MasterProcess(*start_args(kind, connstring))


def wait_leader(masters, timeout: float = 20.0) -> MasterProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [m for m in masters if m.proc.poll() is None and health(m).get("role") == "leader"]
        if len(leaders) == 1:
            return leaders[0]
        time.sleep(0.05)
    raise AssertionError(f"no single leader within {timeout} s: {[health(m) for m in masters]}")


class Writer:
    """One store client putting batches of verified values from a thread, remembering what was acknowledged."""

    def __init__(self, worker: StoreWorker, name: str) -> None:
        self.w, self.name = worker, name
        self.acked: dict[str, int] = {}  # key -> seed of its value
        self.failed = 0
        self.n = 0
        self._stop = threading.Event()
        self._thread = None
        self.error = None

    def batch(self, count: int = 8, size: int = 4 * KiB) -> None:
        keys = [f"{self.name}-{self.n + i}" for i in range(count)]
        seeds = [hash(k) & 0xFFFFFF for k in keys]
        self.n += count
        codes = [self.w.call("put", k, pattern(size, s), timeout=90) for k, s in zip(keys, seeds)]
        for k, s, c in zip(keys, seeds, codes):
            if c == 0:
                self.acked[k] = s
            else:
                self.failed += 1

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                self.batch()
        except Exception as e:  # noqa: BLE001  (reported by stop)
            self.error = e

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert self.error is None, self.error

    def verify(self, reader: StoreWorker, size: int = 4 * KiB) -> list[str]:
        keys = sorted(self.acked)
        got = reader.call("get_batch", keys, timeout=90) if keys else []
        return [k for k, v in zip(keys, got) if v != pattern(size, self.acked[k])]


@pytest.fixture
def procs():
    started = []

    def start(fn, *a, **kw):
        p = fn(*a, **kw)
        started.append(p)
        return p

    yield start
    # Clients first (they close against a live leader), then masters, then the backend.
    rank = {StoreWorker: 0, MasterProcess: 1}
    for p in sorted(reversed(started), key=lambda p: rank.get(type(p), 2)):
        (p.close if hasattr(p, "close") else p.stop)()


def failover_run(procs, kind: str, connstring: str, url: str, kills: int, clients: int = 3,
                 etcd: EtcdCluster | None = None) -> dict:
    masters = [procs(start_master, kind, connstring) for _ in range(2)]
    leader = wait_leader(masters)
    workers = [procs(StoreWorker, url, segment="32MB", buffer="8MB") for _ in range(clients)]
    writers = [Writer(w, f"c{i}") for i, w in enumerate(workers)]
    for wr in writers:
        wr.batch()
    times = []
    for round_ in range(kills):
        for wr in writers:
            wr.start()
        time.sleep(0.5)
        if etcd is not None and round_ == kills // 2:
            etcd.kill(2)  # one member of three: quorum stays
        killed_at = time.monotonic()
        leader.kill()
        masters.remove(leader)
        masters.append(procs(start_master, kind, connstring))  # keep two masters
        leader = wait_leader(masters)
        times.append(time.monotonic() - killed_at)
        time.sleep(0.3)
        for wr in writers:
            wr.stop()
        for i, wr in enumerate(writers):
            bad = wr.verify(workers[(i + 1) % clients])
            assert bad == [], (round_, wr.name, bad[:5])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{leader.metrics_port}/status.json", timeout=5) as r:
            pending = json.loads(r.read())["pending_puts"]
        if not pending:
            break
        time.sleep(0.2)
    assert pending == 0, "keys stuck in PROCESSING"
    for wr in writers:  # keys whose put failed are not stuck: they can be put now
        k = f"{wr.name}-retry"
        assert wr.w.call("put", k, b"z" * 100) == 0 and wr.w.call("get", k) == b"z" * 100
    return {"failover_s": times, "acked": sum(len(w.acked) for w in writers),
            "failed": sum(w.failed for w in writers)}


def test_etcd_leader_killed_ten_times(procs):
    etcd = procs(EtcdCluster, 3)
    out = failover_run(procs, "etcd", etcd.endpoints, "etcd://" + etcd.endpoints, kills=10, etcd=etcd)
    assert out["acked"] > 200, out
    assert max(out["failover_s"]) < 4 * TTL + 5, out  # election + a master start (python) per kill


def test_redis_election_and_failover(procs):
    r = procs(Redis)
    out = failover_run(procs, "redis", r.endpoint, "redis://" + r.endpoint, kills=2, clients=2)
    assert out["acked"] > 20, out


def test_standby_refuses_and_stale_leader_is_fenced(procs):
    """A standby answers nobody (clients go to the leader); a leader that loses its lease stops serving."""
    etcd = procs(EtcdCluster, 3)
    a = procs(start_master, "etcd", etcd.endpoints)
    leader = wait_leader([a])
    b = procs(start_master, "etcd", etcd.endpoints)
    time.sleep(0.5)
    assert health(b)["role"] == "standby" and health(b)["ha"]["leader"].endswith(str(leader.port))
    from mooncake.store.common.master_client import MasterClient
    import grpc
    direct = MasterClient(f"127.0.0.1:{b.port}", timeout=2)
    with pytest.raises(grpc.RpcError) as e:
        direct.call("GetServiceInfo", timeout=1)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    direct.close()
    # Pause the leader past its lease: it must have stopped serving before b is elected.
    import os
    import signal
    os.kill(leader.proc.pid, signal.SIGSTOP)
    new = wait_leader([b], timeout=10 * TTL)
    os.kill(leader.proc.pid, signal.SIGCONT)
    stale = MasterClient(f"127.0.0.1:{leader.port}", timeout=2)  # at once: before its HA thread runs a round
    with pytest.raises(grpc.RpcError) as e:
        stale.call("GetServiceInfo", timeout=1)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    stale.close()
    deadline = time.monotonic() + 5
    while health(leader).get("role") != "standby" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert health(leader)["role"] == "standby" and health(new)["role"] == "leader"


def test_standby_bootstraps_from_its_snapshot(procs, tmp_path):
    """A standby with --enable_snapshot writes snapshots of the log it applied; restarted, it starts from the
    newest one and reads only the rest of the log; elected later, it serves every value."""
    etcd = procs(EtcdCluster, 3)
    a = procs(start_master, "etcd", etcd.endpoints)
    leader = wait_leader([a])
    snap = ("--enable_snapshot", f"--snapshot_dir={tmp_path}", "--snapshot_interval_seconds=0.5")
    b = procs(MasterProcess, *start_args("etcd", etcd.endpoints), *snap)
    w = procs(StoreWorker, "etcd://" + etcd.endpoints, segment="32MB", buffer="8MB")
    wr = Writer(w, "s")
    for _ in range(10):
        wr.batch()
    deadline = time.monotonic() + 10
    while (health(b).get("ha", {}).get("last_snapshot_seq") or 0) < 80 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert health(b)["ha"]["last_snapshot_seq"] >= 80, health(b)
    b.kill()
    wr.batch()
    b = procs(MasterProcess, *start_args("etcd", etcd.endpoints), *snap)
    restored = health(b)["ha"]["restored"]
    assert restored["snapshot"] and restored["snapshot"] >= 80, restored
    deadline = time.monotonic() + 10
    while health(b)["ha"]["applied_ops"] < health(leader)["ha"]["applied_ops"] and time.monotonic() < deadline:
        time.sleep(0.05)
    leader.kill()
    assert wait_leader([b]) is b
    assert wr.verify(w) == [] and len(wr.acked) == 88


def test_replies_carry_the_view_and_old_view_reads_are_dropped(procs):
    from mooncake.testing.services import Etcd
    import grpc
    from mooncake.store.common.master_client import MasterClient

    etcd = procs(Etcd)
    m = procs(start_master, "etcd", etcd.endpoint)
    wait_leader([m])
    view = health(m)["view_version"]
    c = MasterClient("etcd://" + etcd.endpoint, timeout=1.0)
    try:
        for fast in (False, True):
            if fast:
                assert c.use_fast_path()
            assert c.call("GetServiceInfo").view_version == view and c._reply_view == view
            c._directory.close()  # the directory now believes in a newer leader that does not answer yet
            time.sleep(0.3)
            c._directory.leader = (c.address, view + 1)
            with pytest.raises(grpc.RpcError) as e:
                c.call("GetServiceInfo")
            # Every reply was dropped; the last attempt may also run out of time on a loaded machine.
            assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            assert c.old_view_replies > 0
            assert c.call("PutRevoke", key="nope").code != 0  # a change's reply stands (answered, not dropped)
            c._directory.leader = (c.address, view)
    finally:
        c.close()
