import random

import pytest

from mooncake.store.common.allocator import OffsetAllocator, _bin_lower, _bin_of


def test_size_classes_are_ordered_and_bounded():
    prev = -1
    for units in range(1, 5000):
        b = _bin_of(units)
        assert b >= prev
        assert _bin_lower(b) <= units < _bin_lower(b + 1)
        prev = b


def test_allocate_rounds_to_granules_and_exhausts():
    a = OffsetAllocator(1024, granule=64)
    offs = [a.allocate(1) for _ in range(16)]
    assert sorted(offs) == [i * 64 for i in range(16)]
    assert a.allocate(1) is None
    assert a.used_bytes == 1024 and a.free_bytes == 0


def test_free_coalesces_both_neighbours():
    a = OffsetAllocator(64 * 10)
    x, y, z = a.allocate(64 * 3), a.allocate(64 * 3), a.allocate(64 * 4)
    assert a.allocate(64) is None
    a.free(x, 64 * 3)
    a.free(z, 64 * 4)
    assert a.free_block_count == 2
    a.free(y, 64 * 3)
    assert a.free_block_count == 1 and a.largest_free() == 640 and a.fragmentation() == 0.0
    assert a.allocate(640) == 0


def test_allocation_finds_fitting_block_in_its_own_class():
    # 100 and 101 granules share a class; a free block of 101 must serve a request of 101 (scan fallback).
    a = OffsetAllocator(64 * 300)
    first = a.allocate(64 * 101)
    a.allocate(64 * 199)
    a.free(first, 64 * 101)
    assert a.allocate(64 * 101) == first


def test_bad_frees_are_rejected_without_damage():
    a = OffsetAllocator(64 * 8)
    off = a.allocate(128)
    with pytest.raises(ValueError):
        a.free(off + 1, 128)  # misaligned
    with pytest.raises(ValueError):
        a.free(64 * 8, 64)  # out of range
    with pytest.raises(ValueError):
        a.allocate(0)
    a.free(off, 128)
    with pytest.raises(ValueError):
        a.free(off, 128)  # double free
    assert a.free_bytes == 64 * 8 and a.free_block_count == 1


def test_invalid_construction():
    with pytest.raises(ValueError):
        OffsetAllocator(1024, granule=48)
    with pytest.raises(ValueError):
        OffsetAllocator(10)


def test_random_churn_matches_a_byte_map_model():
    rng = random.Random(7)
    cap_units = 2048
    a = OffsetAllocator(cap_units * 64)
    owner = [None] * cap_units  # granule -> allocation id
    live = {}
    for step in range(4000):
        if live and (rng.random() < 0.45 or len(live) > 200):
            aid = rng.choice(list(live))
            off, size = live.pop(aid)
            a.free(off, size)
            for g in range(off // 64, off // 64 + -(-size // 64)):
                owner[g] = None
        else:
            size = rng.choice([64, 100, 4096, 9000, 64 * 37, 20000])
            off = a.allocate(size)
            if off is None:
                # Must be genuine: no run of free granules long enough anywhere.
                need, run = -(-size // 64), 0
                for o in owner:
                    run = run + 1 if o is None else 0
                    assert run < need, "allocator failed although a fitting free range exists"
                continue
            for g in range(off // 64, off // 64 + -(-size // 64)):
                assert owner[g] is None, "overlapping allocation"
                owner[g] = step
            live[step] = (off, size)
        assert a.free_bytes == 64 * sum(1 for o in owner if o is None)
    for off, size in live.values():
        a.free(off, size)
    assert a.free_block_count == 1 and a.free_bytes == cap_units * 64


def test_mixed_size_churn_keeps_fragmentation_low():
    """Steady state at ~75 % fill with sizes from 4 KiB to 4 MiB: a 4 MiB request still fits and the free
    space is not shredded (this bound fails for a naive first-fit without coalescing)."""
    rng = random.Random(11)
    cap = 1 << 30
    a = OffsetAllocator(cap)
    sizes = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    live = []
    for _ in range(20000):
        while a.used_bytes > 0.75 * cap:
            off, size = live.pop(rng.randrange(len(live)))
            a.free(off, size)
        size = rng.choice(sizes)
        off = a.allocate(size)
        assert off is not None, f"allocation failed at {a.used_bytes / cap:.2%} use"
        live.append((off, size))
    assert a.largest_free() >= 4 << 20
    assert a.fragmentation() < 0.6
