"""The read path of the store client (a mixin of StoreCore, core.py): reading looked-up objects into
destination regions (own segment first: a bounds-checked memcpy; others through the Transfer Engine; disk-only
objects from their owner, disk_link.py), the cached-descriptor fast paths of get and get_into, and the lookup
with one retry of reads whose descriptors turned out stale. The rules (descriptor cache, leases, replica
identity) are in core.py's docstring.

Threading: as StoreCore: every method may be called from several threads.
"""

from __future__ import annotations

import logging
import time

from mooncake.store.client.guard import all_failed, none, while_open
from mooncake.store.client.memory import clip
from mooncake.store.common.errors import ErrorCode

_log = logging.getLogger("mooncake.store.client")
_NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)


class ReadPathMixin:
    @while_open(all_failed)
    def read_many(self, keys: list[str], entries: list, dests: list, registered: bool) -> list[int]:
        """Reads entries[i] (from _lookup) into dests[i] (list of (addr, len), total >= size). Per key the
        bytes read or a negative code. Tries this process's replica first, then the others in order."""
        results = [0] * len(keys)
        pending = []  # (index, replica order, pinned regions)
        releases = []
        on_disk = []  # indices of objects that only have a disk replica
        try:
            for i, e in enumerate(entries):
                if isinstance(e, int):
                    results[i] = e
                    continue
                if sum(n for _, n in dests[i]) < e.size:
                    _log.error("get %r: buffer too small (%d bytes) for %d bytes", keys[i],
                               sum(n for _, n in dests[i]), e.size)
                    results[i] = int(ErrorCode.INVALID_PARAMS)
                    continue
                reps = sorted(e.replicas, key=lambda r: not self._is_mine(r))
                if not reps:
                    if e.disk:
                        on_disk.append(i)
                    else:
                        results[i] = int(ErrorCode.REPLICA_IS_NOT_READY)
                    continue
                needs_te = not all(self._is_mine(r) for r in reps)
                pinned = self._pin(clip(dests[i], e.size), registered, needs_te, write_out=True)
                if pinned is None:
                    results[i] = int(ErrorCode.TRANSFER_FAIL)
                    continue
                releases.append(pinned[1])
                pending.append((i, reps, pinned[0]))
            attempt = 0
            while pending:
                ops = []
                for i, reps, regions in pending:
                    rep, off = reps[min(attempt, len(reps) - 1)], 0
                    for a, n in regions:
                        ops.append((rep, a, rep.address + off, n, i))
                        off += n
                failed = self._transfer(ops, write=False)
                attempt += 1
                retry = [p for p in pending if p[0] in failed and attempt < len(p[1])]
                for i, _, _ in pending:
                    if i in failed:
                        results[i] = int(ErrorCode.TRANSFER_FAIL)
                    else:
                        results[i] = entries[i].size
                pending = retry
        finally:
            for release in releases:
                release()
        now = time.monotonic()
        for i, e in enumerate(entries):
            if results[i] >= 0 and not isinstance(e, int) and e.replicas and not self._usable(e, now):
                _log.warning("get %r: read lease expired before the transfer finished", keys[i])
                results[i] = int(ErrorCode.LEASE_EXPIRED)
        for i in on_disk:  # no lease needed: the owner holds the bytes until we release them
            results[i] = self._read_disk_replica(keys[i], entries[i], clip(dests[i], entries[i].size), registered)
        return results

    @while_open(none)
    def fast_read(self, key: str, dests_for, registered: bool) -> int | None:
        """One key whose cached descriptors are live, read from one replica (own segment first), without the
        general path's bookkeeping. Bytes read, a negative code from dests_for, or None: use get_many."""
        master = self._master
        e = self._cache.get(key)
        if e is None or not e.replicas or master is None or master.view_version != self._view or \
                not self._usable(e, time.monotonic()):
            return None
        dests = dests_for(0, e.size)
        if isinstance(dests, int):
            return dests
        if sum(n for _, n in dests) < e.size:
            return None
        rep = next((r for r in e.replicas if self._is_mine(r)), None)
        pinned = self._pin(clip(dests, e.size), registered, rep is None, write_out=True)
        if pinned is None:
            return None
        rep = rep or e.replicas[0]
        if not self._move_contiguous(rep, rep.address, *pinned, write=False) or \
                not self._usable(e, time.monotonic()):
            return None
        return e.size

    def fast_get_into(self, key, addr, size) -> int | None:
        """get_into's hot path: live cached descriptors, registered destination, one replica read (own
        segment: memcpy). Bytes read, or None: take the general path (which validates and logs). Gated like
        while_open, inline (this path costs about a microsecond)."""
        e = self._cache.get(key)
        master = self._master
        if e is None or not e.replicas or master is None or master.view_version != self._view or e.size > size or \
                not isinstance(addr, int) or not self._ranges.contains(addr, e.size) or \
                not self._usable(e, time.monotonic()) or not self._enter():
            return None
        try:
            for rep in e.replicas:
                if self._is_mine(rep):
                    if not self._copy(rep.address, addr, e.size, write=False):
                        return None
                    break
            else:
                rep = e.replicas[0]
                engine = self._engine
                if rep.segment_name == self._segment_name or engine is None or \
                        engine.batch_transfer_sync_read(rep.segment_name, [addr], [rep.address], [e.size]) != 0:
                    return None  # (a replica under this name is another instance's: the general path says so)
        finally:
            self._leave()
        return e.size if self._usable(e, time.monotonic()) else None

    @while_open(all_failed)
    def get_many(self, keys: list[str], dests_for, registered: bool) -> list:
        """Looks keys up and reads them into dests_for(i, size) (a list of regions, or an int code to skip
        the key). Retries once with a fresh lookup for keys whose cached descriptors failed."""
        entries = self._lookup(keys)
        results = self._read_dests(keys, entries, dests_for, registered)
        # A failed read through a cached (or just superseded) descriptor: look up afresh, once. So is a read
        # whose lease ran out before its transfer ended (e.g. one that had to open the first connection to the
        # holder): the retry holds a fresh lease. A disk replica that its owner no longer has reads as
        # OBJECT_NOT_FOUND and is retried too; one whose owner could not be asked (RPC_FAIL / RPC_TIMEOUT) is
        # not (the lookup would name the same owner).
        stale = [i for i, r in enumerate(results)
                 if r in (ErrorCode.TRANSFER_FAIL, ErrorCode.LEASE_EXPIRED)
                 or (r == _NOT_FOUND and not isinstance(entries[i], int))]
        if stale:
            self._cache_drop(keys[i] for i in stale)
            again = self._lookup([keys[i] for i in stale])
            redo = self._read_dests([keys[i] for i in stale], again, lambda j, s: dests_for(stale[j], s),
                                    registered)
            for i, r in zip(stale, redo):
                results[i] = r
        return results

    def _read_dests(self, keys, entries, dests_for, registered) -> list[int]:
        dests, results = [], [0] * len(keys)
        for i, e in enumerate(entries):
            d = [] if isinstance(e, int) else dests_for(i, e.size)
            if isinstance(d, int):
                results[i] = d
                entries[i] = d
                d = []
            dests.append(d)
        got = self.read_many(keys, entries, dests, registered)
        return [r if results[i] == 0 else results[i] for i, r in enumerate(got)]
