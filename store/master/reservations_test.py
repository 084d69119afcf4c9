"""Reserved space (one-round-trip puts): grants, carving, conflicts, misuse and every way a block is freed."""

import random

import pytest

from mooncake.store.master.config import MasterConfig
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.objects import PutConfig
from mooncake.store.master.service import MasterService, SegmentSpec

KiB, MiB = 1 << 10, 1 << 20
BASE = 0x100000


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make(clock, seg_size=4 * MiB, **cfg):
    cfg.setdefault("client_ttl_sec", 1e6)
    cfg.setdefault("eviction_high_watermark_ratio", 1.0)
    svc = MasterService(MasterConfig(**cfg), clock=clock, rng=random.Random(5))
    assert svc.mount_segment("owner", SegmentSpec("s1", "seg1", BASE, seg_size)) == E.OK
    return svc


@pytest.fixture
def clock():
    return Clock()


def used(svc):
    return svc.segments.used


def test_objects_are_carved_in_order_and_readable_at_once(clock):
    svc = make(clock)
    code, r = svc.reserve_space("w", 1 * MiB, 5000, PutConfig())
    assert code == E.OK and r.end - r.cursor == MiB  # a quarter of 4 MiB
    assert used(svc) == MiB
    start = BASE + r.cursor
    code, cursor = svc.put_reserved("w", r.id, "a", 5000, start, PutConfig())
    assert code == E.OK and cursor == start + 5056  # 5000 rounded up to the 64-byte granule
    code, reps, _ = svc.get_replica_list("a")
    assert code == E.OK and reps[0].address == start and reps[0].size == 5000
    assert svc.put_reserved("w", r.id, "b", 100, cursor, PutConfig(with_hard_pin=True)) == (E.OK, cursor + 128)
    assert "b" in svc.table.hard_pins
    assert used(svc) == MiB  # carving moves bytes from the block to objects
    clock.t += 60  # past the read lease
    assert svc.remove("a") == E.OK
    assert used(svc) == MiB - 5056
    assert svc.release_space("w", r.id) == E.OK
    assert used(svc) == 128  # only "b" is left
    assert svc.release_space("w", r.id) == E.OBJECT_NOT_FOUND


def test_existing_key_keeps_the_space(clock):
    svc = make(clock)
    assert svc.put_start("x", "k", 10)[0] == E.OK and svc.put_end("x", "k") == E.OK
    code, r = svc.reserve_space("w", MiB, 64, PutConfig())
    start = BASE + r.cursor
    assert svc.put_reserved("w", r.id, "k", 64, start, PutConfig()) == (E.OBJECT_ALREADY_EXISTS, start)
    assert svc.put_start("x", "p", 10)[0] == E.OK  # being put by someone else: taken too
    assert svc.put_reserved("w", r.id, "p", 64, start, PutConfig()) == (E.OBJECT_ALREADY_EXISTS, start)
    assert svc.put_reserved("w", r.id, "new", 64, start, PutConfig()) == (E.OK, start + 64)


def test_misuse_drops_the_block(clock):
    svc = make(clock)
    _, r = svc.reserve_space("w", 4096, 64, PutConfig())
    start = BASE + r.cursor
    assert svc.put_reserved("other", r.id, "k", 64, start, PutConfig()) == (E.OBJECT_NOT_FOUND, 0)
    assert svc.put_reserved("w", r.id, "", 64, start, PutConfig()) == (E.INVALID_PARAMS, start)
    assert svc.put_reserved("w", r.id, "k", 64, start, PutConfig(replica_num=2))[0] == E.INVALID_PARAMS
    assert svc.put_reserved("w", r.id, "k", 64, start + 64, PutConfig()) == (E.INVALID_PARAMS, 0)  # not the cursor
    assert r.id not in svc.reservations and used(svc) == 0
    _, r = svc.reserve_space("w", 4096, 64, PutConfig())
    assert svc.put_reserved("w", r.id, "k", 8192, BASE + r.cursor, PutConfig()) == (E.INVALID_PARAMS, 0)  # too big
    assert used(svc) == 0 and svc.get_replica_list("k")[0] == E.OBJECT_NOT_FOUND
    assert svc.put_reserved("w", 12345, "k", 64, BASE, PutConfig()) == (E.OBJECT_NOT_FOUND, 0)


