"""How a mooncake.ep Buffer learns its peers' addresses, with every wait bounded.

Construction (`introduce`, collective over the group): each rank publishes its engine segment and the address
of its mailbox (a small registered area, `Mailbox`) in the group's store and reads every peer's; it then
publishes an acknowledgement and waits for the peers'. A constructor therefore returns only after every rank
that introduced itself has read all the introductions: a rank that exits afterwards, the one hosting the
store included, takes nothing with it that the others still need.

First dispatch (`Mailbox.exchange`): each rank writes the record of its data buffer (segment, address, device
information, shape) into its peers' mailboxes through the Transfer Engine and reads theirs from its own until
the dispatch's deadline. The store is not used, so it may be gone by then; a peer whose record does not come in
time is reported missing, and the caller treats it as an inactive rank.

Store errors: torch.distributed's store raises RuntimeError subclasses (DistNetworkError when its host is gone,
DistStoreError); `poll_store` turns them into StoreUnreachable, which keeps what was read before.
Threading: one caller at a time per object (as Buffer).
"""

from __future__ import annotations

import ctypes
import json
import logging
import time

_log = logging.getLogger("mooncake.ep")


class StoreUnreachable(RuntimeError):
    """The process group's store stopped answering; `records` holds what was read from it before."""

    def __init__(self, cause: Exception, records: dict):
        super().__init__(f"mooncake.ep: the process group's store does not answer ({type(cause).__name__}: "
                         f"{str(cause).splitlines()[0] if str(cause) else ''})")
        self.records = records


def poll_store(store, keys: dict[int, str], deadline: float, accept=None, enough=None) -> dict[int, object]:
    """Reads the JSON value under keys[r] for each rank r as it appears, until all are read, `enough(records)`
    holds or the monotonic `deadline` passed (a deadline in the past: one pass). A value that `accept(value)`
    refuses is read again later. Returns {rank: value}; raises StoreUnreachable when the store fails."""
    records: dict[int, object] = {}
    pending = dict(keys)
    delay = 0.002
    while True:
        try:
            for r, key in list(pending.items()):
                if store.check([key]):
                    value = json.loads(store.get(key))
                    if accept is None or accept(value):
                        records[r] = value
                        del pending[r]
        except RuntimeError as e:
            raise StoreUnreachable(e, records) from e
        if not pending or (enough is not None and enough(records)) or time.monotonic() > deadline:
            return records
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def introduce(store, prefix: str, rank: int, world: int, own: dict, deadline: float) -> dict[int, dict]:
    """The construction rendezvous (see the module docstring). Returns the introductions ({segment, mailbox})
    of the ranks that introduced themselves before the deadline, this rank's included; a missing rank is logged.
    Raises RuntimeError when the store cannot be reached before any peer's introduction was read."""
    keys = {r: f"{prefix}/hello/{r}" for r in range(world)}
    try:
        store.set(keys[rank], json.dumps(own))
        records = poll_store(store, keys, deadline)
    except StoreUnreachable as e:
        records, failure = e.records, e
    except RuntimeError as e:  # the set itself failed
        records, failure = {}, StoreUnreachable(e, {})
    else:
        failure = None
    records[rank] = own
    if failure is not None and len(records) < 2 <= world:
        raise RuntimeError(f"mooncake.ep.Buffer: cannot introduce rank {rank} to its peers: {failure}") from failure
    if failure is None:
        try:
            store.set(f"{prefix}/ack/{rank}", "1")
            poll_store(store, {r: f"{prefix}/ack/{r}" for r in records if r != rank}, deadline)
        except RuntimeError:
            pass  # this rank read every introduction it will get: nothing else is needed from the store
    missing = sorted(set(range(world)) - records.keys())
    if missing:
        _log.warning("mooncake.ep.Buffer: rank %d got no introduction from ranks %s (%s); they start inactive",
                     rank, missing, failure or "not constructed in time")
    return records


