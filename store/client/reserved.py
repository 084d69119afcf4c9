"""Client side of one-round-trip puts (the master side and the contract: store/master/reservations.py).

A single-key put with one replica takes a block of space reserved for this client, writes the value at the
block's cursor (Transfer Engine, or memcpy when the block is in this process's segment) and commits it with
one PutReserved call: one master round trip instead of PutStart + PutEnd. Blocks are asked for (ReserveSpace)
when none has room, sized for about BLOCK_OBJECTS values of the current size, and kept per placement
preference. Anything unusual (no grant, a block the master no longer knows, an RPC error before the data
moved) sends the put the two-call way, which also evicts when memory is full.

A block is used only while this client heard about it from the master less than FRESH_SEC ago and well before
the master's idle deadline; so the master that granted it is alive and has not handed the space to anyone else
(a restarted master needs longer than FRESH_SEC before any client can allocate in a remounted segment).

Threading: a block is used by one put at a time (taken out of the pool for the put); ``put`` is thread-safe.
Set MC_STORE_RESERVED_PUT=0 to turn the path off (every put then takes two master calls).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time

import grpc

from mooncake.store.client.guard import NOT_READY
from mooncake.store.client.memory import ZERO_COPY_MIN, gather
from mooncake.store.common.errors import ErrorCode

_log = logging.getLogger("mooncake.store.client")

OK = int(ErrorCode.OK)
_ALREADY = int(ErrorCode.OBJECT_ALREADY_EXISTS)
_TRANSFER_FAIL = int(ErrorCode.TRANSFER_FAIL)
MiB = 1 << 20
FRESH_SEC = 1.0
BLOCK_OBJECTS = 32
MIN_BLOCK, MAX_BLOCK = 4 * MiB, 64 * MiB
POOLED_PER_PREFERENCE = 2
MAX_BATCH = 16 * MiB  # larger batches take the two-call way (a block holds a few batches)
_NO_GRANT_BACKOFF_SEC = 1.0  # after a refused grant (memory full, feature off), puts go the two-call way


def _unknown_method(e) -> bool:
    """Whether a master RPC failed because the master does not have the method (an older master)."""
    code = e.code() if callable(getattr(e, "code", None)) else None
    details = e.details() if callable(getattr(e, "details", None)) else ""
    return code == grpc.StatusCode.UNIMPLEMENTED or "unknown method" in (details or "")


def _layout(sizes: list[int], granule: int) -> tuple[list[int], int]:
    """Offsets of objects laid back to back, each rounded up to `granule`, and the span they take."""
    offsets, span = [], 0
    for n in sizes:
        offsets.append(span)
        span += -(-n // granule) * granule
    return offsets, span


class _Block:
    __slots__ = ("rid", "segment", "cursor", "end", "granule", "quiet_max", "confirmed")

    def __init__(self, reply, now: float) -> None:
        b = reply.block
        self.rid, self.segment, self.granule = reply.reservation_id, b, max(1, reply.granule)  # b: where
        self.cursor, self.end = b.address, b.address + b.size
        idle = reply.idle_ms / 1000.0
        self.quiet_max = idle - min(2.0, idle / 2)  # the master frees it `idle` after its last confirmation
        self.confirmed = now  # when the master last confirmed it (grant, renew or commit)

    def room(self, size: int) -> bool:
        return self.cursor + -(-size // self.granule) * self.granule <= self.end

    def fresh(self, now: float) -> bool:
        """Usable without asking: the master confirmed it very recently."""
        return now - self.confirmed < min(FRESH_SEC, self.quiet_max)

    def alive(self, now: float) -> bool:
        """Still held by the master (to be renewed before use when not fresh)."""
        return now - self.confirmed < self.quiet_max


class ReservedPuts:
    def __init__(self, core) -> None:
        self._core = core
        self._lock = threading.Lock()
        self._pool: dict[tuple, list[_Block]] = {}
        self._no_grant_until = 0.0
        self._granule = 64  # the master's allocator granule, as its blocks say
        self.enabled = os.environ.get("MC_STORE_RESERVED_PUT", "1") != "0"
        self.batch_enabled = True  # off once a master turns out to lack BatchPutReserved

    def put(self, key: str, size: int, source: list, registered: bool, config) -> int | None:
        """Puts one value (source: [(addr, len)]) through a reserved block; per-key code, or None: put it the
        two-call way. The hot path of small puts: one staging copy (or none for registered memory), one
        Transfer Engine write (a memmove into this client's own segment), one master call."""
        if not self.enabled or config.replica_num != 1:
            return None
        core = self._core
        proto = config.to_proto(core._segment_name)
        pref = tuple(proto.preferred_segments)
        block = self._take(pref, size, proto)
        if block is None:
            return None
        if not self._write_one(block, size, source, registered):
            # A failed (or timed-out) write may still land later: never write into this block again, and the
            # master holds its rest rather than handing it to other puts.
            self._release(block, unsettled=True)
            return _TRANSFER_FAIL
        sent = time.monotonic()
        reply = core._rpc("PutReserved", reservation_id=block.rid, key=key, size=size, address=block.cursor,
                          config=proto)
        if isinstance(reply, int):  # unknown outcome: the block may be gone; never write into it again
            self._release(block)
            return reply
        if reply.code in (OK, _ALREADY):
            if reply.code == OK:
                block.cursor = reply.cursor
            block.confirmed = sent
            self._give_back(pref, block)
            return OK
        _log.info("put %r: reserved block %d refused (%s); putting it the two-call way", key, block.rid, reply.code)
        if reply.cursor == block.cursor:  # the master kept the block (e.g. a key it refused): reuse it
            block.confirmed = sent
            self._give_back(pref, block)
        return None

    def _write_one(self, block: _Block, size: int, source: list, registered: bool) -> bool:
        """Writes the regions of `source` back to back at the block's cursor; True when it worked. Called
        between core._enter and _leave (put_one / put_many), so close waits for the write. One region to
        another client's segment is the hot path (a staging copy, one engine write); anything else goes the
        general way (core._pin, core._move_contiguous)."""
        core = self._core
        seg = block.segment
        engine = core._engine
        staged = None
        if len(source) == 1 and engine is not None and not core._is_mine(seg) \
                and seg.segment_name != core._segment_name:
            addr, n = source[0]
            if registered:
                staged = addr
            elif n < ZERO_COPY_MIN:
                staged = core._staging.alloc(n)
                if staged is not None:
                    ctypes.memmove(staged, addr, n)
        if staged is None:
            pinned = core._pin(source, registered, not core._is_mine(seg), write_out=False)
            return pinned is not None and core._move_contiguous(seg, block.cursor, *pinned, write=True)
        rc = engine.transfer_sync_write(seg.segment_name, staged, block.cursor, n)
        if rc != 0:
            # The write may still be in flight: its staging is not reused (leaked, bounded by failures).
            _log.warning("transfer to segment %s failed (rc %d); its staging is kept aside", seg.segment_name, rc)
            return False
        if not registered:
            core._staging.free(staged)
        return True

    def put_batch(self, keys: list[str], sizes: list[int], sources: list, registered: bool, config
                  ) -> list[int] | None:
        """Puts several values through one reserved block: laid back to back from the cursor (each at the
        previous one's end rounded up to the granule), written in one Transfer Engine batch (byte values:
        gathered into one staging range, one contiguous write) and committed with one BatchPutReserved call.
        Per-key codes (a key that exists reports 0, as with PutStart), or None: put them the two-call way."""
        if not self.enabled or config.replica_num != 1:
            return None
        core = self._core
        proto = config.to_proto(core._segment_name)
        pref = tuple(proto.preferred_segments)
        if not self.batch_enabled:
            return None
        granule = self._granule
        offsets, span = _layout(sizes, granule)
        if span > MAX_BATCH:
            return None
        block = self._take(pref, span, proto)
        if block is None:
            return None
        if block.granule != granule:  # learnt from this master's first block
            self._granule = granule = block.granule
            offsets, span = _layout(sizes, granule)
            if not block.room(span):
                self._give_back(pref, block)
                return None
        start = block.cursor
        moved = self._write_batch(block, start, offsets, span, sources, registered)
        if not moved:  # writes may still land there: the block is never written again, and held by the master
            self._release(block, unsettled=True)
            return [_TRANSFER_FAIL] * len(keys)
        sent = time.monotonic()
        master = core._master
        if master is None:  # closed meanwhile
            return [NOT_READY] * len(keys)
        try:
            reply = master.call("BatchPutReserved", reservation_id=block.rid, keys=keys, sizes=sizes,
                                address=start, config=proto)
        except grpc.RpcError as e:
            if _unknown_method(e):  # a master without BatchPutReserved: nothing was committed
                _log.info("put_batch: the master has no BatchPutReserved; batches take the two-call way")
                self.batch_enabled = False
                self._give_back(pref, block)
                return None
            code = core._rpc_error_code("BatchPutReserved", e)
            self._release(block)  # unknown outcome: the block may be gone; never write into it again
            return [code] * len(keys)
        if reply.code != OK or len(reply.codes) != len(keys):
            _log.info("put_batch: reserved block %d refused (%s); putting the batch the two-call way", block.rid,
                      reply.code)
            if reply.code == OK:  # a malformed reply: what the master holds is unknown, let it go
                self._release(block)
            return None
        block.cursor = reply.cursor
        block.confirmed = sent
        self._give_back(pref, block)
        return [OK if c == _ALREADY else c for c in reply.codes]

    def _write_batch(self, block: _Block, start: int, offsets: list, span: int, sources: list,
                     registered: bool) -> bool:
        """Writes sources[i] (lists of (addr, len)) at start + offsets[i] in the block's segment."""
        core = self._core
        remote = not core._is_mine(block.segment)
        staging = core._staging
        if remote and not registered:
            addr = staging.alloc(span)
            if addr is not None:  # one gather, one contiguous write (the gaps carry nothing)
                try:
                    for off, src in zip(offsets, sources):
                        gather(addr + off, src)
                    return not core._transfer([(block.segment, addr, start, span, 0)], write=True)
                finally:
                    staging.free(addr)
        ops, releases = [], []
        try:
            for off, src in zip(offsets, sources):
                pinned = core._pin(src, registered, remote, write_out=False)
                if pinned is None:
                    return False
                releases.append(pinned[1])
                for a, n in pinned[0]:
                    ops.append((block.segment, a, start + off, n, 0))
                    off += n
            return not core._transfer(ops, write=True)
        finally:
            for release in releases:
                release()

    def _take(self, pref: tuple, size: int, proto) -> _Block | None:
        """A block with room for `size`, taken out of the pool, confirmed by the master less than FRESH_SEC
        ago: a pooled fresh one, a pooled one renewed now (one call, as PutStart would cost), or a new one."""
        now = time.monotonic()
        with self._lock:
            blocks = self._pool.get(pref)
            block = None
            if blocks:
                if not all(b.alive(now) for b in blocks):
                    blocks[:] = [b for b in blocks if b.alive(now)]  # the rest the master frees by itself
                for b in blocks:  # the most recently confirmed one with room
                    if b.room(size) and (block is None or b.confirmed > block.confirmed):
                        block = b
            if block is not None:
                blocks.remove(block)
            elif now < self._no_grant_until:
                return None
        core = self._core
        if block is not None:
            if block.fresh(now):
                return block
            reply = core._rpc("ReserveSpace", renew=block.rid)
            if not isinstance(reply, int) and reply.code == OK and reply.block.address == block.cursor:
                block.confirmed = now
                return block
            if not isinstance(reply, int) and reply.code == OK:  # not where we think: do not use it
                self._release(block)
            return None  # gone or unreachable: the two-call way
        want = min(MAX_BLOCK, max(MIN_BLOCK, BLOCK_OBJECTS * size))
        reply = core._rpc("ReserveSpace", size=max(want, size), min_size=size, config=proto)
        if isinstance(reply, int) or reply.code != OK:
            with self._lock:
                self._no_grant_until = time.monotonic() + _NO_GRANT_BACKOFF_SEC
            return None
        return _Block(reply, now)

    def _give_back(self, pref: tuple, block: _Block) -> None:
        if block.cursor >= block.end:
            return  # used up: the master dropped it with its last object
        extra = None
        with self._lock:
            blocks = self._pool.setdefault(pref, [])
            blocks.append(block)
            if len(blocks) > POOLED_PER_PREFERENCE:
                blocks.sort(key=lambda b: b.end - b.cursor)
                extra = blocks.pop(0)
        if extra is not None:
            self._release(extra)

    def _release(self, block: _Block, unsettled: bool = False) -> None:
        """Gives the block back; `unsettled`: a write into it failed and may still land (held by the master)."""
        if block.end > block.cursor:
            self._core._rpc("ReleaseSpace", reservation_id=block.rid, unsettled=unsettled)

    def release_all(self) -> None:
        """Frees every pooled block (close)."""
        with self._lock:
            blocks = [b for bs in self._pool.values() for b in bs]
            self._pool.clear()
        for b in blocks:
            self._release(b)
