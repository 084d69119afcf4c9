"""Mounted memory segments, their allocators, and replica placement.

A *segment* is a range of a client's registered memory (Transfer Engine segment ``name``, ``base`` address,
``size``) that the client contributes to the pool. The master never touches its bytes; it only hands out
ranges of it (``Replica``) that clients write and read with the Transfer Engine.

Placement (``SegmentRegistry.allocate``): one contiguous buffer per replica, each replica of an object on a
distinct segment, preferring segments of distinct names (hosts/processes) when more than one replica is
asked for. Preferred segments (by name, in the caller's order) are tried first; then, with the ``random``
strategy, at most ``MAX_PROBES`` segments from a random starting point (spreads load and avoids the
"first segment of the batch becomes everybody's favourite" hot spot), or with ``free_ratio_first`` the
segments with the largest free fraction first. Placement is best effort: fewer replicas than asked may be
returned; none at all means the pool has no room (the caller reports NO_AVAILABLE_HANDLE).

Identity and reuse. A segment is one instance of a client's memory, known by its ``id`` (the client draws a
fresh random one per setup); its ``name`` is the Transfer Engine name of the process that owns it, and one
name belongs to one live process. A segment mounted under a name that another client's segments hold belongs
to a new instance (e.g. a client restarted under its old ``local_hostname``): ``superseded_by`` names the old
instance's segments, which the master unmounts before anything else is placed (their replicas point into the
dead process's memory). Memory that may still be read or written under promises the master gave before it
knew the segment again is not allocated from for a while (``Segment.hold_until``; ``allocate`` skips it):
- a segment a client re-mounts (ReMountSegment) within REMOUNT_HOLD_SEC of this master's start: it may come
  from before a restart, when readers held descriptors of its objects (clients trust a cached descriptor at
  most core.TRUST_SEC after the master last answered them) and writers held reserved blocks in it (used at
  most reserved.FRESH_SEC after the master confirmed them). REMOUNT_HOLD_SEC exceeds both;
- a segment this registry unmounted (client expired, superseded) and sees mounted again within the lease TTL:
  until the leases granted on its objects before the unmount ran out.

Threading: not thread-safe; the master calls everything under its lock.
Ownership: the registry owns Segment objects; a Replica refers to its segment and stays valid (its
``address`` still computable) after the segment is unmounted, but ``release`` of such a replica is a no-op.
"""

from __future__ import annotations

import collections
import random
import time
from typing import Callable

from mooncake.store.common.allocator import OffsetAllocator
from mooncake.store.common.errors import ErrorCode

MAX_PROBES = 100
REMOUNT_HOLD_SEC = 3.0
ALLOCATION_STRATEGIES = ("random", "free_ratio_first")
_MAX_ADDRESS = 1 << 64


class SegmentSpec:
    """Parameters of a segment to mount (from the RPC layer)."""

    __slots__ = ("id", "name", "base", "size", "te_endpoint", "protocol")

    def __init__(self, seg_id: str, name: str, base: int, size: int, te_endpoint: str = "", protocol: str = "tcp"):
        self.id, self.name, self.base, self.size = seg_id, name, base, size
        self.te_endpoint, self.protocol = te_endpoint, protocol


class Segment:
    """A mounted segment. Fields are immutable after mount except ``mounted``. ``hold_until``: no allocation
    before this time (the registry's clock; see the module docstring)."""

    __slots__ = ("id", "name", "base", "size", "te_endpoint", "protocol", "client_id", "allocator", "mounted",
                 "hold_until")

    def __init__(self, seg_id: str, name: str, base: int, size: int, te_endpoint: str, protocol: str,
                 client_id: str) -> None:
        self.id = seg_id
        self.name = name
        self.base = base
        self.size = size
        self.te_endpoint = te_endpoint
        self.protocol = protocol
        self.client_id = client_id
        self.allocator = OffsetAllocator(size)
        self.mounted = True
        self.hold_until = float("-inf")

    def same_params(self, name: str, base: int, size: int, te_endpoint: str, protocol: str) -> bool:
        return (self.name, self.base, self.size, self.te_endpoint, self.protocol) == (
            name, base, size, te_endpoint, protocol)

    def describe(self) -> dict:
        a = self.allocator
        return {"id": self.id, "name": self.name, "base": self.base, "size": self.size,
                "te_endpoint": self.te_endpoint, "protocol": self.protocol, "client_id": self.client_id,
                "used_bytes": a.used_bytes, "free_bytes": a.free_bytes,
                "usage": round(a.used_bytes / a.capacity, 6) if a.capacity else 0.0,
                "free_blocks": a.free_block_count, "largest_free_bytes": a.largest_free(),
                "fragmentation": round(a.fragmentation(), 6)}

    def held(self, now: float) -> bool:
        return now < self.hold_until