def test_a_full_block_is_gone_after_its_last_object(clock):
    svc = make(clock)
    _, r = svc.reserve_space("w", 128, 64, PutConfig())
    start = BASE + r.cursor
    assert svc.put_reserved("w", r.id, "a", 64, start, PutConfig()) == (E.OK, start + 64)
    assert svc.put_reserved("w", r.id, "b", 64, start + 64, PutConfig()) == (E.OK, start + 128)
    assert r.id not in svc.reservations and used(svc) == 128


def test_grants_never_evict_and_stay_under_the_watermark(clock):
    svc = make(clock, seg_size=MiB, eviction_high_watermark_ratio=0.5, max_reservation_bytes=64 * MiB)
    code, r = svc.reserve_space("w", 64 * MiB, 4096, PutConfig())
    assert code == E.OK and r.end - r.cursor == MiB // 8  # a quarter of the room under the watermark
    assert svc.reserve_space("w", MiB, 200 * 1024, PutConfig())[0] == E.NO_AVAILABLE_HANDLE
    svc.tick()
    assert svc.snapshot()["used_bytes"] == MiB // 8 and r.id in svc.reservations
    assert svc.reserve_space("w", MiB, 0, PutConfig())[0] == E.INVALID_PARAMS
    assert svc.reserve_space("w", MiB, 64, PutConfig(replica_num=2))[0] == E.INVALID_PARAMS
    svc2 = make(clock, reservation_idle_sec=0)
    assert svc2.reserve_space("w", MiB, 64, PutConfig())[0] == E.UNAVAILABLE_IN_CURRENT_MODE


def test_at_most_a_few_blocks_per_client(clock):
    svc = make(clock)
    codes = [svc.reserve_space("w", 4096, 64, PutConfig())[0] for _ in range(10)]
    assert codes.count(E.OK) == 8 and codes[-1] == E.NO_AVAILABLE_HANDLE
    assert svc.reserve_space("other", 4096, 64, PutConfig())[0] == E.OK


def test_idle_blocks_and_those_of_expired_clients_are_freed(clock):
    svc = make(clock, reservation_idle_sec=5, client_ttl_sec=30)
    _, idle = svc.reserve_space("w", 4096, 64, PutConfig())
    _, busy = svc.reserve_space("w", 4096, 64, PutConfig())
    clock.t += 4
    assert svc.put_reserved("w", busy.id, "k", 64, BASE + busy.cursor, PutConfig())[0] == E.OK
    clock.t += 2
    svc.tick()
    assert idle.id not in svc.reservations and busy.id in svc.reservations
    assert used(svc) == 8192  # the busy block, "k" included, and the idle one held (a write may be in flight)
    assert [h.writer for h in svc.table.held] == ["w"]
    svc.ping("owner")
    clock.t += 31
    svc.ping("owner")
    svc.tick()  # "w" never pinged: it expired, its block goes; its object stays (in the owner's segment)
    assert busy.id not in svc.reservations and used(svc) == 64
    assert svc.get_replica_list("k")[0] == E.OK


def test_renew_confirms_a_block_or_says_it_is_gone(clock):
    svc = make(clock, reservation_idle_sec=5)
    _, r = svc.reserve_space("w", 4096, 64, PutConfig())
    clock.t += 4
    assert svc.reserve_space("w", 0, 0, PutConfig(), renew=r.id) == (E.OK, r)
    assert svc.reserve_space("x", 0, 0, PutConfig(), renew=r.id) == (E.OBJECT_NOT_FOUND, None)
    clock.t += 4
    svc.tick()
    assert r.id in svc.reservations  # renewed 4 s ago
    clock.t += 2
    svc.tick()
    assert svc.reserve_space("w", 0, 0, PutConfig(), renew=r.id) == (E.OBJECT_NOT_FOUND, None)


def test_unmount_of_the_segment_drops_its_blocks(clock):
    svc = make(clock)
    _, r = svc.reserve_space("w", 4096, 64, PutConfig())
    assert svc.unmount_segment("owner", "s1") == E.OK
    assert r.id not in svc.reservations
    assert svc.put_reserved("w", r.id, "k", 64, BASE + r.cursor, PutConfig()) == (E.OBJECT_NOT_FOUND, 0)


def test_placement_follows_the_preferred_segment(clock):
    svc = make(clock)
    assert svc.mount_segment("owner2", SegmentSpec("s2", "seg2", 0x900000, 4 * MiB)) == E.OK
    for _ in range(4):
        _, r = svc.reserve_space("w", 4096, 64, PutConfig(preferred_segments=("seg2",)))
        assert r.segment.name == "seg2"
        svc.release_space("w", r.id)


