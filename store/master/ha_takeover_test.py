"""HaController parts in-process against a real etcd: a step-down after a partial takeover never keeps a state
the log does not hold; a snapshot bootstrap is one step for the snapshotter (never an empty or half-loaded
state in between); presence is renewed while the control thread is stalled."""

import threading
import time
import types

import pytest

from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master import durable, ha
from mooncake.store.master.config import MasterConfig
from mooncake.store.master.service import MasterService, SegmentSpec
from mooncake.testing.services import Etcd

TTL = 1.0


@pytest.fixture(scope="module")
def etcd():
    e = Etcd()
    yield e
    e.close()


def controller(etcd, cluster_id: str, **kw) -> ha.HaController:
    cfg = MasterConfig(enable_ha=True, ha_backend_type="etcd", ha_backend_connstring=etcd.endpoint,
                       ha_lease_ttl_sec=TTL, cluster_id=cluster_id, rpc_address="127.0.0.1", client_ttl_sec=1e6,
                       **kw)
    svc = MasterService(cfg)
    return ha.HaController(types.SimpleNamespace(service=svc), cfg, "127.0.0.1:1")


def mount(svc, name: str) -> None:
    assert svc.mount_segment("c0", SegmentSpec(name, "h0", 0x100000 * (1 + len(svc.segments)), 1 << 20)) == E.OK


def test_step_down_with_ops_of_its_own_view_drops_the_state(etcd):
    """A leadership that stepped down before serving, whose journal holds an op it made itself (never logged,
    acknowledged or streamed): the member must not stand by with that op in its state."""
    c = controller(etcd, "stepdown", ha_sync_standbys=False)
    svc = c._svc
    c._become_standby(reset=False)
    name = c.name
    # What _become_leader sets up before a step-down: the journal of the view won, the leader role.
    with svc.lock:
        c._journal = ha.BackendJournal(svc, c.store, 64, view=7)
        svc.journal = c._journal
        svc.role = "leader"
        svc.allocators_live = True
    mount(svc, "s0")  # an op of view 7 in memory only (the log write is fenced: no view key)
    assert svc.applied_ops == 1 and c._log_tail == 0
    c._step_down("the sync set could not be reset (fenced)")
    assert svc.role == "standby"
    assert svc.applied_ops == 0 and len(svc.segments) == 0, "kept a state the log does not hold"
    assert c._unlogged == [] and c.name != name  # the old name's memory is gone


def test_step_down_keeps_the_log_plus_held_records(etcd):
    """The other side: a state that is the log plus records held from the previous leader's stream is kept,
    and so are the records (a sync-set member may take over later)."""
    c = controller(etcd, "keep", ha_sync_standbys=False)
    svc = c._svc
    c._become_standby(reset=False)
    leader = MasterService(MasterConfig(client_ttl_sec=1e6))
    recs = []
    leader.journal = types.SimpleNamespace(append=lambda op: recs.append(
        dict(durable.ops.encode(op, lambda t: t), lsn=leader.applied_ops, v=3)))
    mount(leader, "s0")
    mount(leader, "s1")
    with c._unlogged_lock:
        c._unlogged = list(recs)
        durable.replay(svc, recs)
    with svc.lock:
        c._journal = ha.BackendJournal(svc, c.store, 64, view=4, written=0)
        c._journal.preload(recs)
        svc.journal = c._journal
        svc.role = "leader"
    name = c.name
    c._step_down("the ops acknowledged by the previous leader could not be written to the log")
    assert svc.applied_ops == 2 and c.name == name
    assert [r["lsn"] for r in c._unlogged] == [1, 2]


def test_step_down_after_take_over_keeps_exactly_the_log_plus_held_records(etcd):
    """take_over ran (allocators rebuilt, a held buffer that overlaps live data dropped: a change no log
    record makes), then the takeover could not finish: the state kept is exactly the one before take_over
    (the log plus the held records), with allocators no longer live, and a later takeover serves it."""
    c = controller(etcd, "keep-after-takeover", ha_sync_standbys=False)
    svc = c._svc
    c._become_standby(reset=False)
    leader = MasterService(MasterConfig(client_ttl_sec=1e6))
    recs = []
    leader.journal = types.SimpleNamespace(append=lambda op: recs.append(
        dict(durable.ops.encode(op, lambda t: t), lsn=leader.applied_ops, v=3)))
    mount(leader, "s0")
    code, _ = leader.put_start("c0", "k", 4096)
    assert code == E.OK and leader.put_end("c0", "k") == E.OK
    with c._unlogged_lock:
        c._unlogged = list(recs)
        durable.replay(svc, recs)
    with svc.lock:  # a held buffer over the object's range: rebuild_allocators drops it
        rep = durable.replicas_of(svc.table.objects["k"])[0]
        svc.table.held.append(durable.Held("old", (rep,), svc.now() + 3600.0))
    before = durable.snapshot_state(svc)
    # Won, then deposed before serving (its lease gone): the journal's write of the held ops is fenced.
    view = c.store.campaign(c._address, TTL)
    assert view
    c.store.resign()
    c._become_leader(view)
    assert svc.role == "standby" and not svc.allocators_live
    assert c._unlogged and [r["lsn"] for r in c._unlogged] == [1, 2, 3]
    def durable_part(state):  # times are wall-clock conversions of monotonic ones: equal to the microsecond
        out = {k: v for k, v in state.items() if k != "taken"}
        out["held"] = [[k, reps, round(at, 4), *rest] for k, reps, at, *rest in out["held"]]
        return out

    assert durable_part(durable.snapshot_state(svc)) == durable_part(before)
    durable.take_over(svc)  # the next takeover works on it (the same rebuild, the overlap dropped again)
    assert svc.allocators_live and svc.table.held == [] and "k" in svc.table.objects


