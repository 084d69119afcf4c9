"""State-machine tests of MasterService with a fake clock (no threads, no network)."""

import random

import pytest

from mooncake.store.master.config import MAX_KEY_BYTES, MasterConfig
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.objects import PutConfig
from mooncake.store.master.service import MasterService, SegmentSpec
from mooncake.store.master.tasks import TaskStatus

KiB, MiB = 1 << 10, 1 << 20


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def advance(self, sec):
        self.t += sec


@pytest.fixture
def clock():
    return Clock()


def make(clock, segments=(("c1", "s1", "h1"),), seg_size=MiB, **cfg):
    cfg.setdefault("client_ttl_sec", 1e6)  # liveness tests set their own
    svc = MasterService(MasterConfig(**cfg), clock=clock, rng=random.Random(5))
    for i, (client, sid, name) in enumerate(segments):
        assert svc.mount_segment(client, SegmentSpec(sid, name, 0x100000 * (i + 1), seg_size)) == E.OK
    return svc


def put(svc, key, size=4 * KiB, client="w", cfg=PutConfig()):
    code, reps = svc.put_start(client, key, size, cfg)
    assert code == E.OK, code
    assert svc.put_end(client, key) == E.OK
    return reps


# -- put / get state machine ---------------------------------------------------------------------------------------
def test_put_lifecycle_and_lease(clock):
    svc = make(clock)
    code, reps = svc.put_start("w", "k", 5000)
    assert code == E.OK and len(reps) == 1 and reps[0].size == 5000
    assert reps[0].address >= 0x100000
    assert svc.get_replica_list("k")[0] == E.REPLICA_IS_NOT_READY
    assert svc.exist("k") == (E.OK, False)
    assert svc.remove("k") == E.REPLICA_IS_NOT_READY
    assert svc.put_end("other", "k") == E.ILLEGAL_CLIENT
    assert svc.put_end("w", "k") == E.OK
    assert svc.put_end("w", "k") == E.INVALID_WRITE
    assert svc.put_start("w", "k", 5000)[0] == E.OBJECT_ALREADY_EXISTS
    code, got, lease_ms = svc.get_replica_list("k")
    assert code == E.OK and got[0].address == reps[0].address and lease_ms == 10_000
    assert svc.remove("k") == E.OBJECT_HAS_LEASE
    clock.advance(10.001)
    assert svc.remove("k") == E.OK
    assert svc.get_replica_list("k")[0] == E.OBJECT_NOT_FOUND
    assert svc.remove("k") == E.OBJECT_NOT_FOUND
    assert svc.segments.used == 0


def test_exist_never_leases_so_polling_cannot_block_removal(clock):
    svc = make(clock)
    put(svc, "k")
    for _ in range(100):
        assert svc.exist("k") == (E.OK, True)
    assert svc.remove("k") == E.OK


def test_exist_grants_lease_when_configured(clock):
    svc = make(clock, exist_grants_lease=True)
    put(svc, "k")
    svc.exist("k")
    assert svc.remove("k") == E.OBJECT_HAS_LEASE


def test_invalid_inputs(clock):
    svc = make(clock)
    assert svc.put_start("w", "", 10)[0] == E.INVALID_PARAMS
    assert svc.put_start("w", "k", 0)[0] == E.INVALID_PARAMS
    assert svc.put_start("", "k", 10)[0] == E.INVALID_PARAMS
    assert svc.put_start("w", "k", 10, PutConfig(replica_num=0))[0] == E.INVALID_PARAMS
    assert svc.put_start("w", "k", 10, PutConfig(replica_num=65))[0] == E.INVALID_PARAMS
    assert svc.put_start("w", "x" * (MAX_KEY_BYTES + 1), 10)[0] == E.INVALID_KEY
    assert svc.batch_put_start("w", ["a", "b"], [1]) == [(E.INVALID_PARAMS, [])] * 2
    assert svc.get_replica_list("")[0] == E.INVALID_PARAMS
    assert svc.remove_by_regex("(")[0] == E.INVALID_PARAMS
    assert svc.get_replica_list_by_regex("[")[0] == E.INVALID_PARAMS
    assert svc.put_revoke("w", "nothing") == E.OBJECT_NOT_FOUND


def test_no_space(clock):
    empty = MasterService(MasterConfig(), clock=clock)
    assert empty.put_start("w", "k", 10)[0] == E.NO_AVAILABLE_HANDLE
    svc = make(clock)
    put(svc, "small")
    assert svc.put_start("w", "huge", 2 * MiB)[0] == E.NO_AVAILABLE_HANDLE
    assert svc.exist("small") == (E.OK, True)  # an impossible request evicts nothing


def test_revoke_frees_space(clock):
    svc = make(clock)
    assert svc.put_start("w", "k", 100 * KiB)[0] == E.OK
    assert svc.segments.used == 100 * KiB
    assert svc.put_revoke("x", "k") == E.ILLEGAL_CLIENT
    assert svc.put_revoke("w", "k") == E.OK
    assert svc.segments.used == 0 and svc.exist("k") == (E.OK, False)


