"""Memory and connection bounds shared by the Python listeners (HTTP metadata server, master admin HTTP,
master fast RPC, store disk-replica service).

A listener never allocates memory for bytes a peer only announced: ``read_exactly`` grows its buffer as bytes
arrive, at most READ_CHUNK ahead of them, and takes every chunk from the listener's ``ByteBudget`` (the bytes all
its requests being received may hold at once) before reading it. A request that cannot get its bytes
from the budget, or does not arrive, before its deadline fails with ``LimitExceeded`` / ``TimeoutError``;
the caller answers it as refused and closes the connection. ``ConnectionSlots`` caps the connections (and so
the server threads) a listener keeps open.

Threading: ByteBudget and ConnectionSlots are thread-safe; everything else is per connection.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

READ_CHUNK = 1 << 20


class LimitExceeded(Exception):
    """A request needs more than a listener allows (frame/body size, or the budget stayed full)."""


class ByteBudget:
    """At most `limit` bytes taken at once; ``take`` waits (bounded) for room."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a byte budget must be > 0, got {limit}")
        self.limit = limit
        self._used = 0
        self._cond = threading.Condition()

    @property
    def used(self) -> int:
        with self._cond:
            return self._used

    def take(self, n: int, deadline: float) -> bool:
        """Takes `n` bytes, waiting until time.monotonic() reaches `deadline` at most; False if no room came."""
        with self._cond:
            while self._used + n > self.limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self._used += n
            return True

    def give(self, n: int) -> None:
        if n <= 0:
            return
        with self._cond:
            self._used -= n
            self._cond.notify_all()


def read_exactly(read: Callable[[int], bytes], n: int, budget: ByteBudget, deadline: float,
                 set_timeout: Callable[[float], None], prefix: bytes = b"") -> bytearray:
    """Reads a request of exactly `n` bytes, of which `prefix` already arrived, with ``read(k)`` (returns 1..k
    bytes, b"" at end of stream). Each chunk (at most READ_CHUNK) is taken from `budget` before it is read, so
    bytes a peer only announced hold nothing. Only a request that holds nothing yet waits for room (until
    `deadline`); one that already holds part of the budget and finds no room for its next chunk fails at once
    and gives back what it held, so requests never wait on each other while holding budget (no deadlock).
    ``set_timeout(seconds)`` is called before every read so that a read never waits past `deadline`
    (time.monotonic()).

    On success the caller owns `n` bytes of `budget` and gives them back once done with the buffer. Raises
    ConnectionError (the peer closed), TimeoutError (deadline) or LimitExceeded (more than the budget holds,
    or no room); then nothing stays taken."""
    if n > budget.limit:
        raise LimitExceeded(f"a request of {n} bytes exceeds the listener's {budget.limit} bytes in progress")
    taken = 0
    try:
        buf = bytearray()
        if prefix:
            if not budget.take(len(prefix), deadline):
                raise LimitExceeded(f"the listener's {budget.limit} bytes for requests in progress stayed taken")
            taken = len(prefix)
            buf += prefix
        while len(buf) < n:
            k = min(READ_CHUNK, n - len(buf))
            if not budget.take(k, deadline if not taken else 0.0):
                raise LimitExceeded(f"the listener's {budget.limit} bytes for requests in progress are taken")
            taken += k
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{n - len(buf)} of {n} bytes did not arrive in time")
            set_timeout(left)
            data = read(k)
            if not data:
                raise ConnectionError(f"connection closed {n - len(buf)} bytes before the end of the request")
            buf += data
            budget.give(k - len(data))
            taken -= k - len(data)
    except BaseException:
        budget.give(taken)
        raise
    return buf


class ConnectionSlots:
    """At most `limit` connections at once: ``acquire`` (non-blocking) is False when all are in use."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = limit
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        with self._lock:
            if self._free <= 0:
                return False
            self._free -= 1
            return True

    def release(self) -> None:
        with self._lock:
            self._free += 1

    @property
    def in_use(self) -> int:
        with self._lock:
            return self.limit - self._free