def write_batches(engine, batches: dict[int, tuple[str, list[int], list[int], list[int]]],
                  deadline: float) -> set[int]:
    """Submits, per rank, one batch of Transfer Engine writes (target segment, local addresses, remote
    addresses, lengths) and polls them all until done or the deadline. Returns the ranks whose batch failed or
    was not done in time (an unfinished one completes or fails in the background)."""
    failed: set[int] = set()
    pending = {}
    for r, (segment, src, dst, lengths) in batches.items():
        bid = engine.batch_transfer_async_write(segment, src, dst, lengths)
        if bid == 0:
            failed.add(r)
        else:
            pending[r] = bid
    while pending:
        for r, bid in list(pending.items()):
            status = engine.transfer_check_status(bid)
            if status == 1:
                del pending[r]
            elif status < 0:
                failed.add(r)
                del pending[r]
        if pending and time.monotonic() > deadline:
            failed |= pending.keys()
            break
        if pending:
            time.sleep(20e-6)
    return failed


class Mailbox:
    """A registered area where peers leave their data-buffer record at their first dispatch.

    Slot s (SLOT bytes) belongs to source rank s: [int64 flag | int32 length | JSON]. A source writes the length
    and JSON first and sets the flag to 1 only after that write completed (the bytes landed), so a set flag
    always follows a whole record. Slot `world` stages this rank's own record. Each source writes its slot once.
    """

    SLOT = 2048
    _HEADER = 12

    def __init__(self, engine, world: int, rank: int):
        self.engine, self.world, self.rank = engine, world, rank
        size = (world + 1) * self.SLOT
        self.base = engine.allocate_managed_buffer(size)
        if self.base == 0:
            raise RuntimeError(f"mooncake.ep: cannot allocate {size} bytes of registered memory for the mailbox")
        ctypes.memset(self.base, 0, size)

    def _slot(self, s: int) -> int:
        return self.base + s * self.SLOT

    def _read(self, s: int) -> dict | None:
        slot = self._slot(s)
        if ctypes.c_int64.from_address(slot).value != 1:
            return None
        n = ctypes.c_int32.from_address(slot + 8).value
        try:
            if not 0 < n <= self.SLOT - self._HEADER:
                raise ValueError(f"record length {n}")
            record = json.loads(ctypes.string_at(slot + self._HEADER, n))
            if not isinstance(record, dict) or not isinstance(record.get("segment"), str) or \
                    not isinstance(record.get("base"), int):
                raise ValueError("not a buffer record")
            return record
        except ValueError as e:
            _log.error("mooncake.ep: rank %d left an unreadable record (%s); it is treated as missing", s, e)
            ctypes.c_int64.from_address(slot).value = 2  # read once: not logged again
            return None

    def exchange(self, record: dict, peers: dict[int, dict], deadline: float) -> tuple[dict[int, dict], set[int]]:
        """Writes `record` into the mailbox of each rank in `peers` (rank -> its introduction) and collects their
        records from this mailbox until they are all in or the deadline passed. Returns (records by rank,
        ranks that could not be written to: they get no record from this rank, and theirs is not waited for).
        Raises ValueError when `record` does not fit a slot (nothing is written then)."""
        data = json.dumps(record).encode()
        if self._HEADER + len(data) > self.SLOT:
            raise ValueError(f"mooncake.ep: a buffer record of {len(data)} bytes does not fit the "
                             f"{self.SLOT - self._HEADER}-byte mailbox slot")
        stage = self._slot(self.world)
        ctypes.c_int32.from_address(stage + 8).value = len(data)
        ctypes.memmove(stage + self._HEADER, data, len(data))
        ctypes.c_int64.from_address(stage).value = 1
        mine = self.rank * self.SLOT
        others = {r: p for r, p in peers.items() if r != self.rank}
        failed = write_batches(self.engine, {r: (p["segment"], [stage + 8], [p["mailbox"] + mine + 8],
                                                 [4 + len(data)]) for r, p in others.items()}, deadline)
        failed |= write_batches(self.engine, {r: (p["segment"], [stage], [p["mailbox"] + mine], [8])
                                              for r, p in others.items() if r not in failed}, deadline)
        waiting = [r for r in others if r not in failed]
        records: dict[int, dict] = {}
        delay = 50e-6
        while waiting:
            for r in list(waiting):
                got = self._read(r)
                if got is not None:
                    records[r] = got
                    waiting.remove(r)
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)
        return records, failed
