"""Durable state: a master's op log (and snapshots) rebuild the same durable state and the same free space in
another MasterService, after random operation sequences (puts, upserts, removes, reservations, SSD tier,
copy/move, expiry, unmount, eviction)."""

import json
import os
import random

import pytest

from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master import durable, ops
from mooncake.store.master.config import MasterConfig
from mooncake.store.master.objects import PutConfig
from mooncake.store.master.service import MasterService, SegmentSpec

KiB = 1 << 10
CLIENTS = ("c0", "c1", "c2")
SIZES = (64, 100, 4 * KiB, 33 * KiB, 100 * KiB)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def comparable(svc) -> dict:
    st = durable.snapshot_state(svc)
    for k in ("taken", "view_version"):
        st.pop(k)
    for k in ("soft_pins", "pending", "held", "busy"):  # wall-clock times: compare to the millisecond
        for row in st[k]:
            for i, v in enumerate(row):
                if isinstance(v, float):
                    row[i] = round(v, 3)
    st["objects"].sort()
    st["free"] = sorted((s.id, s.allocator.free_bytes, s.allocator.free_block_count) for s in svc.segments.all())
    st["used"] = svc.segments.used
    return json.loads(json.dumps(st, sort_keys=True))


def workload(svc, clock, rng, steps, on_step=None):
    specs = {}
    for i, c in enumerate(CLIENTS):
        for j in range(2):
            sid = f"{c}-s{j}"
            specs[sid] = (c, SegmentSpec(sid, f"h{i}", 0x1000000 * (1 + 2 * i + j), 512 * KiB))
            assert svc.mount_segment(c, specs[sid][1]) == E.OK
    assert svc.mount_local_disk("c1", "127.0.0.1:1") == E.OK
    keys = [f"k{i}" for i in range(40)]
    blocks = {}
    for step in range(steps):
        clock.t += rng.choice((0.001, 0.01, 0.5, 2.0))
        key, client = rng.choice(keys), rng.choice(CLIENTS)
        cfg = PutConfig(replica_num=rng.choice((1, 1, 2)), with_soft_pin=rng.random() < 0.2,
                        with_hard_pin=rng.random() < 0.05)
        op = rng.choice(("put", "put", "put", "start", "end", "revoke", "upsert", "get", "remove", "force_remove",
                         "reserve", "reserved", "reserved_batch", "offload", "evict_disk", "tick", "copy", "move",
                         "clear", "unmount", "expire", "release"))
        if op == "put":
            if svc.put_start(client, key, rng.choice(SIZES), cfg)[0] == E.OK:
                svc.put_end(client, key)
        elif op == "start":
            svc.put_start(client, key, rng.choice(SIZES), cfg)
        elif op == "end":
            p = svc.table.pending.get(key)
            svc.put_end(p.client_id if p else client, key)
        elif op == "revoke":
            p = svc.table.pending.get(key)
            if rng.random() < 0.5:
                svc.put_revoke(p.client_id if p else client, key)
            else:  # a writer whose write may still land: the buffers are held
                svc.batch_put_revoke(p.client_id if p else client, [key], unsettled=True)
        elif op == "upsert":
            size = rng.choice(SIZES)
            if svc.upsert_start(client, key, size, cfg)[0] == E.OK and rng.random() < 0.8:
                svc.put_end(client, key)
        elif op == "get":
            svc.get_replica_list(key)
        elif op in ("remove", "force_remove"):
            svc.remove(key, force=op == "force_remove")
        elif op == "reserve":
            code, r = svc.reserve_space(client, 64 * KiB, 4 * KiB, PutConfig())
            if code == E.OK:
                blocks[r.id] = r
        elif op in ("reserved", "reserved_batch") and blocks:
            rid = rng.choice(list(blocks))
            r = blocks[rid]
            if op == "reserved":
                code, _ = svc.put_reserved(r.client_id, rid, key, rng.choice((64, 100, 1000)),
                                           r.segment.base + r.cursor, PutConfig())
            else:
                ks = rng.sample(keys, 3)
                code = svc.put_reserved_batch(r.client_id, rid, ks, [100, 64, 700], r.segment.base + r.cursor,
                                              PutConfig())[0]
            if rid not in svc.reservations:
                del blocks[rid]
        elif op == "release" and blocks:
            rid = rng.choice(list(blocks))
            svc.release_space(blocks.pop(rid).client_id, rid, unsettled=rng.random() < 0.5)
        elif op == "offload":
            tasks, _ = svc.take_offload_tasks("c1", 4)
            svc.notify_offload("c1", [(k, size, rng.randrange(1, 99), v) for k, size, _, v in tasks])
        elif op == "evict_disk" and svc.table.disk:
            k = rng.choice(sorted(svc.table.disk))
            svc.evict_disk_replicas("c1", [(k, 0)])
        elif op == "tick":
            svc.tick()
        elif op in ("copy", "move"):
            target = rng.choice(("h0", "h1", "h2"))
            code = (svc.copy_start(client, key, "", [target]) if op == "copy"
                    else svc.move_start(client, key, "", target))[0]
            if code == E.OK:  # ended, revoked, or left in flight (durable: the next tick may abandon it)
                fate = rng.random()
                if fate < 0.6:
                    (svc.copy_end if op == "copy" else svc.move_end)(client, key)
                elif fate < 0.8:
                    (svc.copy_revoke if op == "copy" else svc.move_revoke)(client, key)
        elif op == "clear":
            svc.batch_replica_clear(client, [key], rng.choice(("", "h0", "h1")))
        elif op == "unmount":
            sid = rng.choice(sorted(specs))
            owner, spec = specs[sid]
            if svc.segments.get(sid) is not None:
                svc.unmount_segment(owner, sid)
            else:
                svc.mount_segment(owner, spec)
        elif op == "expire":
            c = rng.choice(CLIENTS)
            svc.clients.forget(c)
            with svc.lock:
                svc._apply(ops.ExpireClient(c, clock.t))
            for sid, (owner, spec) in specs.items():
                if owner == c:
                    svc.mount_segment(owner, spec)
            if c == "c1":
                svc.mount_local_disk("c1", "127.0.0.1:1")
        if on_step is not None:
            on_step(step)


