"""Prefix caches of KV blocks with the eviction policies compared by the planning tools.

Every cache holds block ids (the trace's prefix-chained `hash_ids`) and answers two calls per request:

* `prefix_len(ids)`: how many leading blocks of the request are resident (the reusable prefix); no side effects.
* `access(ids, request)`: after the lookup, insert or touch all of the request's blocks, head first, evicting as
  needed so that at most `capacity_blocks` stay resident. `request` is the request's index in the sequence the
  cache was built for (only Belady uses it).

Policies (capacity in blocks; a victim is chosen among the blocks already resident, before the new one goes in):

* `unbounded`: never evicts (the cache ratio of a trace).
* `lru`: evicts the least recently accessed block.
* `fifo`: evicts the block inserted earliest; hits do not refresh it.
* `lfu`: evicts the block with the fewest accesses since it was inserted; ties go to the least recently accessed
  (blocks touched by the same request count as accessed head first, as inserted).
* `length-aware`: like LFU, but among blocks with equal counts last touched by the same request it evicts the one
  deepest in the request first. A deep block is useful only while its whole prefix is resident, so this keeps
  resident prefixes intact, where LFU and LRU drop a request's head before its tail. (The arXiv report names this
  policy, "prioritising blocks that occur later in requests", without defining it; this is our rule.)
* `belady`: evicts the block whose next use is furthest in the future (never-used-again first; ties: deepest
  position first), and does not insert an incoming block whose own next use is further than every resident's
  (a bypass). This is Belady's MIN, optimal in the number of block hits for the given request sequence; on
  prefix-tree traces its resident set stays prefix-closed, so it bounds every policy's prefix hits in blocks.
  Token-weighted ratios can differ from that bound only through partial last blocks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from typing import Sequence

POLICIES = ("unbounded", "lru", "lfu", "fifo", "length-aware", "belady")


class PrefixCache:
    """Base class: resident-set lookups shared by all policies. See the module docstring for the contract."""

    policy = ""

    def __init__(self, capacity_blocks: int | None):
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError(f"capacity must be at least one block, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._resident: dict = {}

    def __len__(self) -> int:
        return len(self._resident)

    def __contains__(self, block: int) -> bool:
        return block in self._resident

    def prefix_len(self, ids: Sequence[int]) -> int:
        """Number of leading blocks of `ids` that are resident."""
        resident = self._resident
        k = 0
        for b in ids:
            if b not in resident:
                break
            k += 1
        return k

    def access(self, ids: Sequence[int], request: int = 0) -> None:
        raise NotImplementedError


class UnboundedCache(PrefixCache):
    policy = "unbounded"

    def __init__(self, capacity_blocks: int | None = None):
        super().__init__(None)

    def access(self, ids: Sequence[int], request: int = 0) -> None:
        self._resident.update(dict.fromkeys(ids))


class LRUCache(PrefixCache):
    policy = "lru"
    _refresh_on_hit = True

    def __init__(self, capacity_blocks: int):
        super().__init__(capacity_blocks)
        self._resident = OrderedDict()

    def access(self, ids: Sequence[int], request: int = 0) -> None:
        d, cap, refresh = self._resident, self.capacity_blocks, self._refresh_on_hit
        for b in ids:
            if b in d:
                if refresh:
                    d.move_to_end(b)
            else:
                if len(d) >= cap:
                    d.popitem(last=False)
                d[b] = None


class FIFOCache(LRUCache):
    policy = "fifo"
    _refresh_on_hit = False


class _HeapCache(PrefixCache):
    """Evicts the resident block with the smallest key; keys live in a heap with lazy invalidation."""

    def __init__(self, capacity_blocks: int):
        super().__init__(capacity_blocks)
        self._heap: list = []
        self._tick = itertools.count()

    def _evict_one(self) -> None:
        heap, resident = self._heap, self._resident
        while True:
            key, b = heapq.heappop(heap)
            if resident.get(b) == key:
                del resident[b]
                return

    def _set(self, b: int, key: tuple) -> None:
        self._resident[b] = key
        heapq.heappush(self._heap, (key, b))
        if len(self._heap) > 4 * len(self._resident) + 1024:  # drop stale entries now and then
            self._heap = [(k, x) for k, x in self._heap if self._resident.get(x) == k]
            heapq.heapify(self._heap)


class LFUCache(_HeapCache):
    policy = "lfu"

    def _key(self, count: int, pos: int, tick: int) -> tuple:
        return (count, tick, pos)

    def access(self, ids: Sequence[int], request: int = 0) -> None:
        resident, cap = self._resident, self.capacity_blocks
        tick = next(self._tick)
        for pos, b in enumerate(ids):
            old = resident.get(b)
            if old is None:
                if len(resident) >= cap:
                    self._evict_one()
                count = 1
            else:
                count = old[0] + 1
            self._set(b, self._key(count, pos, tick))


class LengthAwareCache(LFUCache):
    policy = "length-aware"

    def _key(self, count: int, pos: int, tick: int) -> tuple:
        return (count, tick, -pos)


class BeladyCache(_HeapCache):
    """Belady's MIN; `future` is the whole request sequence (block-id lists) that `access` will be called with."""

    policy = "belady"

    def __init__(self, capacity_blocks: int, future: Sequence[Sequence[int]]):
        super().__init__(capacity_blocks)
        self._next = next_uses(future)

    def access(self, ids: Sequence[int], request: int = 0) -> None:
        resident, cap, nexts = self._resident, self.capacity_blocks, self._next[request]
        for pos, b in enumerate(ids):
            # Min-heap on (-next_use, -pos): the top is the resident block used furthest in the future.
            key = (-nexts[pos], -pos)
            if b not in resident and len(resident) >= cap:
                self._drop_stale_top()
                if self._heap[0][0] <= key:  # incoming block is needed no sooner than the best victim
                    self._evict_one()
                else:
                    continue  # bypass: keeping the incoming block would be worse than keeping any resident
            self._set(b, key)

    def _drop_stale_top(self) -> None:
        heap, resident = self._heap, self._resident
        while resident.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)


def next_uses(requests: Sequence[Sequence[int]]) -> list[list[float]]:
    """For each request i and block position p: index of the next request after i that uses the same block
    (math.inf when none)."""
    out: list[list[float]] = [[]] * len(requests)
    last_seen: dict[int, float] = {}
    for i in range(len(requests) - 1, -1, -1):
        ids = requests[i]
        out[i] = [last_seen.get(b, math.inf) for b in ids]
        for b in ids:
            last_seen[b] = i
    return out


_CLASSES = {c.policy: c for c in (UnboundedCache, LRUCache, FIFOCache, LFUCache, LengthAwareCache)}


def make_cache(policy: str, capacity_blocks: int | None,
               future: Sequence[Sequence[int]] | None = None) -> PrefixCache:
    """Builds a cache. `capacity_blocks` is ignored for `unbounded` and required (>= 1) for the others;
    `belady` also needs `future`, the request sequence it will see.

    Raises:
      ValueError: unknown policy, missing capacity or future.
    """
    if policy == "unbounded":
        return UnboundedCache()
    if capacity_blocks is None:
        raise ValueError(f"policy {policy!r} needs a capacity")
    if policy == "belady":
        if future is None:
            raise ValueError("belady needs the future request sequence")
        return BeladyCache(capacity_blocks, future)
    if policy not in _CLASSES:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
    return _CLASSES[policy](capacity_blocks)