def test_batch_forms(clock):
    svc = make(clock)
    res = svc.batch_put_start("w", ["a", "b", ""], [10, 20, 30])
    assert [c for c, _ in res] == [E.OK, E.OK, E.INVALID_PARAMS]
    assert svc.batch_put_end("w", ["a", "b"]) == [E.OK, E.OK]
    assert svc.batch_exist(["a", "b", "c"]) == [(E.OK, True), (E.OK, True), (E.OK, False)]
    got = svc.batch_get_replica_list(["a", "c"])
    assert got[0][0] == E.OK and got[0][1][0].size == 10 and got[1][0] == E.OBJECT_NOT_FOUND
    clock.advance(11)
    assert svc.batch_remove(["a", "b", "c"]) == [E.OK, E.OK, E.OBJECT_NOT_FOUND]
    svc.batch_put_start("w", ["x"], [10])
    assert svc.batch_put_revoke("w", ["x", "y"]) == [E.OK, E.OBJECT_NOT_FOUND]


def test_remove_by_regex_and_remove_all_skip_leased(clock):
    svc = make(clock)
    for k in ("a/1", "a/2", "b/1", "b/2"):
        put(svc, k)
    svc.get_replica_list("a/2")
    assert svc.remove_by_regex("^a/") == (E.OK, 1)
    assert svc.remove_by_regex("^a/", force=True) == (E.OK, 1)
    svc.get_replica_list("b/1")
    assert svc.remove_all() == (E.OK, 1)
    assert svc.remove_all(force=True) == (E.OK, 1)
    assert svc.remove_all() == (E.OK, 0)


def test_force_remove_of_leased_object_holds_buffers_until_lease_ends(clock):
    svc = make(clock)
    put(svc, "k", 64 * KiB)
    svc.get_replica_list("k")
    assert svc.remove("k", force=True) == E.OK
    assert svc.exist("k") == (E.OK, False)
    assert svc.segments.used == 64 * KiB  # a reader may still be transferring
    clock.advance(10.5)
    svc.tick()
    assert svc.segments.used == 0


def test_get_by_regex_grants_leases(clock):
    svc = make(clock)
    put(svc, "p/1")
    put(svc, "p/2")
    put(svc, "q/1")
    code, found = svc.get_replica_list_by_regex("^p/")
    assert code == E.OK and sorted(found) == ["p/1", "p/2"] and found["p/1"][1] == 10_000
    assert svc.remove("p/1") == E.OBJECT_HAS_LEASE and svc.remove("q/1") == E.OK


# -- upsert --------------------------------------------------------------------------------------------------------
def test_upsert_same_size_is_in_place_and_hides_object_meanwhile(clock):
    svc = make(clock)
    old = put(svc, "k", 8 * KiB)
    code, new = svc.upsert_start("w", "k", 8 * KiB)
    assert code == E.OK and new[0].address == old[0].address
    assert svc.get_replica_list("k")[0] == E.REPLICA_IS_NOT_READY
    assert svc.upsert_start("w2", "k", 8 * KiB)[0] == E.OBJECT_REPLICA_BUSY
    assert svc.put_end("w", "k") == E.OK
    assert svc.get_replica_list("k")[1][0].address == old[0].address
    # revoking an in-place upsert loses the object (its bytes were being overwritten)
    clock.advance(11)
    svc.upsert_start("w", "k", 8 * KiB)
    assert svc.put_revoke("w", "k") == E.OK
    assert svc.exist("k") == (E.OK, False) and svc.segments.used == 0


def test_upsert_new_size_keeps_old_version_readable_until_end(clock):
    svc = make(clock)
    old = put(svc, "k", 8 * KiB)
    svc.get_replica_list("k")  # leased: old buffers must survive the overwrite
    code, new = svc.upsert_start("w", "k", 16 * KiB)
    assert code == E.OK and new[0].address != old[0].address
    code, reps, _ = svc.get_replica_list("k")
    assert code == E.OK and reps[0].size == 8 * KiB
    assert svc.put_end("w", "k") == E.OK
    assert svc.get_replica_list("k")[1][0].size == 16 * KiB
    assert svc.segments.used == 24 * KiB  # old held while leased
    clock.advance(10.5)
    svc.tick()
    assert svc.segments.used == 16 * KiB
    assert svc.upsert_start("w", "fresh", 10)[0] == E.OK  # upsert of a missing key is a put


# -- crashed / stuck writers -------------------------------------------------------------------------------------
def test_stuck_put_is_revoked_and_space_reclaimed(clock):
    svc = make(clock, put_start_discard_timeout_sec=30, put_start_release_timeout_sec=600)
    assert svc.put_start("w", "k", 256 * KiB)[0] == E.OK
    clock.advance(29)
    svc.tick()
    assert svc.get_replica_list("k")[0] == E.REPLICA_IS_NOT_READY
    clock.advance(2)
    svc.tick()
    assert svc.get_replica_list("k")[0] == E.OBJECT_NOT_FOUND  # no key stuck in PROCESSING
    assert svc.segments.used == 256 * KiB  # held: the writer might still be writing
    assert svc.put_start("w2", "k", 4 * KiB)[0] == E.OK  # a new writer may proceed
    clock.advance(600)
    svc.tick()
    assert svc.segments.used == 4 * KiB  # first put's buffers released; the second (stuck too) is held now
    assert svc.metrics.revoked_puts.labels(reason="timeout")._value.get() == 2


