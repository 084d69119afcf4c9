"""Reserved space: the MasterService part behind one-round-trip puts (ReserveSpace / PutReserved / ReleaseSpace).

A two-call put (PutStart, write, PutEnd) pays two master round trips. With a reservation the client asks once
for a block (placed like a one-replica put), then for each object writes its bytes at the block's cursor and
commits them with one PutReserved: the master carves the object off the front of the block (an ordinary
allocation from then on: freed, evicted, leased like any other) and it is readable when the call returns.
BatchPutReserved does the same for several objects written back to back (put_reserved_batch).

Contract:
- A block belongs to one client; commits must come in cursor order (the client serializes its use of a
  block). The cursor moves by the object's size rounded up to the allocator granule. A commit at another
  address, past the block's end or for an unknown block fails with INVALID_PARAMS / OBJECT_NOT_FOUND, and the
  block is gone: the client must not write into it again and puts the object the two-call way.
- A commit of a key that exists (or is being put, or only on disk) stores nothing and leaves the cursor: the
  client reuses that space (a put of an existing key reports OK and changes nothing, as with PutStart).
- The rest of a block is freed by ReleaseSpace, after ``reservation_idle_sec`` without a commit, when its client
  expires, and (without a free: the memory is gone) when its segment is unmounted. The client stops using a
  block well before its idle deadline and only while it heard from this master process recently, so that it
  never writes into space this master (or a restarted one) gave to someone else.
- Reservations never evict: a block takes at most a quarter of the room left under the eviction watermark; a
  grant that cannot hold the object at hand is refused (NO_AVAILABLE_HANDLE) and the client puts the two-call
  way, which evicts as usual.

``ReservationPool`` is owned by one MasterService and shares its lock: public methods (the RPC entry points)
take the service lock, the others expect it held. Blocks are durable: a grant, each commit from a block and a
release are ops (ops.Reserve, ops.ReservedCommit, ops.ReleaseReservation; ``add``, ``carve`` and ``free`` are
their handlers' part), so a master that takes over knows every block a client may still write into. Only
``last_used`` is not: a master that takes over counts idleness from then.
"""

from __future__ import annotations

import logging
import random

from typing import TYPE_CHECKING

from mooncake.store.common.errors import ErrorCode
from mooncake.store.master import ops
from mooncake.store.master.objects import Held, PutConfig
from mooncake.store.master.segments import Replica, Segment

if TYPE_CHECKING:
    from mooncake.store.master.service import MasterService

_log = logging.getLogger("mooncake.store.master")

OK = ErrorCode.OK
MAX_PER_CLIENT = 8  # blocks one client may hold at once


class Reservation:
    __slots__ = ("id", "client_id", "segment", "cursor", "end", "last_used")

    def __init__(self, rid: int, client_id: str, segment: Segment, start: int, end: int, now: float) -> None:
        self.id, self.client_id, self.segment = rid, client_id, segment
        self.cursor, self.end, self.last_used = start, end, now  # offsets in the segment