def leader(tmp_path, clock, **cfg):
    cfg.setdefault("client_ttl_sec", 1e6)
    svc = MasterService(MasterConfig(**cfg), clock=clock, rng=random.Random(3))
    svc.wall = lambda: clock.t + 5e8
    svc.journal = durable.FileJournal(str(tmp_path), svc)
    return svc


def restored(tmp_path, clock, **cfg):
    cfg.setdefault("client_ttl_sec", 1e6)
    svc = MasterService(MasterConfig(**cfg), clock=clock)
    svc.wall = lambda: clock.t + 5e8
    info = durable.recover(svc, str(tmp_path))
    with svc.lock:
        durable.rebuild_allocators(svc)
    return svc, info


@pytest.mark.parametrize("seed", range(6))
def test_log_replay_rebuilds_state_and_free_space(tmp_path, seed):
    clock = Clock()
    svc = leader(tmp_path, clock)
    workload(svc, clock, random.Random(seed), 600)
    other, info = restored(tmp_path, clock)
    assert info == {"snapshot": None, "ops": svc.applied_ops} and svc.applied_ops > 300
    assert comparable(other) == comparable(svc)


@pytest.mark.parametrize("seed", range(3))
def test_snapshots_plus_log_rebuild_state(tmp_path, seed):
    clock = Clock()
    svc = leader(tmp_path, clock)
    snaps = durable.Snapshotter(svc, str(tmp_path), 1e9, 2, svc.journal)
    workload(svc, clock, random.Random(100 + seed), 900, on_step=lambda i: i % 250 == 249 and snaps.take())
    names = sorted(os.listdir(tmp_path))
    assert sum(n.startswith("snapshot.") for n in names) == 2, names  # retention
    other, info = restored(tmp_path, clock)
    assert info["snapshot"] is not None and info["ops"] < svc.applied_ops
    assert comparable(other) == comparable(svc)