def test_late_writer_cannot_commit_over_a_new_put(clock):
    svc = make(clock)
    svc.put_start("w", "k", 64 * KiB)
    clock.advance(31)
    svc.tick()
    assert svc.put_start("w2", "k", 4 * KiB)[0] == E.OK
    assert svc.put_end("w", "k") == E.OBJECT_NOT_FOUND  # its own put is gone; its held buffers are freed
    assert svc.segments.used == 4 * KiB
    assert svc.put_end("w", "k") == E.ILLEGAL_CLIENT  # and the new writer's put is not its to end
    assert svc.put_end("w2", "k") == E.OK


def test_late_writer_end_frees_held_buffers(clock):
    svc = make(clock)
    svc.put_start("w", "k", 64 * KiB)
    clock.advance(31)
    svc.tick()
    assert svc.put_end("w", "k") == E.OBJECT_NOT_FOUND
    assert svc.segments.used == 0


def test_held_buffers_are_reclaimed_under_pressure(clock):
    svc = make(clock)
    svc.put_start("w", "big", 900 * KiB)
    clock.advance(31)
    svc.tick()
    assert svc.put_start("w2", "next", 900 * KiB)[0] == E.OK


def test_new_put_preempts_a_stuck_one(clock):
    svc = make(clock)
    svc.put_start("w", "k", 10)
    assert svc.put_start("w2", "k", 10)[0] == E.OBJECT_ALREADY_EXISTS
    clock.advance(31)
    assert svc.put_start("w2", "k", 10)[0] == E.OK