class SpyLock:
    """The service lock, recording what another thread that acquires it right after each release would see."""

    def __init__(self, svc, seen):
        self._l, self._svc, self._seen = threading.Lock(), svc, seen

    def acquire(self, *a, **kw):
        return self._l.acquire(*a, **kw)

    def release(self):
        self._seen.append((self._svc.applied_ops, len(self._svc.segments)))
        self._l.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def test_bootstrap_is_one_step_for_the_snapshotter(etcd, monkeypatch):
    c = controller(etcd, "bootstrap")
    svc = c._svc
    src = MasterService(MasterConfig(client_ttl_sec=1e6))
    for i in range(3):
        mount(src, f"s{i}")
    state = durable.snapshot_state(src)
    c._become_standby(reset=False)
    for i in range(2):  # the standby's own (older) state
        mount(svc, f"old{i}")
    before = (svc.applied_ops, len(svc.segments))
    monkeypatch.setattr(c.store, "view_info", lambda: {"address": "x:1", "view": 1, "sync": "127.0.0.1:9"})
    monkeypatch.setattr(ha, "fetch_snapshot", lambda address, name: state)
    seen = []
    svc._lock = SpyLock(svc, seen)
    c._bootstrap("the log starts at op 9")
    assert (svc.applied_ops, len(svc.segments)) == (3, 3) and c._log_tail >= 3
    assert seen and set(seen) <= {before, (3, 3)}, f"a snapshotter could see {seen}"


def test_bootstrap_with_a_snapshot_that_does_not_load_leaves_an_empty_standby(etcd, monkeypatch):
    c = controller(etcd, "badsnap")
    svc = c._svc
    c._become_standby(reset=False)
    mount(svc, "old0")
    bad = {"version": 1, "seq": 5, "segments": [], "objects": [["k", [["nope", 0, 64]]]], "hard_pins": [],
           "soft_pins": [], "pending": [], "held": [], "disk_clients": [], "disk": [], "reservations": []}
    monkeypatch.setattr(c.store, "view_info", lambda: {"address": "x:1", "view": 1, "sync": "127.0.0.1:9"})
    monkeypatch.setattr(ha, "fetch_snapshot", lambda address, name: bad)
    c._bootstrap("the log starts at op 9")  # logged, not raised
    assert svc.applied_ops == 0 and len(svc.segments) == 0 and not svc.table.objects and c._log_tail == 0


def test_presence_is_renewed_while_the_control_thread_is_stalled(etcd, monkeypatch):
    c = controller(etcd, "presence")
    stalled = threading.Event()
    release = threading.Event()

    def stuck(ttl):  # a standby round that never ends (a snapshot fetch from a slow leader)
        stalled.set()
        release.wait(30)

    monkeypatch.setattr(c, "_standby_round", stuck)
    c.start()
    try:
        assert stalled.wait(10)
        time.sleep((ha.PRESENCE_TTLS + 1) * TTL)  # past the presence key's lease without other renewals
        assert c.name in c.store.present()
    finally:
        release.set()
        c.stop()
    assert not c._thread.is_alive()
    assert c._presence_thread is not None and not c._presence_thread.is_alive()


def test_the_standby_ring_is_bounded_by_bytes(etcd):
    """Records the leader keeps for standby streams: never more than the byte bound (large batch-commit records
    count by their size), newest first, even when a stream still needs older ones."""
    c = controller(etcd, "ring", ha_sync_standbys=False)
    j = ha.BackendJournal(c._svc, c.store, 64, view=1)
    try:
        with j.cond:
            j.ring = [str(i % 10) * 1000 for i in range(100)]  # ops 1..100, 1000 characters each
            j.ring_bytes, j.ring_first, j.written = 100_000, 1, 100
            j.trim_ring(None, 10_000, 1_000_000)  # within both bounds: kept (RING_KEEP)
            assert (j.ring_first, len(j.ring)) == (1, 100)
            j.trim_ring(1, 10_000, 10_500)  # a stream needs op 1, but the bytes bound wins
            assert j.ring_bytes <= 10_500 and j.ring_bytes == sum(map(len, j.ring))
            assert j.last_lsn() == 100 and j.ring_first == 101 - len(j.ring) and len(j.ring) == 10
            assert j.ring_slice(1, 5) is None and j.ring_slice(91, 100)[0] == "0" * 1000
            j.ring, j.ring_bytes, j.ring_first = ["x" * 50_000], 50_000, 100
            j.trim_ring(None, 10_000, 10_500)  # the newest record is kept whatever its size
            assert (j.ring_first, len(j.ring)) == (100, 1)
    finally:
        j.close()