class ReservationPool:
    def __init__(self, svc: "MasterService") -> None:
        self._svc = svc
        self.blocks: dict[int, Reservation] = {}
        self._next_id = random.SystemRandom().getrandbits(62) or 1

    def reserve_space(self, client_id: str, size: int, min_size: int, config: PutConfig, renew: int = 0
                      ) -> tuple[ErrorCode, Reservation | None]:
        """A new block of at most `size` and at least `min_size` bytes for `client_id` (module docstring);
        with `renew`, that block of the client confirmed instead (OBJECT_NOT_FOUND when it is gone)."""
        svc = self._svc
        if renew:
            with svc.lock:
                r = self.blocks.get(renew)
                if r is None or r.client_id != client_id or not r.segment.mounted:
                    code, r = ErrorCode.OBJECT_NOT_FOUND, None
                else:
                    code, r.last_used = OK, svc.now()
                svc.metrics.count("renew_space", code)
                return code, r
        if not client_id or min_size <= 0 or size < min_size or config.replica_num != 1:
            return ErrorCode.INVALID_PARAMS, None
        with svc.lock:
            code, r = self._reserve_locked(client_id, size, min_size, config, svc.now())
            svc.metrics.count("reserve_space", code)
            return code, r

    def _reserve_locked(self, client_id, size, min_size, config, now):
        svc = self._svc
        if svc.config.reservation_idle_sec <= 0:
            return ErrorCode.UNAVAILABLE_IN_CURRENT_MODE, None
        if sum(1 for r in self.blocks.values() if r.client_id == client_id) >= MAX_PER_CLIENT:
            return ErrorCode.NO_AVAILABLE_HANDLE, None
        # At most a quarter of the room left under the eviction watermark: a grant never starts an eviction
        # and leaves most free memory to everyone else's puts.
        room = svc.config.eviction_high_watermark_ratio * svc.segments.capacity - svc.segments.used
        size = min(size, svc.config.max_reservation_bytes, int(room) // 4)
        if size < min_size:
            return ErrorCode.NO_AVAILABLE_HANDLE, None
        size, reps = self._on_preferred(size, min_size, config.preferred_segments)
        if not reps:
            reps = svc.segments.allocate(size, 1)
        if not reps and size > min_size:
            size = min_size
            reps = svc.segments.allocate(size, 1)
        if not reps:
            return ErrorCode.NO_AVAILABLE_HANDLE, None
        svc.clients.register(client_id, now)
        seg, start = reps[0].segment, reps[0].offset
        rid = self._next_id
        svc._apply(ops.Reserve(rid, client_id, seg.id, start, start + seg.allocator.rounded(size), now))
        return OK, self.blocks[rid]

    def _on_preferred(self, size: int, min_size: int, preferred) -> tuple[int, list]:
        """(size, [replica]) of a block on a preferred segment, halving the size down to `min_size` where the
        whole block does not fit there (a smaller block where the client asked beats a large one elsewhere),
        or (size, []) when none has room for `min_size`."""
        for name in preferred:
            n = size
            while True:
                rep = self._svc.segments.allocate_on(name, n)
                if rep is not None:
                    return n, [rep]
                if n <= min_size:
                    break
                n = max(min_size, n // 2)
        return size, []

    def put_reserved(self, client_id: str, rid: int, key: str, size: int, address: int, config: PutConfig
                     ) -> tuple[ErrorCode, int]:
        """Commits `key` (`size` bytes written at `address`) from block `rid`; returns (code, the block's
        cursor address afterwards, 0 when the block is gone)."""
        svc = self._svc
        with svc.lock:
            code, cursor = self._put_reserved_locked(client_id, rid, key, size, address, config, svc.now())
            svc.metrics.count("put_reserved", code)
            return code, cursor

    def _put_reserved_locked(self, client_id, rid, key, size, address, config, now):
        svc = self._svc
        r = self.blocks.get(rid)
        if r is None or r.client_id != client_id or not r.segment.mounted:
            return ErrorCode.OBJECT_NOT_FOUND, 0
        seg = r.segment
        code = svc._check_key(key)
        if code != OK or size <= 0 or config.replica_num != 1:
            return code if code != OK else ErrorCode.INVALID_PARAMS, seg.base + r.cursor
        n = seg.allocator.rounded(size)
        if address != seg.base + r.cursor or r.cursor + n > r.end:
            _log.warning("client %s committed %r at %#x (+%d) but its block %d is at %#x..%#x: block dropped",
                         client_id, key, address, size, rid, seg.base + r.cursor, seg.base + r.end)
            svc._apply(ops.ReleaseReservation(rid))
            return ErrorCode.INVALID_PARAMS, 0
        r.last_used = now
        if self._put_conflict_locked(key, now):
            return ErrorCode.OBJECT_ALREADY_EXISTS, seg.base + r.cursor
        svc._apply(ops.ReservedCommit(rid, (key,), (size,), (True,), now, config))
        return OK, seg.base + r.cursor

    def put_reserved_batch(self, client_id: str, rid: int, keys: list[str], sizes: list[int], address: int,
                           config: PutConfig) -> tuple[ErrorCode, list[ErrorCode], int]:
        """Commits keys[i] (sizes[i] bytes) laid back to back from `address` (the block's cursor), each at the
        previous one's end rounded up to the granule. Returns (block code, per-key codes, cursor afterwards).
        The block code is OK, or OBJECT_NOT_FOUND / INVALID_PARAMS when nothing was stored and the block is gone.
        A key that is taken (or invalid) is not stored and its space goes back to the pool; the cursor moves
        past the whole batch either way."""
        svc = self._svc
        with svc.lock:
            out = self._put_reserved_batch_locked(client_id, rid, keys, sizes, address, config, svc.now())
            svc.metrics.count("batch_put_reserved", out[0])
            return out

    def _put_reserved_batch_locked(self, client_id, rid, keys, sizes, address, config, now):
        svc = self._svc
        r = self.blocks.get(rid)
        if r is None or r.client_id != client_id or not r.segment.mounted:
            return ErrorCode.OBJECT_NOT_FOUND, [], 0
        seg = r.segment
        spans = [seg.allocator.rounded(n) for n in sizes]
        if (len(keys) != len(sizes) or not keys or config.replica_num != 1 or any(n <= 0 for n in sizes)
                or address != seg.base + r.cursor or r.cursor + sum(spans) > r.end):
            _log.warning("client %s committed %d objects at %#x but its block %d is at %#x..%#x: block dropped",
                         client_id, len(keys), address, rid, seg.base + r.cursor, seg.base + r.end)
            svc._apply(ops.ReleaseReservation(rid))
            return ErrorCode.INVALID_PARAMS, [], 0
        r.last_used = now
        codes = []
        seen = set()
        for key in keys:
            code = svc._check_key(key)
            if code == OK and (key in seen or self._put_conflict_locked(key, now)):
                code = ErrorCode.OBJECT_ALREADY_EXISTS
            if code == OK:
                seen.add(key)
            codes.append(code)
        svc._apply(ops.ReservedCommit(rid, tuple(keys), tuple(sizes), tuple(c == OK for c in codes), now, config))
        return OK, codes, seg.base + r.cursor

    def _put_conflict_locked(self, key: str, now: float) -> bool:
        """Whether a put of `key` finds it taken: committed, only on disk, or being put (a put stuck for
        longer than put_start_discard_timeout_sec is revoked instead, as PutStart does)."""
        t = self._svc.table
        return self._svc._put_in_progress_locked(key, now) or key in t.objects or key in t.disk

    def release_space(self, client_id: str, rid: int, unsettled: bool = False) -> ErrorCode:
        """The client gives block `rid` back. `unsettled`: a write into it failed and may still land, so its
        free part is held for --put_start_release_timeout_sec (or until the client expires) instead of being
        handed to other puts at once."""
        svc = self._svc
        with svc.lock:
            r = self.blocks.get(rid)
            if r is None or r.client_id != client_id:
                code = ErrorCode.OBJECT_NOT_FOUND
            else:
                hold = svc.now() + svc.config.put_start_release_timeout_sec if unsettled else 0.0
                svc._apply(ops.ReleaseReservation(rid, hold))
                code = OK
            svc.metrics.count("release_space", code)
            return code

    def reserved_bytes(self) -> int:
        """Bytes reserved and not yet carved (the caller holds the lock or accepts a racy sum)."""
        return sum(r.end - r.cursor for r in list(self.blocks.values()))

    def drop(self, client_id: str | None = None, segment: Segment | None = None,
             idle_before: float | None = None, idle_hold_until: float = 0.0) -> None:
        """Releases the blocks of `client_id`, on `segment` (no free: it is unmounted), or unused since
        `idle_before` (ops when called outside a handler). An idle block's rest is held until `idle_hold_until`
        (0: freed): a write its client began may still be in flight (a transfer can take its whole timeout)."""
        for r in list(self.blocks.values()):
            if r.client_id == client_id or r.segment is segment:
                self._svc._apply(ops.ReleaseReservation(r.id))
            elif idle_before is not None and r.last_used < idle_before:
                self._svc._apply(ops.ReleaseReservation(r.id, idle_hold_until))

    # -- what the ops' handlers run (apply.py) --------------------------------------------------------------------
    def add(self, rid: int, client_id: str, segment: Segment, start: int, end: int, at: float) -> None:
        self.blocks[rid] = Reservation(rid, client_id, segment, start, end, at)
        self._next_id = max(self._next_id, rid + 1)

    def carve(self, op: "ops.ReservedCommit") -> None:
        svc = self._svc
        r = self.blocks[op.rid]
        seg = r.segment
        for key, size, stored in zip(op.keys, op.sizes, op.stored):
            span = seg.allocator.rounded(size)
            if stored:
                svc._commit_new_locked(key, [Replica(seg, r.cursor, svc._shared_size(size))], op.at, op.config)
            else:  # not stored: the space returns to the pool (the client wrote there; nobody reads it)
                svc._free([Replica(seg, r.cursor, span)])
            r.cursor += span
        if r.cursor == r.end:
            del self.blocks[op.rid]

    def free(self, rid: int, hold_until: float = 0.0) -> None:
        r = self.blocks.pop(rid, None)
        if r is not None and r.end > r.cursor:
            rest = Replica(r.segment, r.cursor, r.end - r.cursor)
            if hold_until:
                self._svc.table.held.append(Held("", (rest,), hold_until, r.client_id, sticky=True))
            else:
                self._svc._free([rest])
