"""Layer-wise sessions (Mooncake's ``batch_*_session_*`` calls, a mixin of MooncakeDistributedStore): look
objects up, or allocate them, once; then move byte ranges of them layer by layer with no master round trip.

Get sessions.
  * ``batch_get_session_start(keys) -> list[int]`` looks the keys up afresh (one BatchGetReplicaList, which
    grants read leases) and keeps per key the object's size and memory replicas (this process's own first).
    Per key 0, or the lookup's code: OBJECT_NOT_FOUND (-704), REPLICA_IS_NOT_READY (-703), INVALID_REPLICA
    (-702: only a disk replica; ranged reads need a memory replica, as in Mooncake), INVALID_PARAMS (-600, a
    bad key), RPC_FAIL / RPC_TIMEOUT. Starts nest: each start of a key takes one reference (and refreshes its
    descriptors), each ``batch_get_session_end`` gives one back; the session ends with its last reference.
  * ``batch_get_into_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_src_offsets) -> list[int]``
    copies, for key i and each j, all_sizes[i][j] bytes from offset all_src_offsets[i][j] of the object into
    all_buffer_ptrs[i][j] (registered memory). Per key the bytes copied (the sum of its sizes) or: -600 (no
    session, lists of different lengths, memory not registered), BUFFER_OVERFLOW (-10, a range past the
    object), LEASE_EXPIRED (-707: the read lease ran out, or the master that granted it stopped answering,
    see the descriptor cache rule in core.py; start the session again), TRANSFER_FAIL (-800: every replica
    failed).
  * ``batch_get_session_end(keys) -> int``: 0, or -600 when a key had no session (the others still end).

Put sessions.
  * ``batch_put_session_start(keys, sizes, config=None) -> list[int]``: BatchPutStart; the master allocates
    every replica (PROCESSING: not readable). Per key 0, or OBJECT_ALREADY_EXISTS (-705: the key exists and
    keeps its value; there is nothing to write, unlike ``put`` this is not 0), -600 (a bad key, size or
    config, or a put session of this client for the key is open already), NO_AVAILABLE_HANDLE (-200), or
    the RPC's code.
  * ``batch_put_from_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_dst_offsets) -> list[int]``
    writes, for key i and each j, the all_sizes[i][j] bytes at all_buffer_ptrs[i][j] (registered memory) to
    offset all_dst_offsets[i][j] of every replica. Per key the bytes written or -600, -10 or -800 as for gets
    (a failed range may be written again).
  * ``batch_put_session_end(keys) -> list[int]`` commits (BatchPutEnd) each key every byte of which was
    written by successful range calls: per key 0 or the master's code. INVALID_WRITE (-700): some bytes
    were never written (the session stays open: write them, or revoke); -600: no session. When the RPC
    itself fails (RPC_FAIL / RPC_TIMEOUT) the sessions stay open: end them again.
  * ``batch_put_session_revoke(keys) -> list[int]``: BatchPutRevoke; the sessions are gone whatever the
    master answers (it discards an unfinished put itself after ``--put_start_discard_timeout_sec``); per key
    its code, -600 for a key without a session. Nothing of a revoked put is ever readable.

Threading: every method from any thread. Range calls of one key may run in parallel (different layers); end
and revoke wait for the range calls in flight on their keys (so no write lands in memory the master took
back), and later range calls on those keys fail with -600. Sessions live in this client only: ``close``
revokes the put sessions left open and drops the rest.
"""

from __future__ import annotations

import logging
import threading
import time

from mooncake.store.client.config import ReplicateConfig
from mooncake.store.client.guard import NOT_READY, same_len as _same_len
from mooncake.store.client.validate import CONFIG, KEYS, UINT, key_error, seq, typed
from mooncake.store.common.errors import ErrorCode

_log = logging.getLogger("mooncake.store.client")
_OK = 0
_INVALID = int(ErrorCode.INVALID_PARAMS)
_OVERFLOW = int(ErrorCode.BUFFER_OVERFLOW)
_PTRS = seq(UINT)
_PTR_LISTS = seq(_PTRS)
_MERGE_AT = 64  # a put session merges the ranges it was written with once it holds this many


class _GetSession:
    __slots__ = ("entry", "replicas", "refs")

    def __init__(self, entry, replicas: list) -> None:
        self.entry, self.replicas, self.refs = entry, replicas, 1


