"""Eviction policy: which committed objects to drop to free about `target` bytes.

Order: least recently used first (``ObjectTable.objects`` is kept in LRU order; reads move a key to the
end). Never evicted: objects under a live read lease, hard-pinned objects, objects with a copy/move in
progress, and puts in progress (they are not in ``objects``). Soft-pinned objects (pin not yet expired) are
taken only after every other candidate, still in LRU order, and only when ``allow_soft_pinned``.

The master runs eviction (a) from its monitor when usage reaches --eviction_high_watermark_ratio, freeing
--eviction_ratio of the capacity, and (b) when a put cannot be placed, freeing at least what it needs.
Cost: one pass over the LRU head until enough bytes are found; objects skipped because they are leased or
pinned are re-examined on the next round.

Threading: pure function of the table; the caller holds the master lock.
"""

from __future__ import annotations

from mooncake.store.master.objects import ObjectTable, replicas_of
from mooncake.store.master.segments import Replica


def object_bytes(value: Replica | tuple[Replica, ...]) -> int:
    """Pool bytes held by an object (all replicas, rounded up to allocator granules)."""
    return sum(r.segment.allocator.rounded(r.size) for r in replicas_of(value))


def select_victims(table: ObjectTable, now: float, target: int, allow_soft_pinned: bool) -> tuple[list[str], int]:
    """Keys to evict (in eviction order) and the bytes they hold; stops once `target` bytes are reached."""
    victims: list[str] = []
    freed = 0
    soft: list[str] = []
    if target <= 0:
        return victims, freed
    leases, soft_pins, hard_pins, busy = table.leases, table.soft_pins, table.hard_pins, table.busy
    for key, value in table.objects.items():
        if key in hard_pins or key in busy:
            continue
        deadline = leases.get(key)
        if deadline is not None and deadline > now:
            continue
        pin = soft_pins.get(key)
        if pin is not None and pin > now:
            if allow_soft_pinned:
                soft.append(key)
            continue
        victims.append(key)
        freed += object_bytes(value)
        if freed >= target:
            return victims, freed
    for key in soft:
        victims.append(key)
        freed += object_bytes(table.objects[key])
        if freed >= target:
            break
    return victims, freed