def test_standby_applies_ops_as_they_come_and_takes_over(tmp_path):
    """A hot standby: ops replayed batch by batch while the leader runs, then the standby serves."""
    clock = Clock()
    svc = MasterService(MasterConfig(client_ttl_sec=1e6), clock=clock, rng=random.Random(9))
    records = []
    svc.journal = type("J", (), {"append": lambda self, op: records.append(
        dict(ops.encode(op, lambda t: t + 5e8), lsn=svc.applied_ops))})()
    standby = MasterService(MasterConfig(client_ttl_sec=1e6), clock=clock)
    svc.wall = standby.wall = lambda: clock.t + 5e8
    standby.allocators_live = False
    workload(svc, clock, random.Random(7), 400,
             on_step=lambda i: i % 50 == 0 and durable.replay(standby, records))
    durable.replay(standby, records)
    durable.take_over(standby)
    assert comparable(standby) == comparable(svc)
    # The new leader serves: leases floored for one TTL, then puts and removes work as usual.
    key = next(iter(svc.table.objects), None)
    if key is not None:
        assert standby.remove(key) == E.OBJECT_HAS_LEASE
    clock.t += standby.lease_ttl + 0.1
    assert standby.put_start("c0", "fresh", 100)[0] == E.OK and standby.put_end("c0", "fresh") == E.OK
    if key is not None:
        assert standby.remove(key) == E.OK


def test_torn_last_record_and_gaps(tmp_path):
    clock = Clock()
    svc = leader(tmp_path, clock)
    assert svc.mount_segment("c0", SegmentSpec("s", "h", 0x100000, 64 * KiB)) == E.OK
    assert svc.put_start("c0", "a", 100)[0] == E.OK and svc.put_end("c0", "a") == E.OK
    log = [os.path.join(tmp_path, n) for n in os.listdir(tmp_path) if n.startswith("oplog.")][0]
    with open(log, "ab") as f:
        f.write(b'{"op":"Remove","key":"a","at":1')  # a crash mid-write
    other, info = restored(tmp_path, clock)
    assert info["ops"] == 3 and "a" in other.table.objects
    bad = MasterService(MasterConfig(), clock=clock)
    with pytest.raises(ValueError, match="gap"):
        durable.replay(bad, [{"op": "PutRevoke", "key": "a", "lsn": 5}])
    with pytest.raises(ValueError, match="unknown op"):
        durable.replay(bad, [{"op": "Nope", "lsn": 1}])


def test_in_flight_put_survives_a_restart(tmp_path):
    """A put started before the restart is committed by its writer on the restored master (its PutStart,
    retried after the restart, gets the same buffers); one never ended is revoked by the timeout."""
    clock = Clock()
    svc = leader(tmp_path, clock, put_start_discard_timeout_sec=5, put_start_release_timeout_sec=5)
    assert svc.mount_segment("c0", SegmentSpec("s", "h", 0x100000, 64 * KiB)) == E.OK
    code, reps = svc.put_start("c0", "a", 100)
    assert code == E.OK and svc.put_start("c0", "b", 100)[0] == E.OK
    other, _ = restored(tmp_path, clock, put_start_discard_timeout_sec=5, put_start_release_timeout_sec=5)
    durable.take_over(other)
    code, again = other.put_start("c0", "a", 100)
    assert code == E.OK and [(r.segment.id, r.offset) for r in again] == [(r.segment.id, r.offset) for r in reps]
    assert other.put_end("c0", "a") == E.OK and other.get_replica_list("a")[0] == E.OK
    assert other.put_end("c0", "a") == E.OK  # a retried PutEnd after the restart
    clock.t += 6
    other.tick()
    assert "b" not in other.table.pending and other.exist("b") == (E.OK, False)