class _PutSession:
    """An allocated object being written: `spans` are the [start, end) ranges written so far. `unsettled`: a
    write failed and may still land later (a timeout), so the object can only be revoked (its buffers are then
    held by the master, not reused), never ended: a late write could overwrite what a retry wrote."""
    __slots__ = ("size", "replicas", "spans", "inflight", "sealed", "unsettled")

    def __init__(self, size: int) -> None:
        self.size, self.replicas, self.spans, self.inflight = size, [], [], 0
        self.sealed = True  # until BatchPutStart gave its replicas
        self.unsettled = False

    def add(self, start: int, end: int) -> None:
        self.spans.append((start, end))
        if len(self.spans) >= _MERGE_AT:
            self.spans = _merged(self.spans)

    def complete(self) -> bool:
        self.spans = _merged(self.spans)
        return self.spans == [(0, self.size)]


def _merged(spans: list) -> list:
    out: list = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class SessionTable:
    """The open sessions of one store client; `lock` guards everything, `idle` is notified when a put
    session's range calls in flight drop."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.gets: dict[str, _GetSession] = {}
        self.puts: dict[str, _PutSession] = {}

    def seal(self, keys: list) -> dict:
        """{index: session} of the keys (first occurrences) whose put session is open, each now sealed and with
        no range call in flight."""
        taken: dict[int, _PutSession] = {}
        with self.lock:
            for i, k in enumerate(keys):
                s = self.puts.get(k)
                if s is not None and not s.sealed:
                    s.sealed = True
                    taken[i] = s
            while any(s.inflight for s in taken.values()):
                self.idle.wait()
        return taken


class SessionAPI:
    """Mixin of MooncakeDistributedStore (needs StoreCore); see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._sessions = SessionTable()

    def close(self) -> int:
        """As StoreCore.close, after revoking the put sessions left open."""
        table = self._sessions
        with table.lock:
            keys = list(table.puts)
            table.gets.clear()
        if keys:
            taken = table.seal(keys)
            if self._cfg is not None:
                unsettled = [k for i, k in enumerate(keys) if i in taken and taken[i].unsettled]
                settled = [k for i, k in enumerate(keys) if not (i in taken and taken[i].unsettled)]
                if settled:
                    self._rpc("BatchPutRevoke", keys=settled)
                if unsettled:
                    self._rpc("BatchPutRevoke", keys=unsettled, unsettled=True)
            with table.lock:
                for k in keys:
                    table.puts.pop(k, None)
        return super().close()

    # -- get sessions --------------------------------------------------------------------------------------------
    @typed(keys=KEYS)
    def batch_get_session_start(self, keys) -> list[int]:
        op = "batch_get_session_start"
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        out = [_INVALID] * len(keys)
        good = [i for i in range(len(keys)) if not _bad_key(op, keys[i])]
        names = [keys[i] for i in good]
        self._cache_drop(names)  # a fresh lookup: a full lease for the session
        entries = self._lookup(names) if names else []
        table = self._sessions
        for i, e in zip(good, entries):
            if isinstance(e, int):
                out[i] = e
                continue
            if not e.replicas:
                _log.error("%s: %r has no memory replica (ranged reads need one)", op, keys[i])
                out[i] = int(ErrorCode.INVALID_REPLICA)
                continue
            replicas = sorted(e.replicas, key=lambda r: not self._is_mine(r))
            with table.lock:
                s = table.gets.get(keys[i])
                if s is None:
                    table.gets[keys[i]] = _GetSession(e, replicas)
                else:
                    s.entry, s.replicas, s.refs = e, replicas, s.refs + 1
            out[i] = _OK
        return out

    @typed(keys=KEYS, all_buffer_ptrs=_PTR_LISTS, all_sizes=_PTR_LISTS, all_src_offsets=_PTR_LISTS)
    def batch_get_into_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes, all_src_offsets) -> list[int]:
        op = "batch_get_into_multi_buffer_ranges"
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        if not _same_len(op, keys, all_buffer_ptrs, all_sizes, all_src_offsets):
            return [_INVALID] * len(keys)
        table = self._sessions
        with table.lock:
            found = [table.gets.get(k) for k in keys]
        results = [_OK] * len(keys)
        now = time.monotonic()
        pending = []  # (index, session's entry, replicas, [(local, offset, n)])
        for i, s in enumerate(found):
            ranges = self._ranges_of(op, keys[i], s, all_buffer_ptrs[i], all_sizes[i], all_src_offsets[i],
                                     s.entry.size if s is not None else 0)
            if isinstance(ranges, int):
                results[i] = ranges
            elif not self._usable(s.entry, now):
                results[i] = int(ErrorCode.LEASE_EXPIRED)
            else:
                pending.append((i, s.entry, s.replicas, ranges))
        attempt = 0
        while pending:  # one transfer per round; a key whose replica failed tries its next one
            ops = [(reps[attempt], local, reps[attempt].address + off, n, i)
                   for i, _, reps, ranges in pending for local, off, n in ranges]
            failed = self._transfer(ops, write=False)
            attempt += 1
            for i, _, _, ranges in pending:
                results[i] = int(ErrorCode.TRANSFER_FAIL) if i in failed else sum(n for _, _, n in ranges)
            pending = [p for p in pending if p[0] in failed and attempt < len(p[2])]
        now = time.monotonic()
        for i, s in enumerate(found):
            if results[i] > 0 and not self._usable(s.entry, now):
                _log.warning("%s: the read lease of %r expired before the transfer finished", op, keys[i])
                results[i] = int(ErrorCode.LEASE_EXPIRED)
        return results

    @typed(keys=KEYS)
    def batch_get_session_end(self, keys) -> int:
        op = "batch_get_session_end"
        if not self._ready(op):
            return NOT_READY
        missing = []
        table = self._sessions
        with table.lock:
            for k in keys:
                s = table.gets.get(k)
                if s is None:
                    missing.append(k)
                    continue
                s.refs -= 1
                if s.refs == 0:
                    del table.gets[k]
        if missing:
            _log.error("%s: no get session for %d key(s), e.g. %r", op, len(missing), missing[0])
            return _INVALID
        return _OK

    # -- put sessions --------------------------------------------------------------------------------------------
    @typed(keys=KEYS, sizes=_PTRS, config=CONFIG)
    def batch_put_session_start(self, keys, sizes, config: ReplicateConfig | None = None) -> list[int]:
        op = "batch_put_session_start"
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        if not _same_len(op, keys, sizes):
            return [_INVALID] * len(keys)
        config = config if config is not None else ReplicateConfig()
        code = config.validate()
        if code != _OK:
            _log.error("%s: invalid ReplicateConfig %s", op, config)
            return [code] * len(keys)
        out = [_INVALID] * len(keys)
        table = self._sessions
        mine = []  # indices whose placeholder session this call holds
        with table.lock:
            for i, (k, n) in enumerate(zip(keys, sizes)):
                if _bad_key(op, k):
                    continue
                if n == 0:
                    _log.error("%s: %r: size must be positive", op, k)
                elif k in table.puts:
                    _log.error("%s: a put session for %r is open already (end or revoke it first)", op, k)
                else:
                    table.puts[k] = _PutSession(n)
                    mine.append(i)
        if not mine:
            return out
        reply = self._rpc("BatchPutStart", keys=[keys[i] for i in mine], sizes=[sizes[i] for i in mine],
                          config=config.to_proto(self._segment_name))
        empty = []  # started without a replica: given back at once
        with table.lock:
            for j, i in enumerate(mine):
                s = table.puts[keys[i]]
                r = None if isinstance(reply, int) else reply.results[j]
                if r is not None and r.code == _OK and r.replicas:
                    s.replicas, s.sealed = list(r.replicas), False
                    out[i] = _OK
                    continue
                del table.puts[keys[i]]
                if r is None:
                    out[i] = reply
                elif r.code == _OK:
                    out[i] = int(ErrorCode.NO_AVAILABLE_HANDLE)
                    empty.append(keys[i])
                else:
                    out[i] = r.code
        if empty:
            self._rpc("BatchPutRevoke", keys=empty)
        return out

    @typed(keys=KEYS, all_buffer_ptrs=_PTR_LISTS, all_sizes=_PTR_LISTS, all_dst_offsets=_PTR_LISTS)
    def batch_put_from_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes, all_dst_offsets) -> list[int]:
        op = "batch_put_from_multi_buffer_ranges"
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        if not _same_len(op, keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
            return [_INVALID] * len(keys)
        table = self._sessions
        taken = {}  # index -> session (its inflight count raised)
        with table.lock:
            for i, k in enumerate(keys):
                s = table.puts.get(k)
                if s is not None and not s.sealed:
                    s.inflight += 1
                    taken[i] = s
        results = [_INVALID] * len(keys)
        done = {}  # index -> ranges written
        failed: set = set()
        try:
            ops = []
            for i, k in enumerate(keys):
                s = taken.get(i)
                ranges = self._ranges_of(op, k, s, all_buffer_ptrs[i], all_sizes[i], all_dst_offsets[i],
                                         s.size if s is not None else 0)
                if isinstance(ranges, int):
                    results[i] = ranges
                    continue
                done[i] = ranges
                ops += [(rep, local, rep.address + off, n, i) for rep in s.replicas for local, off, n in ranges]
            failed = self._transfer(ops, write=True) if ops else set()
            for i, ranges in done.items():
                results[i] = int(ErrorCode.TRANSFER_FAIL) if i in failed else sum(n for _, _, n in ranges)
        finally:
            with table.lock:
                for i, s in taken.items():
                    s.inflight -= 1
                    if results[i] >= 0:
                        for _, off, n in done.get(i, ()):
                            s.add(off, off + n)
                    elif i in failed:
                        s.unsettled = True
                table.idle.notify_all()
        return results

    @typed(keys=KEYS)
    def batch_put_session_end(self, keys) -> list[int]:
        op = "batch_put_session_end"
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        table = self._sessions
        taken = table.seal(keys)
        out = _no_session(op, keys, taken)
        complete = []
        with table.lock:
            for i, s in taken.items():
                if s.unsettled:
                    _log.error("%s: %r: a write of this object failed and may still land; revoke it and put it "
                               "again", op, keys[i])
                    out[i] = int(ErrorCode.TRANSFER_FAIL)
                    s.sealed = False
                elif s.complete():
                    complete.append(i)
                else:
                    _log.error("%s: %r: bytes never written (%s of %d written); write them or revoke", op,
                               keys[i], s.spans, s.size)
                    out[i] = int(ErrorCode.INVALID_WRITE)
                    s.sealed = False
        if not complete:
            return out
        reply = self._rpc("BatchPutEnd", keys=[keys[i] for i in complete])
        with table.lock:
            for j, i in enumerate(complete):
                if isinstance(reply, int):  # the RPC failed: the sessions stay open for another end
                    out[i] = reply
                    taken[i].sealed = False
                else:
                    out[i] = reply.codes[j]
                    table.puts.pop(keys[i], None)
        return out

    @typed(keys=KEYS)
    def batch_put_session_revoke(self, keys) -> list[int]:
        op = "batch_put_session_revoke"
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        table = self._sessions
        taken = table.seal(keys)
        out = _no_session(op, keys, taken)
        if not taken:
            return out
        for unsettled in (False, True):  # buffers a failed write may still reach are held by the master
            idx = sorted(i for i, s in taken.items() if s.unsettled == unsettled)
            if not idx:
                continue
            reply = self._rpc("BatchPutRevoke", keys=[keys[i] for i in idx], unsettled=unsettled)
            with table.lock:
                for j, i in enumerate(idx):
                    out[i] = reply if isinstance(reply, int) else reply.codes[j]
                    table.puts.pop(keys[i], None)
        return out

    # -- shared checks -------------------------------------------------------------------------------------------
    def _ranges_of(self, op: str, key: str, session, ptrs: list, sizes: list, offsets: list, size: int):
        """[(local address, offset in the object, length)] of one key's range call, or the code that refuses
        it (logged): no session, lists of different lengths, a range past the object, unregistered memory."""
        if session is None:
            _log.error("%s: no %s session for %r (start one first)", op, "get" if "get" in op else "put", key)
            return _INVALID
        if not _same_len(op, ptrs, sizes, offsets):
            return _INVALID
        for off, n in zip(offsets, sizes):
            if off + n > size:
                _log.error("%s: %r: range [%d, +%d) is past the object's %d bytes", op, key, off, n, size)
                return _OVERFLOW
        if not self._regions_ok(op, ptrs, sizes):
            return _INVALID
        return list(zip(ptrs, offsets, sizes))


def _no_session(op: str, keys: list, taken: dict) -> list[int]:
    """The answer of end / revoke before the master's: -600 (logged) for each key without an open session."""
    out = [_OK] * len(keys)
    for i, k in enumerate(keys):
        if i not in taken:
            _log.error("%s: no open put session for %r", op, k)
            out[i] = _INVALID
    return out


def _bad_key(op: str, key) -> bool:
    why = key_error(key)
    if why:
        _log.error("%s: %s", op, why)
    return why is not None