class Replica:
    """One replica's buffer: ``size`` bytes at ``offset`` inside ``segment``. Immutable."""

    __slots__ = ("segment", "offset", "size")

    def __init__(self, segment: Segment, offset: int, size: int) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size

    @property
    def address(self) -> int:
        return self.segment.base + self.offset

    def __repr__(self) -> str:
        return f"Replica({self.segment.name}:{self.segment.id}@{self.offset:#x}+{self.size})"


class SegmentRegistry:
    def __init__(self, strategy: str = "random", rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic, lease_ttl: float = 5.0) -> None:
        """`clock`: the master's; `lease_ttl`: the longest read lease it grants (seconds)."""
        if strategy not in ALLOCATION_STRATEGIES:
            raise ValueError(f"unknown allocation strategy {strategy!r}; expected one of {ALLOCATION_STRATEGIES}")
        self.strategy = strategy
        self._rng = rng or random.Random()
        self._clock = clock
        self._started = clock()
        self._lease_ttl = lease_ttl
        self._unmounted: collections.OrderedDict[str, float] = collections.OrderedDict()  # id -> when, for lease_ttl
        self._by_id: dict[str, Segment] = {}
        self._order: list[Segment] = []  # mount order; placement walks it from a random start
        self._by_name: dict[str, list[Segment]] = {}
        self._by_client: dict[str, dict[str, Segment]] = {}
        self.capacity = 0  # bytes over all mounted segments (allocator granules)
        self.used = 0

    # -- mount / unmount -----------------------------------------------------------------------------------
    def mount(self, client_id: str, seg_id: str, name: str, base: int, size: int, te_endpoint: str = "",
              protocol: str = "tcp", remount: bool = False) -> tuple[ErrorCode, Segment | None]:
        """Mounts a segment. Idempotent: the same id with the same parameters from the same client is OK.
        `remount`: the client re-mounts memory it had mounted before (ReMountSegment); see hold_until.

        INVALID_PARAMS: empty id/name/client, base 0, size smaller than one allocation granule, a range past
        2^64, or a range overlapping another mounted segment of the same client and name (one address space;
        another client's segments of that name are another instance's, see superseded_by).
        SEGMENT_ALREADY_EXISTS: the id is mounted with other parameters or by another client.
        """
        code = self.check_mount(client_id, seg_id, name, base, size, te_endpoint, protocol)
        if code != ErrorCode.OK:
            return code, None
        old = self._by_id.get(seg_id)
        if old is not None:
            return ErrorCode.OK, old
        seg = Segment(seg_id, name, base, size, te_endpoint, protocol, client_id)
        now = self._clock()
        self._forget_unmounted(now)
        gone = self._unmounted.pop(seg_id, None)
        if gone is not None:
            seg.hold_until = gone + self._lease_ttl
        if remount:
            seg.hold_until = max(seg.hold_until, self._started + REMOUNT_HOLD_SEC)
        self._by_id[seg_id] = seg
        self._order.append(seg)
        self._by_name.setdefault(name, []).append(seg)
        self._by_client.setdefault(client_id, {})[seg_id] = seg
        self.capacity += seg.allocator.capacity
        return ErrorCode.OK, seg

    def check_mount(self, client_id: str, seg_id: str, name: str, base: int, size: int, te_endpoint: str = "",
                    protocol: str = "tcp") -> ErrorCode:
        """What ``mount`` would answer, changing nothing (OK also for the same segment mounted already)."""
        if not client_id or not seg_id or not name or base <= 0 or size < 64 or base + size > _MAX_ADDRESS:
            return ErrorCode.INVALID_PARAMS
        old = self._by_id.get(seg_id)
        if old is not None:
            if old.client_id == client_id and old.same_params(name, base, size, te_endpoint, protocol):
                return ErrorCode.OK
            return ErrorCode.SEGMENT_ALREADY_EXISTS
        for other in self._by_name.get(name, ()):
            if other.client_id == client_id and base < other.base + other.size and other.base < base + size:
                return ErrorCode.INVALID_PARAMS
        return ErrorCode.OK

    def unmount(self, seg_id: str) -> Segment | None:
        """Removes a segment (None if unknown). Its replicas become dangling: the caller drops them."""
        seg = self._by_id.pop(seg_id, None)
        if seg is None:
            return None
        seg.mounted = False
        self._order.remove(seg)
        same_name = self._by_name[seg.name]
        same_name.remove(seg)
        if not same_name:
            del self._by_name[seg.name]
        owned = self._by_client[seg.client_id]
        del owned[seg_id]
        if not owned:
            del self._by_client[seg.client_id]
        self.capacity -= seg.allocator.capacity
        self.used -= seg.allocator.used_bytes
        now = self._clock()
        self._forget_unmounted(now)
        self._unmounted[seg_id] = now
        return seg

    def superseded_by(self, seg: Segment) -> list[Segment]:
        """The mounted segments of other clients under `seg`'s name: a dead instance's (module docstring)."""
        return [s for s in self._by_name.get(seg.name, ()) if s.client_id != seg.client_id]

    def _forget_unmounted(self, now: float) -> None:
        old = self._unmounted
        while old and next(iter(old.values())) + self._lease_ttl <= now:
            old.popitem(last=False)

    # -- lookup --------------------------------------------------------------------------------------------
    def get(self, seg_id: str) -> Segment | None:
        return self._by_id.get(seg_id)

    def by_name(self, name: str) -> list[Segment]:
        return list(self._by_name.get(name, ()))

    def of_client(self, client_id: str) -> list[Segment]:
        return list(self._by_client.get(client_id, {}).values())

    def all(self) -> list[Segment]:
        return list(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def usage(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0

    # -- allocation ----------------------------------------------------------------------------------------
    def allocate(self, size: int, replica_num: int, preferred: tuple[str, ...] | list[str] = (),
                 exclude: set[str] | frozenset[str] = frozenset()) -> list[Replica]:
        """Up to `replica_num` new replicas of `size` bytes on distinct segments (none of the ids in
        `exclude`); see the module docstring for the order. Returns [] when nothing fits."""
        if not self._order or size <= 0 or replica_num <= 0:
            return []
        chosen: list[Replica] = []
        used_ids = set(exclude)
        used_names: set[str] = set()
        candidates = self._candidates(preferred)
        passes = (True, False) if replica_num > 1 else (False,)
        now = self._clock()
        for distinct_names in passes:
            for seg in candidates:
                if len(chosen) == replica_num:
                    return chosen
                if seg.id in used_ids or (distinct_names and seg.name in used_names) or seg.held(now):
                    continue
                offset = seg.allocator.allocate(size)
                if offset is None:
                    continue
                self.used += seg.allocator.rounded(size)
                chosen.append(Replica(seg, offset, size))
                used_ids.add(seg.id)
                used_names.add(seg.name)
        return chosen

    def allocate_on(self, name: str, size: int, exclude: set[str] | frozenset[str] = frozenset()) -> Replica | None:
        """One replica on a segment named `name` (not in `exclude`), or None when none of them has room."""
        now = self._clock()
        for seg in self._by_name.get(name, ()):
            if seg.id in exclude or seg.held(now):
                continue
            offset = seg.allocator.allocate(size)
            if offset is not None:
                self.used += seg.allocator.rounded(size)
                return Replica(seg, offset, size)
        return None

    def release(self, replica: Replica) -> None:
        """Frees a replica's buffer; a no-op when its segment has been unmounted (the memory is gone)."""
        seg = replica.segment
        if seg.mounted:
            seg.allocator.free(replica.offset, replica.size)
            self.used -= seg.allocator.rounded(replica.size)

    def _candidates(self, preferred) -> list[Segment]:
        order = self._order
        n = len(order)
        head: list[Segment] = []
        for name in preferred:
            head.extend(self._by_name.get(name, ()))
        if self.strategy == "free_ratio_first":
            if n > MAX_PROBES:
                start = self._rng.randrange(n)
                tail = [order[(start + i) % n] for i in range(MAX_PROBES)]
            else:
                tail = list(order)
            tail.sort(key=lambda s: s.allocator.free_bytes / s.allocator.capacity, reverse=True)
        else:
            start = self._rng.randrange(n)
            tail = [order[(start + i) % n] for i in range(min(n, MAX_PROBES))]
        return head + tail if head else tail