def test_a_preferred_segment_too_small_for_the_block_gets_a_smaller_one(clock):
    """The preference wins over the block's size: a 1 MiB segment holds a block of what fits (down to min_size),
    never one on the larger segment; only when the preferred one lacks min_size is another used."""
    svc = make(clock, seg_size=16 * MiB)
    assert svc.mount_segment("owner2", SegmentSpec("s2", "small", 0x9000000, 1 * MiB)) == E.OK
    code, r = svc.reserve_space("w", 4 * MiB, 64 * KiB, PutConfig(preferred_segments=("small",)))
    assert code == E.OK and r.segment.name == "small" and r.end - r.cursor == MiB
    code, r2 = svc.reserve_space("w", 4 * MiB, 64 * KiB, PutConfig(preferred_segments=("small",)))
    assert code == E.OK and r2.segment.name == "seg1"  # the small one is full


def test_batch_is_carved_back_to_back_and_taken_keys_free_their_space(clock):
    svc = make(clock)
    code, r = svc.reserve_space("w", 1 * MiB, 64 * KiB, PutConfig())
    assert code == E.OK
    start = BASE + r.cursor
    assert svc.put_reserved("w", r.id, "taken", 100, start, PutConfig()) == (E.OK, start + 128)
    used0 = used(svc)
    code, codes, cursor = svc.put_reserved_batch("w", r.id, ["a", "taken", "b", "a"], [5000, 300, 64, 10],
                                                 start + 128, PutConfig(with_hard_pin=True))
    assert code == E.OK
    assert codes == [E.OK, E.OBJECT_ALREADY_EXISTS, E.OK, E.OBJECT_ALREADY_EXISTS]  # duplicates: the first wins
    assert cursor == start + 128 + 5056 + 320 + 64 + 64  # each rounded up to the 64-byte granule
    assert svc.get_replica_list("a")[1][0].address == start + 128
    assert svc.get_replica_list("b")[1][0].address == start + 128 + 5056 + 320
    assert svc.get_replica_list("taken")[1][0].size == 100  # unchanged
    assert "a" in svc.table.hard_pins and "b" in svc.table.hard_pins
    assert used(svc) == used0 - 320 - 64  # the space of the keys not stored went back to the pool
    assert svc.release_space("w", r.id) == E.OK
    assert used(svc) == 128 + 5056 + 64


def test_batch_misuse_drops_the_block_and_stores_nothing(clock):
    svc = make(clock)
    _, r = svc.reserve_space("w", 1 * MiB, 64 * KiB, PutConfig())
    start = BASE + r.cursor
    assert svc.put_reserved_batch("x", r.id, ["a"], [10], start, PutConfig())[0] == E.OBJECT_NOT_FOUND  # not yours
    assert svc.put_reserved_batch("w", r.id, ["a"], [10], start + 64, PutConfig())[0] == E.INVALID_PARAMS
    assert svc.put_reserved_batch("w", r.id, ["a"], [10], start, PutConfig())[0] == E.OBJECT_NOT_FOUND  # gone
    assert used(svc) == 0 and svc.get_replica_list("a")[0] == E.OBJECT_NOT_FOUND
    for keys, sizes in ((["a", "b"], [10]), ([], []), (["a"], [0]), (["a", "b"], [MiB, 10])):  # past the end
        _, r = svc.reserve_space("w", 1 * MiB, 64 * KiB, PutConfig())
        code, codes, cursor = svc.put_reserved_batch("w", r.id, keys, sizes, BASE + r.cursor, PutConfig())
        assert (code, codes, cursor) == (E.INVALID_PARAMS, [], 0), (keys, sizes)
        assert used(svc) == 0 and "a" not in svc.table.objects


def test_batch_that_fills_the_block_ends_it(clock):
    svc = make(clock)
    _, r = svc.reserve_space("w", 64 * KiB, 64 * KiB, PutConfig())
    start = BASE + r.cursor
    code, codes, cursor = svc.put_reserved_batch("w", r.id, ["a", "b"], [32 * KiB, 32 * KiB], start, PutConfig())
    assert code == E.OK and codes == [E.OK, E.OK] and cursor == start + 64 * KiB
    assert r.id not in svc.reservations and svc.reserved_bytes() == 0
