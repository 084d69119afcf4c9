"""Eviction policy: which committed objects to drop to free about `target` bytes.

Order: least recently used first (``ObjectTable.objects`` is kept in LRU order; reads move a key to the
end). Never evicted: objects under a live read lease, hard-pinned objects, objects with a copy/move in
progress, and puts in progress (they are not in ``objects``). Objects committed less than OFFLOAD_GRACE_SEC
ago whose SSD-tier owner has not persisted them yet (``offloading``) are taken after the others (evicting
them now would lose them, while a short wait gives them a disk replica; an older pending task is one the
owner failed, and no longer protects its object); soft-pinned objects (pin not yet expired) come last, and
only when ``allow_soft_pinned``; each group in LRU order.

The master runs eviction (a) from its monitor when usage reaches --eviction_high_watermark_ratio, freeing
--eviction_ratio of the capacity, and (b) when a put cannot be placed, freeing at least what it needs.
Cost: one pass over the LRU head until enough bytes are found; objects skipped because they are leased or
pinned are re-examined on the next round.

Threading: pure function of the table; the caller holds the master lock.
"""

from __future__ import annotations

from mooncake.store.master.objects import ObjectTable, replicas_of
from mooncake.store.master.segments import Replica

OFFLOAD_GRACE_SEC = 5.0  # a few of the owners' ping periods (1 s) plus the time to write a file


def object_bytes(value: Replica | tuple[Replica, ...]) -> int:
    """Pool bytes held by an object (all replicas, rounded up to allocator granules)."""
    return sum(r.segment.allocator.rounded(r.size) for r in replicas_of(value))


def select_victims(table: ObjectTable, now: float, target: int, allow_soft_pinned: bool) -> tuple[list[str], int]:
    """Keys to evict (in eviction order) and the bytes they hold; stops once `target` bytes are reached."""
    victims: list[str] = []
    freed = 0
    soft: list[str] = []
    unsaved: list[str] = []
    if target <= 0:
        return victims, freed
    if now < table.lease_floor:  # every object counts as leased (a master that just took over)
        return [], 0
    leases, soft_pins, hard_pins, busy = table.leases, table.soft_pins, table.hard_pins, table.busy
    offloading = table.offloading
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
        task = offloading.get(key)
        if task is not None and now - task.created < OFFLOAD_GRACE_SEC:
            unsaved.append(key)
            continue
        victims.append(key)
        freed += object_bytes(value)
        if freed >= target:
            return victims, freed
    for key in unsaved + soft:
        victims.append(key)
        freed += object_bytes(table.objects[key])
        if freed >= target:
            break
    return victims, freed
