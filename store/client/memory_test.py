"""StagingPool: small slots are reused from their free lists, the cache stays bounded, and a pool whose free
space sits in cached slots still serves a large request."""

from mooncake.store.client.memory import StagingPool

KiB, MiB = 1 << 10, 1 << 20
BASE = 1 << 30


def test_small_slots_are_reused_and_never_overlap():
    pool = StagingPool(BASE, 1 * MiB)
    a = pool.alloc(100)
    b = pool.alloc(5000)  # an 8 KiB slot
    assert a is not None and b is not None and abs(a - b) >= 4 * KiB
    pool.free(a)
    assert pool.alloc(4096) == a  # the same 4 KiB slot, from its free list
    live = {pool.alloc(64 * KiB) for _ in range(8)}
    assert None not in live and len(live) == 8
    spans = sorted([(x, 64 * KiB) for x in live] + [(a, 4 * KiB), (b, 8 * KiB)])
    assert all(x + n <= y for (x, n), (y, _) in zip(spans, spans[1:]))
    assert all(BASE <= x and x + n <= BASE + MiB for x, n in spans)


def test_cached_slots_are_bounded_and_given_back_when_room_runs_out():
    pool = StagingPool(BASE, 1 * MiB)
    slots = [pool.alloc(64 * KiB) for _ in range(16)]  # the whole pool
    assert None not in slots and pool.alloc(4 * KiB) is None
    for s in slots:
        pool.free(s)
    assert pool.free_bytes == MiB  # cached slots count as free
    big = pool.alloc(512 * KiB)  # needs the cached slots back in the allocator
    assert big is not None
    pool.free(big)
    assert pool.alloc(MiB) is not None


def test_empty_and_oversized_requests():
    assert StagingPool(0, 0).alloc(10) is None
    pool = StagingPool(BASE, 64 * KiB)
    assert pool.alloc(0) is None and pool.alloc(64 * KiB + 1) is None
    assert pool.alloc(64 * KiB) == BASE


def test_double_and_foreign_frees_are_refused():
    import pytest
    pool = StagingPool(BASE, 1 * MiB)
    a, b = pool.alloc(100), pool.alloc(200 * KiB)
    pool.free(a)
    with pytest.raises(ValueError):
        pool.free(a)  # a cached slot freed twice would be handed out twice
    pool.free(b)
    with pytest.raises(ValueError):
        pool.free(b)
    with pytest.raises(ValueError):
        pool.free(BASE + 12345)
    assert pool.alloc(100) == a and pool.alloc(100) != a