def test_copy_in_flight_survives_a_restart(tmp_path):
    """A copy started before the restart: the restored master knows its new buffer (a new put never gets that
    space while the executor may still write it), the executor's end adds the replica there; a second copy,
    never ended, is abandoned by the timeout with its buffer held, not freed."""
    clock = Clock()
    cfg = dict(put_start_discard_timeout_sec=5, put_start_release_timeout_sec=5)
    svc = leader(tmp_path, clock, **cfg)
    assert svc.mount_segment("c0", SegmentSpec("a", "h0", 0x100000, 16 * KiB)) == E.OK
    assert svc.mount_segment("c1", SegmentSpec("b", "h1", 0x200000, 16 * KiB)) == E.OK
    for key in ("x", "y"):
        assert svc.put_start("c0", key, 4 * KiB, PutConfig(preferred_segments=("h0",)))[0] == E.OK
        assert svc.put_end("c0", key) == E.OK
    code, _, (target,) = svc.copy_start("c1", "x", "h0", ["h1"])
    assert code == E.OK and target.segment.id == "b"
    code, _, (stuck,) = svc.copy_start("c1", "y", "h0", ["h1"])
    assert code == E.OK
    other, _ = restored(tmp_path, clock, **cfg)
    durable.take_over(other)
    assert comparable(other) == comparable(svc)
    assert set(other.table.busy) == {"x", "y"}
    # h1 has 16 KiB: 8 KiB belong to the two copies; new puts get only the rest, never the copies' buffers.
    taken = {(target.offset, target.size), (stuck.offset, stuck.size)}
    for i in range(2):
        code, reps = other.put_start("c1", f"n{i}", 4 * KiB, PutConfig(preferred_segments=("h1",)))
        assert code == E.OK and reps[0].segment.id == "b" and (reps[0].offset, reps[0].size) not in taken
    assert other.segments.get("b").allocator.free_bytes == 0  # full: the copies' buffers stayed taken
    assert other.copy_end("c1", "x") == E.OK
    code, reps, _ = other.get_replica_list("x")
    assert code == E.OK and sorted(r.segment.id for r in reps) == ["a", "b"]
    assert [(r.offset, r.size) for r in reps if r.segment.id == "b"] == [(target.offset, target.size)]
    clock.t += 6
    other.tick()  # the copy of y timed out: abandoned, its buffer held (the executor may still write)
    assert "y" not in other.table.busy
    assert any(h.key == "y" and h.writer == "c1" and h.replicas[0].offset == stuck.offset for h in other.table.held)
    assert other.copy_end("c1", "y") == E.OBJECT_NO_REPLICATION_TASK


def test_snapshot_encodes_the_objects_outside_the_service_lock(tmp_path, monkeypatch):
    """A snapshot of a large state holds the lock only to copy the object table: the per-object encoding (the
    bulk of the work) runs with the lock free, so RPCs are not stalled for its length."""
    clock = Clock()
    svc = leader(tmp_path, clock)
    assert svc.mount_segment("c0", SegmentSpec("a", "h0", 0x100000, 4096 * KiB)) == E.OK
    for i in range(500):
        assert svc.put_start("c0", f"k{i}", 64)[0] == E.OK and svc.put_end("c0", f"k{i}") == E.OK
    locked = []
    real = durable._reps
    monkeypatch.setattr(durable, "_reps", lambda reps: (locked.append(svc.lock.locked()), real(reps))[1])
    state = durable.snapshot_state(svc)
    assert len(state["objects"]) == 500 and state["objects"][0][1][0][0] == "a"
    assert locked.count(False) >= 500, "objects were encoded under the service lock"
    monkeypatch.setattr(durable, "_reps", real)
    other = MasterService(MasterConfig(client_ttl_sec=1e6), clock=clock)
    durable.load_state(other, json.loads(json.dumps(state)))
    assert len(other.table.objects) == 500