# -- liveness ------------------------------------------------------------------------------------------------------
def test_client_expiry_unmounts_and_asks_for_remount(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")), client_ttl_sec=10)
    put(svc, "two", cfg=PutConfig(replica_num=2))
    put(svc, "on1", cfg=PutConfig(preferred_segments=("h1",)))
    svc.put_start("c1", "inflight", 10 * KiB, PutConfig(preferred_segments=("h2",)))
    for _ in range(3):
        clock.advance(4)
        assert svc.ping("c2") == (E.OK, True)
        svc.tick()
    assert svc.ping("c1") == (E.OK, False)  # expired: NEED_REMOUNT
    assert [s.id for s in svc.segments.all()] == ["s2"]
    assert svc.exist("on1") == (E.OK, False)
    code, reps, _ = svc.get_replica_list("two")
    assert code == E.OK and [r.segment.name for r in reps] == ["h2"]
    assert svc.get_replica_list("inflight")[0] == E.OBJECT_NOT_FOUND  # its writer died: revoked and freed
    assert svc.segments.used == 4 * KiB
    assert svc.remount_segments("c1", [SegmentSpec("s1", "h1", 0x100000, MiB)]) == E.OK
    assert svc.ping("c1") == (E.OK, True) and len(svc.segments) == 2
    assert svc.remount_segments("c1", [SegmentSpec("s1", "h1", 0x100000, MiB)]) == E.OK  # idempotent


def test_unmount_rules(clock):
    svc = make(clock)
    put(svc, "k")
    assert svc.unmount_segment("c2", "s1") == E.ILLEGAL_CLIENT
    assert svc.unmount_segment("c1", "nope") == E.OK
    assert svc.unmount_segment("c1", "s1") == E.OK
    assert svc.unmount_segment("c1", "s1") == E.OK
    assert svc.exist("k") == (E.OK, False)
    assert svc.ping("unknown") == (E.OK, False)


# -- eviction ------------------------------------------------------------------------------------------------------
def fill(svc, n, size=64 * KiB, prefix="o", cfg=PutConfig()):
    for i in range(n):
        put(svc, f"{prefix}{i}", size, cfg=cfg)


def test_watermark_eviction_is_lru_and_respects_leases_and_pins(clock):
    svc = make(clock, eviction_high_watermark_ratio=0.9, eviction_ratio=0.2)
    put(svc, "hard", cfg=PutConfig(with_hard_pin=True))
    put(svc, "soft", cfg=PutConfig(with_soft_pin=True))
    fill(svc, 14)  # 14 x 64 KiB + 8 KiB: ~88 %
    svc.get_replica_list("o0")  # leased, and most recently used
    svc.get_replica_list("o1")
    clock.advance(11)  # leases of o0/o1 expire; o1 read again -> leased
    svc.get_replica_list("o1")
    put(svc, "o14", 64 * KiB)  # now above 90 %
    svc.tick()
    remaining = {k for k in ["hard", "soft"] + [f"o{i}" for i in range(15)] if svc.exist(k)[1]}
    # 20 % of 1 MiB = 4 objects of 64 KiB, oldest first: o2..o5 (o0/o1 were read, hard/soft pinned)
    assert remaining == {"hard", "soft", "o0", "o1"} | {f"o{i}" for i in range(6, 15)}
    assert svc.metrics.evicted_objects.labels(reason="watermark")._value.get() == 4


def test_soft_pinned_evicted_last_and_only_if_allowed(clock):
    svc = make(clock, eviction_ratio=1.0)
    fill(svc, 4, prefix="s", cfg=PutConfig(with_soft_pin=True))
    fill(svc, 4, prefix="n")
    svc._evict_locked(5 * 64 * KiB, clock(), "test")
    assert [svc.exist(f"n{i}")[1] for i in range(4)] == [False] * 4
    assert [svc.exist(f"s{i}")[1] for i in range(4)] == [False, True, True, True]
    strict = make(clock, allow_evict_soft_pinned_objects=False)
    fill(strict, 2, prefix="s", cfg=PutConfig(with_soft_pin=True))
    strict._evict_locked(MiB, clock(), "test")
    assert strict.exist("s0") == (E.OK, True)
    # an expired soft pin no longer protects
    clock.advance(31 * 60)
    strict._evict_locked(MiB, clock(), "test")
    assert strict.exist("s0") == (E.OK, False)


def test_allocation_failure_evicts_then_succeeds(clock):
    svc = make(clock, eviction_high_watermark_ratio=1.0)
    fill(svc, 16)  # full
    assert svc.put_start("w", "new", 64 * KiB)[0] == E.OK
    assert svc.exist("o0") == (E.OK, False) and svc.exist("o15") == (E.OK, True)
    # everything leased or pinned: nothing can be evicted -> NO_AVAILABLE_HANDLE
    svc2 = make(clock)
    fill(svc2, 16, cfg=PutConfig(with_hard_pin=True))
    assert svc2.put_start("w", "new", 64 * KiB)[0] == E.NO_AVAILABLE_HANDLE
    assert svc2.remove("o3") == E.OK  # hard pins yield to an explicit remove


# -- copy / move / tasks / clear -----------------------------------------------------------------------------------
def test_copy_and_move(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2"), ("c3", "s3", "h3")))
    put(svc, "k", 8 * KiB, cfg=PutConfig(preferred_segments=("h1",)))
    code, src, new = svc.copy_start("c2", "k", "h1", ["h2"])
    assert code == E.OK and src.segment.name == "h1" and [r.segment.name for r in new] == ["h2"]
    assert svc.remove("k") == E.OBJECT_HAS_REPLICATION_TASK
    assert svc.copy_start("c2", "k", "", ["h3"])[0] == E.OBJECT_HAS_REPLICATION_TASK
    assert svc.copy_end("c9", "k") == E.ILLEGAL_CLIENT
    assert svc.move_end("c2", "k") == E.INVALID_PARAMS
    assert svc.copy_end("c2", "k") == E.OK
    assert sorted(r.segment.name for r in svc.get_replica_list("k")[1]) == ["h1", "h2"]
    assert svc.copy_start("c2", "k", "", ["h2"])[0] == E.REPLICA_ALREADY_EXISTS
    assert svc.copy_start("c2", "k", "", ["nowhere"])[0] == E.SEGMENT_NOT_FOUND
    assert svc.copy_start("c2", "k", "h3", ["h3"])[0] == E.REPLICA_NOT_FOUND
    assert svc.copy_start("c2", "missing", "", ["h3"])[0] == E.OBJECT_NOT_FOUND
    assert svc.copy_end("c2", "k") == E.OBJECT_NO_REPLICATION_TASK
    code, src, new = svc.move_start("c3", "k", "h1", "h3")
    assert code == E.OK
    assert svc.move_end("c3", "k") == E.OK
    assert sorted(r.segment.name for r in svc.get_replica_list("k")[1]) == ["h2", "h3"]
    used = svc.segments.used
    assert svc.copy_start("c2", "k", "", ["h1"])[0] == E.OK
    assert svc.copy_revoke("c2", "k") == E.OK and svc.segments.used == used
    assert svc.copy_start("c2", "k", "", ["h1"])[0] == E.OK
    assert svc.remove("k", force=True) == E.OK  # cancels the copy


def test_tasks(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")), pending_task_timeout_sec=5)
    put(svc, "k", cfg=PutConfig(preferred_segments=("h1",)))
    code, tid = svc.create_copy_task("k", ["h2"])
    assert code == E.OK and svc.query_task(tid).status == TaskStatus.PENDING
    assert svc.create_move_task("k", "h1", "h2")[0] == E.OBJECT_HAS_REPLICATION_TASK
    assert svc.fetch_tasks("c1", 10) == []
    [task] = svc.fetch_tasks("c2", 10)
    assert task.id == tid and task.status == TaskStatus.PROCESSING and task.source == "h1"
    assert svc.mark_task_complete("c1", tid, True) == E.ILLEGAL_CLIENT
    assert svc.mark_task_complete("c2", "nope", True) == E.TASK_NOT_FOUND
    assert svc.mark_task_complete("c2", tid, True, "done") == E.OK
    assert svc.query_task(tid).status == TaskStatus.SUCCESS
    assert svc.create_copy_task("missing", ["h2"])[0] == E.OBJECT_NOT_FOUND
    assert svc.create_copy_task("k", ["h9"])[0] == E.SEGMENT_NOT_FOUND
    code, tid2 = svc.create_move_task("k", "h1", "h2")
    assert code == E.OK
    clock.advance(6)
    svc.tick()
    assert svc.query_task(tid2).status == TaskStatus.FAILED and "timed out" in svc.query_task(tid2).message


def test_batch_replica_clear(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")))
    put(svc, "a", cfg=PutConfig(replica_num=2))
    put(svc, "b", cfg=PutConfig(replica_num=2))
    put(svc, "leased")
    svc.get_replica_list("leased")
    code, cleared = svc.batch_replica_clear("c1", ["a", "leased", "missing"], "h1")
    assert code == E.OK and cleared == ["a"]
    assert [r.segment.name for r in svc.get_replica_list("a")[1]] == ["h2"]
    assert svc.batch_replica_clear("c1", ["b"], "")[1] == ["b"] and svc.exist("b") == (E.OK, False)


def test_snapshot_and_describe(clock):
    svc = make(clock)
    put(svc, "k", 100, cfg=PutConfig(with_hard_pin=True))
    s = svc.snapshot()
    assert s["objects"] == 1 and s["used_bytes"] == 128 and s["hard_pinned"] == 1
    assert s["segments"][0]["used_bytes"] == 128
    code, info = svc.describe_key("k")
    assert code == E.OK and info["size"] == 100 and info["hard_pinned"] and info["lease_ms_left"] == 0
    assert svc.describe_key("zz")[0] == E.OBJECT_NOT_FOUND


# -- regressions found in review -----------------------------------------------------------------------------------
def test_in_place_upsert_lost_with_its_writer_leaves_no_stale_pins(clock):
    svc = make(clock, client_ttl_sec=5)
    put(svc, "k", 4 * KiB, client="c2", cfg=PutConfig(with_hard_pin=True, with_soft_pin=True))
    assert svc.remount_segments("c2", []) == E.OK  # c2 is a live client (no memory of its own)
    assert svc.upsert_start("c2", "k", 4 * KiB)[0] == E.OK  # same shape: overwritten in place
    clock.advance(6)
    svc.ping("c1")
    svc.tick()  # c2 expired: its upsert is revoked and the half-written object is gone
    assert svc.exist("k") == (E.OK, False)
    s = svc.snapshot()
    assert (s["hard_pinned"], s["soft_pinned"], s["used_bytes"]) == (0, 0, 0)


def test_key_limit_counts_utf8_bytes(clock):
    svc = make(clock)
    assert MAX_KEY_BYTES == 65536
    assert svc.put_start("w", "é" * (MAX_KEY_BYTES // 2), 10)[0] == E.OK  # 2 bytes each: at the limit
    assert svc.put_start("w", "é" * (MAX_KEY_BYTES // 2 + 1), 10)[0] == E.INVALID_KEY
    assert svc.get_replica_list("€" * (MAX_KEY_BYTES // 3 + 1))[0] == E.INVALID_KEY  # 21846 chars, 65538 bytes


def test_fruitless_watermark_eviction_backs_off(clock):
    svc = make(clock, eviction_high_watermark_ratio=0.5, eviction_ratio=0.1)
    fill(svc, 10, cfg=PutConfig(with_hard_pin=True))  # 62.5 %, nothing evictable
    svc.tick()
    put(svc, "free", 64 * KiB)
    svc.tick()  # within the back-off: no new scan
    assert svc.exist("free") == (E.OK, True)
    clock.advance(1.0)
    svc.tick()
    assert svc.exist("free") == (E.OK, False)
    assert svc.metrics.evicted_objects.labels(reason="watermark")._value.get() == 1


def test_tasks_are_handed_out_as_snapshots(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")))
    put(svc, "k", cfg=PutConfig(preferred_segments=("h1",)))
    _, tid = svc.create_copy_task("k", ["h2"])
    [fetched] = svc.fetch_tasks("c2", 1)
    queried = svc.query_task(tid)
    assert svc.mark_task_complete("c2", tid, False, "boom") == E.OK
    # what an RPC handler is still serialising does not change under it
    assert fetched.status == queried.status == TaskStatus.PROCESSING and queried.message == ""
    assert svc.query_task(tid).status == TaskStatus.FAILED and svc.query_task(tid).message == "boom"


# -- SSD tier: LOCAL_DISK replicas ---------------------------------------------------------------------------------
def _tasks(svc, owner, capacity=1000):
    """The owner's offload tasks handed out by a ping: {key: (size, address, version)}."""
    tasks, _ = svc.take_offload_tasks(owner, capacity)
    return {k: (n, a, v) for k, n, a, v in tasks}


def _offloaded(svc, key, size=4 * KiB, owner="c1", seq=1, writer="w", segment="h1"):
    """`writer` puts `key` into `segment` (of `owner`, which has an SSD tier); the owner persists it."""
    put(svc, key, size, client=writer, cfg=PutConfig(preferred_segments=(segment,)))
    n, addr, version = _tasks(svc, owner)[key]
    assert n == size and addr == svc.describe_key(key)[1]["replicas"][0]["address"]
    assert svc.notify_offload(owner, [(key, size, seq, version)]) == [E.OK]


def _evict_memory(svc, key):
    """What eviction does to one object (whatever its lease): its memory replicas go."""
    with svc.lock:
        svc.disk_tier.cancel_offload(key)
        svc._free(svc.table.drop(key))


def test_disk_replica_outlives_memory_and_is_promoted(clock):
    from mooncake.store.master.objects import DiskReplica
    svc = make(clock)
    assert svc.mount_local_disk("c1", "127.0.0.1:7000") == E.OK
    assert svc.notify_offload("nobody", [("k", 1, 1, 1)]) == [E.CLIENT_NOT_FOUND]
    _offloaded(svc, "k", 5000, seq=7)
    code, reps, _ = svc.get_replica_list("k")
    assert code == E.OK and len(reps) == 2 and isinstance(reps[1], DiskReplica)
    _evict_memory(svc, "k")  # memory gone: the object lives on, disk-only
    code, reps, lease_ms = svc.get_replica_list("k")
    assert code == E.OK and lease_ms > 0 and len(reps) == 1
    assert (reps[0].owner.client_id, reps[0].owner.endpoint, reps[0].size, reps[0].seq) == \
        ("c1", "127.0.0.1:7000", 5000, 7)
    assert svc.exist("k") == (E.OK, True) and svc.describe_key("k")[1]["disk_replica"]["seq"] == 7
    assert svc.put_start("w", "k", 5000)[0] == E.OBJECT_ALREADY_EXISTS  # exists like any object
    assert svc.put_start("w", "k", 4000, promote=True)[0] == E.INVALID_PARAMS
    assert svc.put_start("w", "nope", 4000, promote=True)[0] == E.OBJECT_NOT_FOUND
    assert svc.put_start("w", "k", 5000, promote=True)[0] == E.OK
    assert svc.put_end("w", "k") == E.OK
    assert len(svc.get_replica_list("k")[1]) == 2  # memory again, the disk replica stays
    assert _tasks(svc, "c1") == {}  # ... and no offload of what is on disk already
    assert svc.put_start("w", "k", 5000, promote=True)[0] == E.OBJECT_ALREADY_EXISTS
    assert svc.take_disk_drops("c1") == ([], 0) and svc.snapshot()["disk_replicas"] == 1


def test_disk_replica_removal_reaches_the_owner(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")))
    assert svc.mount_local_disk("c1", "h:1") == E.OK
    for i, k in enumerate(("a", "b", "c", "x1", "x2")):
        _offloaded(svc, k, seq=i + 1)
        _evict_memory(svc, k) if k != "c" else None
    svc.get_replica_list("a")  # leased: a non-force remove must wait
    assert svc.remove("a") == E.OBJECT_HAS_LEASE
    assert svc.remove("a", force=True) == E.OK and svc.exist("a") == (E.OK, False)
    assert svc.remove_by_regex("^x") == (E.OK, 2)
    drops, n = svc.take_disk_drops("c1")
    assert drops == [("a", 1), ("x1", 4), ("x2", 5)] and n > 0
    assert svc.take_disk_drops("c1") == (drops, n)  # not acknowledged (that reply may be lost): again
    assert svc.take_disk_drops("c1", n + 1) == (drops, n)  # an ack beyond what was handed out: ignored
    assert svc.take_disk_drops("c1", n) == ([], 0)
    # An upsert by another client makes the file obsolete; the new version (in place: still in c1's
    # segment) is c1's to persist.
    assert svc.upsert_start("c2", "c", 4 * KiB)[0] == E.OK and svc.put_end("c2", "c") == E.OK
    drops, n = svc.take_disk_drops("c1", n)
    assert drops == [("c", 3)] and svc.describe_key("c")[1]["disk_replica"] is None
    assert list(_tasks(svc, "c1")) == ["c"] and svc.snapshot()["offload_pending"] == 1
    assert svc.remove_all() == (E.OK, 2)  # b (disk-only) and c
    # Acknowledging the earlier reply leaves the notice that came after it.
    assert svc.take_disk_drops("c1", n)[0] == [("b", 2)]


def test_lost_ping_replies_lose_no_disk_drops(clock):
    """Drop notices stay until acknowledged: one ping reply lost, the next carries them again; an ack of an
    older reply trims only what it covered; an ack from before a master restart trims nothing."""
    svc = make(clock, segments=(("c1", "s1", "h1"),))
    assert svc.mount_local_disk("c1", "h:1") == E.OK
    for i, k in enumerate(("a", "b")):
        _offloaded(svc, k, seq=i + 1)
    assert svc.remove("a") == E.OK
    lost, n1 = svc.take_disk_drops("c1")  # this reply never arrives
    assert lost == [("a", 1)]
    assert svc.remove("b") == E.OK
    drops, n2 = svc.take_disk_drops("c1")  # the next ping, no ack
    assert drops == [("a", 1), ("b", 2)] and n2 > n1
    assert svc.take_disk_drops("c1", n1) == ([("b", 2)], n2)
    other = make(clock, segments=(("c1", "s1", "h1"),))  # a restarted master: its numbers start elsewhere
    assert other.mount_local_disk("c1", "h:1") == E.OK
    _offloaded(other, "c", seq=3)
    assert other.remove("c") == E.OK
    assert other.take_disk_drops("c1", n2)[0] == [("c", 3)]
    assert svc.take_disk_drops("c1", n2) == ([], 0)


def test_offload_tasks_go_to_the_segment_owner(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")), offloading_queue_limit=3)
    assert svc.mount_local_disk("c1", "h:1") == E.OK
    assert svc.take_offload_tasks("c1", 0) == ([], 0) and svc.take_offload_tasks("c2", 10) == ([], 0)
    for k in ("p0", "p1", "p2", "p3"):  # written by a pure client into c1's pool: c1 persists them
        put(svc, k, client="pure", cfg=PutConfig(preferred_segments=("h1",)))
    put(svc, "elsewhere", client="c1", cfg=PutConfig(preferred_segments=("h2",)))  # c2 has no SSD tier
    assert svc.snapshot()["offload_queued"] == 3 and svc.snapshot()["offload_dropped"] == 1  # p3: queue full
    assert svc.metrics.offload_dropped._value.get() == 1
    assert svc.remove("p0") == E.OK  # cancelled before it was handed out: skipped
    tasks, backlog = svc.take_offload_tasks("c1", 1)
    assert [t[0] for t in tasks] == ["p1"] and backlog == 1
    assert svc.describe_key("p1")[1]["offload_pending"] and svc.describe_key("p3")[1]["offload_pending"] is False
    # Two replicas, one in c1's segment: c1 persists the object.
    put(svc, "two", client="pure", cfg=PutConfig(replica_num=2))
    assert set(_tasks(svc, "c1")) == {"p2", "two"}
    assert svc.snapshot()["offload_queued"] == 0 and svc.snapshot()["offload_pending"] == 3


def test_stale_offload_copies_are_refused(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")))
    assert svc.mount_local_disk("c1", "h:1") == E.OK
    on_h1 = PutConfig(preferred_segments=("h1",))

    def task(key):
        put(svc, key, client="w", cfg=on_h1)
        return _tasks(svc, "c1")[key][2]

    put(svc, "early", client="w", cfg=on_h1)
    guess = svc.disk_tier._offload_version
    assert svc.notify_offload("c1", [("early", 4 * KiB, 1, guess)]) == [E.OBJECT_NOT_FOUND]  # not handed out
    assert _tasks(svc, "c1")["early"][2] == guess
    assert svc.notify_offload("c1", [("early", 4 * KiB, 1, guess)]) == [E.OK]
    v = task("gone")
    assert svc.remove("gone") == E.OK
    assert svc.notify_offload("c1", [("gone", 4 * KiB, 1, v)]) == [E.OBJECT_NOT_FOUND]  # removed meanwhile
    v = task("evicted")
    _evict_memory(svc, "evicted")  # its memory may belong to another object already
    assert svc.notify_offload("c1", [("evicted", 4 * KiB, 2, v)]) == [E.OBJECT_NOT_FOUND]
    assert svc.exist("evicted") == (E.OK, False)
    v = task("inplace")
    assert svc.upsert_start("w", "inplace", 4 * KiB)[0] == E.OK  # same size, no lease: the same buffers
    assert svc.notify_offload("c1", [("inplace", 4 * KiB, 3, v)]) == [E.OBJECT_NOT_FOUND]  # torn copy
    assert svc.put_end("w", "inplace") == E.OK
    v2 = _tasks(svc, "c1")["inplace"][2]
    assert svc.notify_offload("c1", [("inplace", 4 * KiB, 4, v)]) == [E.OBJECT_NOT_FOUND]  # the old version
    assert svc.notify_offload("c2", [("inplace", 4 * KiB, 4, v2)]) == [E.CLIENT_NOT_FOUND]
    assert svc.notify_offload("c1", [("inplace", 4 * KiB, 4, 0), ("inplace", 5, 4, v2)]) == [E.OBJECT_NOT_FOUND] * 2
    assert svc.notify_offload("c1", [("inplace", 4 * KiB, 4, v2)]) == [E.OK]
    assert svc.notify_offload("c1", [("inplace", 4 * KiB, 4, v2)]) == [E.OBJECT_NOT_FOUND]  # once only
    v = task("moved")
    assert svc.move_start("mover", "moved", "h1", "h2")[0] == E.OK and svc.move_end("mover", "moved") == E.OK
    assert svc.notify_offload("c1", [("moved", 4 * KiB, 5, v)]) == [E.OBJECT_NOT_FOUND]
    assert svc.snapshot()["offload_pending"] == 0
    v = task("unmounted")
    assert svc.unmount_segment("c1", "s1") == E.OK
    assert svc.notify_offload("c1", [("unmounted", 4 * KiB, 6, v)]) == [E.OBJECT_NOT_FOUND]
    # Files found at start-up: absent objects come back; one in memory may be newer than the file (whatever
    # its size): stale, unless the master recorded that very file.
    put(svc, "other", client="w")
    assert svc.notify_offload("c1", [("old", 10, 4, 0), ("other", 5, 5, 0), ("other", 4 * KiB, 6, 0)],
                              reload=True) == [E.OK, E.OBJECT_NOT_FOUND, E.OBJECT_NOT_FOUND]
    assert svc.get_replica_list("old")[1][0].size == 10
    assert svc.mount_local_disk("c2", "h:2") == E.OK
    assert svc.notify_offload("c2", [("old", 10, 1, 0)], reload=True) == [E.REPLICA_ALREADY_EXISTS]
    assert svc.evict_disk_replicas("c1", [("old", 99), ("old", 0)]) == [E.REPLICA_NOT_FOUND, E.OK]
    assert svc.exist("old") == (E.OK, False)
    assert svc.evict_disk_replicas("c2", [("inplace", 4)]) == [E.REPLICA_NOT_FOUND]  # not c2's


def test_eviction_spares_objects_being_persisted(clock):
    from mooncake.store.master.eviction import OFFLOAD_GRACE_SEC
    svc = make(clock, seg_size=64 * KiB)
    assert svc.mount_local_disk("c1", "h:1") == E.OK
    put(svc, "unsaved", 16 * KiB)  # the least recently used, but its file is not written yet
    _offloaded(svc, "saved", 16 * KiB)
    put(svc, "plain", 16 * KiB)
    with svc.lock:
        svc.disk_tier.cancel_offload("plain")  # as if its owner had no SSD tier
    assert svc._evict_locked(1, clock(), "test") == 1  # "saved" lives on, disk-only
    assert svc.describe_key("saved")[1]["replicas"] == [] and svc.exist("unsaved") == (E.OK, True)
    assert svc._evict_locked(1, clock(), "test") == 1
    assert svc.exist("plain") == (E.OK, False) and svc.exist("unsaved") == (E.OK, True)
    assert svc._evict_locked(1, clock(), "test") == 1  # nothing else left: it goes after all
    assert svc.exist("unsaved") == (E.OK, False)
    put(svc, "late", 16 * KiB)
    put(svc, "fresh", 16 * KiB)
    clock.advance(OFFLOAD_GRACE_SEC)  # an owner that does not persist within the grace protects nothing
    put(svc, "newer", 16 * KiB)
    assert svc._evict_locked(1, clock(), "test") == 1 and svc.exist("late") == (E.OK, False)
    assert svc.snapshot()["offload_pending"] == 2


def test_owner_unmount_or_expiry_drops_its_disk_replicas(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")), client_ttl_sec=10)
    assert svc.mount_local_disk("c2", "h:2") == E.OK
    for k in ("p", "q"):
        _offloaded(svc, k, owner="c2", segment="h2")
    put(svc, "r", cfg=PutConfig(preferred_segments=("h2",)))  # its task goes with the tier
    _evict_memory(svc, "p")
    assert svc.unmount_local_disk("c2") == (E.OK, 2)
    assert svc.exist("p") == (E.OK, False) and len(svc.get_replica_list("q")[1]) == 1  # q: memory left
    assert svc.snapshot()["offload_pending"] == 0
    assert svc.notify_offload("c2", [("q", 4 * KiB, 1, 0)], reload=True) == [E.CLIENT_NOT_FOUND]
    assert svc.mount_local_disk("c2", "h:3") == E.OK
    assert svc.notify_offload("c2", [("q", 4 * KiB, 1, 0)], reload=True) == [E.OBJECT_NOT_FOUND]  # in memory
    _evict_memory(svc, "q")
    assert svc.notify_offload("c2", [("q", 4 * KiB, 1, 0)], reload=True) == [E.OK]
    clock.advance(5)
    svc.ping("c1")
    clock.advance(6)
    svc.tick()  # c2 expired
    assert svc.exist("q") == (E.OK, False) and svc.snapshot()["disk_clients"] == 0


def test_offload_versions_differ_across_master_restarts(clock):
    """A restarted master replays the same puts: a report of the old master's task must not match."""
    def run():
        svc = make(clock)
        assert svc.mount_local_disk("c1", "h:1") == E.OK
        put(svc, "k", cfg=PutConfig(preferred_segments=("h1",)))
        return svc, _tasks(svc, "c1")["k"][2]
    old, v_old = run()
    new, v_new = run()
    assert v_old != v_new and v_old >= 1 << 20 and v_new >= 1 << 20
    assert new.notify_offload("c1", [("k", 4 * KiB, 1, v_old)]) == [E.OBJECT_NOT_FOUND]
    assert new.notify_offload("c1", [("k", 4 * KiB, 1, v_new)]) == [E.OK]


def test_dropped_disk_replica_discards_its_promote(clock):
    svc = make(clock)
    assert svc.mount_local_disk("c1", "h:1") == E.OK
    for i, k in enumerate(("a", "b")):
        _offloaded(svc, k, seq=i + 1)
        _evict_memory(svc, k)
        assert svc.put_start("w", k, 4 * KiB, promote=True)[0] == E.OK
    assert svc.evict_disk_replicas("c1", [("a", 1)]) == [E.OK]  # the owner deleted the file
    assert svc.put_end("w", "a") == E.OBJECT_NOT_FOUND and svc.exist("a") == (E.OK, False)
    assert svc.unmount_local_disk("c1") == (E.OK, 1)
    assert svc.put_end("w", "b") == E.OBJECT_NOT_FOUND and svc.exist("b") == (E.OK, False)
    assert svc.snapshot()["disk_replicas"] == 0


def test_move_end_cancels_the_offload_of_the_moved_replica(clock):
    svc = make(clock, segments=(("c1", "s1", "h1"), ("c2", "s2", "h2")))
    assert svc.mount_local_disk("c1", "h:1") == E.OK
    put(svc, "m", client="w", cfg=PutConfig(preferred_segments=("h1",)))
    assert svc.describe_key("m")[1]["offload_pending"]
    assert svc.move_start("mover", "m", "h1", "h2")[0] == E.OK and svc.move_end("mover", "m") == E.OK
    assert svc.describe_key("m")[1]["offload_pending"] is False and svc.snapshot()["offload_pending"] == 0
    assert _tasks(svc, "c1") == {}  # skipped when handed out


def test_reload_of_an_object_in_memory_needs_the_recorded_file(clock):
    svc = make(clock)
    assert svc.mount_local_disk("c1", "h:1") == E.OK
    _offloaded(svc, "k", seq=3)
    assert svc.notify_offload("c1", [("k", 4 * KiB, 3, 0)], reload=True) == [E.OK]  # the file recorded
    assert svc.notify_offload("c1", [("k", 4 * KiB, 2, 0)], reload=True) == [E.OBJECT_NOT_FOUND]
    assert svc.describe_key("k")[1]["disk_replica"]["seq"] == 3
    assert svc.upsert_start("w", "k", 4 * KiB)[0] == E.OK and svc.put_end("w", "k") == E.OK  # same size
    assert svc.notify_offload("c1", [("k", 4 * KiB, 3, 0)], reload=True) == [E.OBJECT_NOT_FOUND]  # stale file
