import math
import random

import pytest

from mooncake.tools.cache import POLICIES, make_cache, next_uses
from mooncake.tools.hitrate import simulate
from mooncake.tools.testutil import make_trace


def run(policy, capacity, requests):
    cache = make_cache(policy, capacity, future=requests)
    for i, ids in enumerate(requests):
        cache.access(ids, i)
    return cache


def test_prefix_len_counts_only_the_leading_resident_blocks():
    cache = run("lru", 2, [[1, 2], [3]])  # 1 evicted as least recent
    assert sorted(b for b in (1, 2, 3) if b in cache) == [2, 3]
    assert cache.prefix_len([2, 3, 4]) == 2
    assert cache.prefix_len([1, 2]) == 0  # 2 is resident but not a prefix


def test_lru_refreshes_on_hit_fifo_does_not():
    seq = [[1], [2], [1], [3]]
    lru, fifo = run("lru", 2, seq), run("fifo", 2, seq)
    assert (1 in lru, 2 in lru, 3 in lru) == (True, False, True)
    assert (1 in fifo, 2 in fifo, 3 in fifo) == (False, True, True)


def test_lfu_keeps_the_most_used_block():
    seq = [[1], [1], [2], [3]]
    assert (1 in run("lfu", 2, seq), 2 in run("lfu", 2, seq)) == (True, False)
    assert (1 in run("lru", 2, seq), 2 in run("lru", 2, seq)) == (False, True)


def test_length_aware_evicts_the_tail_of_a_request_before_its_head():
    seq = [[1, 2, 3], [4]]
    lfu, length_aware = run("lfu", 3, seq), run("length-aware", 3, seq)
    assert lfu.prefix_len([1, 2, 3]) == 0  # LFU dropped the head (block 1)
    assert length_aware.prefix_len([1, 2, 3]) == 2  # length-aware dropped the tail (block 3)


def test_belady_bypasses_a_block_never_needed_again():
    seq = [[1], [2], [3], [1], [2]]
    hits = {p: simulate(make_trace(seq), p, 2).hit_blocks for p in ("belady", "lru")}
    assert hits == {"belady": 2, "lru": 0}


def test_next_uses():
    assert next_uses([[1, 2], [3], [1]]) == [[2, math.inf], [math.inf], [math.inf]]


def test_make_cache_errors():
    with pytest.raises(ValueError, match="unknown policy"):
        make_cache("mru", 4)
    with pytest.raises(ValueError, match="at least one block"):
        make_cache("lru", 0)
    with pytest.raises(ValueError, match="needs a capacity"):
        make_cache("lfu", None)
    with pytest.raises(ValueError, match="future"):
        make_cache("belady", 4)
    assert make_cache("unbounded", None).capacity_blocks is None


def random_prefix_tree_trace(seed, n_requests=300):
    """Requests that extend earlier requests' prefixes (hot prefixes reused), like the released traces."""
    rng = random.Random(seed)
    paths, next_id, requests = [], 0, []
    for _ in range(n_requests):
        if paths and rng.random() < 0.7:
            base = rng.choice(paths[-40:] if rng.random() < 0.7 else paths)
            ids = base[:rng.randint(1, len(base))]
        else:
            ids = []
        extra = rng.randint(0 if ids else 1, 6)
        ids = ids + list(range(next_id, next_id + extra))
        next_id += extra
        paths.append(ids)
        requests.append(ids)
    return make_trace(requests)


@pytest.mark.parametrize("seed", range(12))
def test_belady_bounds_every_policy_and_capacity_is_respected(seed):
    trace = random_prefix_tree_trace(seed)
    for capacity in (3, 10, 40, 150):
        hits = {p: simulate(trace, p, capacity).hit_blocks for p in POLICIES if p != "unbounded"}
        assert hits["belady"] == max(hits.values()), (capacity, hits)
        assert hits["belady"] <= simulate(trace, "unbounded").hit_blocks
        for policy in hits:
            cache = make_cache(policy, capacity, future=trace.hash_ids)
            for i, ids in enumerate(trace.hash_ids):
                cache.access(ids, i)
                assert len(cache) <= capacity