def test_copy_and_move_edge_cases_keep_objects_and_hold_buffers(tmp_path):
    """No copy under an upsert in progress (its end would add old bytes to the new version); a move whose target
    segment went ends with an error and keeps the object; a copy whose source segment went holds its new buffers
    (the executor may still write them); an empty key never releases a reservation's held rest."""
    clock = Clock()
    svc = leader(tmp_path, clock)
    for name, host, base in (("a", "h0", 0x100000), ("b", "h1", 0x200000), ("c", "h2", 0x300000)):
        assert svc.mount_segment("c0", SegmentSpec(name, host, base, 64 * KiB)) == E.OK
    for key in ("u", "m", "s"):
        assert svc.put_start("c0", key, 4 * KiB, PutConfig(preferred_segments=("h0",)))[0] == E.OK
        assert svc.put_end("c0", key) == E.OK
    assert svc.upsert_start("c0", "u", 8 * KiB, PutConfig())[0] == E.OK
    assert svc.copy_start("c1", "u", "h0", ["h1"])[0] == E.OBJECT_REPLICA_BUSY
    assert svc.move_start("c1", "m", "h0", "h2")[0] == E.OK
    assert svc.unmount_segment("c0", "c") == E.OK
    assert svc.move_end("c1", "m") == E.REPLICA_NOT_FOUND
    assert svc.exist("m") == (E.OK, True) and "m" not in svc.table.busy
    code, _, (target,) = svc.copy_start("c1", "s", "h0", ["h1"])
    assert code == E.OK
    assert svc.unmount_segment("c0", "a") == E.OK  # the source went: the copy is void, its target held
    assert "s" not in svc.table.busy
    assert any(h.writer == "c1" and h.replicas[0].offset == target.offset for h in svc.table.held)
    code, r = svc.reserve_space("c0", 16 * KiB, 4 * KiB, PutConfig(preferred_segments=("h1",)))
    assert code == E.OK and svc.release_space("c0", r.id, unsettled=True) == E.OK
    held = len(svc.table.held)
    assert svc.batch_put_end("c0", [""]) == [E.INVALID_PARAMS] and svc.batch_put_revoke("c0", [""]) == [
        E.INVALID_PARAMS]
    assert len(svc.table.held) == held
    other, _ = restored(tmp_path, clock)
    assert comparable(other) == comparable(svc)


def test_holds_of_writes_that_may_still_land_outlive_the_writers_later_calls(tmp_path):
    """An unsettled revoke's hold is not freed by the same client's later end of the key (after a retry was
    discarded); an idle reserved block's rest is held for the discard timeout; held entries drop replicas of an
    unmounted segment on the master as in its snapshots, so later releases match on a restored master."""
    clock = Clock()
    cfg = dict(put_start_discard_timeout_sec=5, put_start_release_timeout_sec=50, reservation_idle_sec=2)
    svc = leader(tmp_path, clock, **cfg)
    assert svc.mount_segment("c0", SegmentSpec("a", "h0", 0x100000, 64 * KiB)) == E.OK
    assert svc.mount_segment("c1", SegmentSpec("b", "h1", 0x200000, 64 * KiB)) == E.OK
    two = PutConfig(replica_num=2)
    assert svc.put_start("c0", "k", 4 * KiB, two)[0] == E.OK
    assert svc.batch_put_revoke("c0", ["k"], unsettled=True) == [E.OK]  # hold H1 (sticky)
    assert svc.put_start("c0", "k", 4 * KiB)[0] == E.OK  # the retry...
    clock.t += 6
    svc.tick()  # ...is discarded by the timeout: hold H2
    assert [h.sticky for h in svc.table.held if h.key == "k"] == [True, False]
    assert svc.put_end("c0", "k") == E.OBJECT_NOT_FOUND  # the retry's late end frees H2 only
    assert [h.sticky for h in svc.table.held if h.key == "k"] == [True]
    code, r = svc.reserve_space("c0", 16 * KiB, 4 * KiB, PutConfig(preferred_segments=("h1",)))
    assert code == E.OK
    clock.t += 3
    svc.tick()  # idle: the block goes, its rest held until now + the discard timeout
    assert r.id not in svc.reservations
    rest = [h for h in svc.table.held if h.key == ""]
    assert len(rest) == 1 and rest[0].release_at == pytest.approx(clock.t + 5) and rest[0].writer == "c0"
    assert svc.unmount_segment("c0", "a") == E.OK  # H1 keeps its replica on b only
    other, _ = restored(tmp_path, clock, **cfg)
    assert comparable(other) == comparable(svc)
    clock.t += 60
    svc.tick()  # every hold runs out: the ReleaseHeld names match on the restored master too
    assert svc.table.held == []
    other2, _ = restored(tmp_path, clock, **cfg)
    assert other2.table.held == [] and comparable(other2) == comparable(svc)
