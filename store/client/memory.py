"""Local memory of a store client: the registered staging buffer and the registry of registered ranges.

``StagingPool``: a registered (memfd-backed, Transfer Engine managed) buffer of ``local_buffer_size`` bytes
from which byte-API puts and gets borrow space for the one copy between Python objects and the wire.
``alloc(size)`` returns an address or None (full / too small); ``free(addr)`` gives it back. Thread-safe.

``RegisteredRanges``: the address ranges the Transfer Engine accepts as local buffers (the staging pool, the
global segment, buffers from ``register_buffer``). ``contains(addr, size)`` says whether [addr, addr+size)
lies inside one range. Thread-safe; lookups are O(log n).

``buffer_address(obj)``: (address, nbytes) of a contiguous buffer-protocol object (bytes, bytearray,
memoryview, numpy array, ...) without copying; TypeError for anything else or a non-contiguous view.
"""

from __future__ import annotations

import bisect
import ctypes
import threading

import numpy as np

from mooncake.store.common.allocator import OffsetAllocator

_ALIGN = 64
ZERO_COPY_MIN = 2 << 20  # registering costs ~100 µs per buffer here: below this a staging copy is cheaper


def buffer_address(obj) -> tuple[int, int]:
    if type(obj) is bytes:  # the common case, without a memoryview (CPython: the data follows the header)
        return (id(obj) + BYTES_DATA, len(obj)) if obj else (0, 0)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise TypeError("value must be a C-contiguous buffer")
        return obj.ctypes.data, obj.nbytes
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"value must be bytes-like (buffer protocol), got {type(obj).__name__}") from None
    if not mv.c_contiguous:
        raise TypeError("value must be a C-contiguous buffer")
    if mv.nbytes == 0:
        return 0, 0
    arr = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)
    return arr.ctypes.data, arr.nbytes


class StagingPool:
    """Small requests (<= SMALL_MAX) take power-of-two slots kept on per-class free lists once used, so the hot
    path of small puts and gets costs a list pop and push rather than an allocator call; the slots kept
    are bounded (a quarter of the pool), the rest goes back to the allocator."""

    SMALL_MIN, SMALL_MAX = 4 << 10, 64 << 10

    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size
        self._alloc = OffsetAllocator(size, granule=_ALIGN) if size else None
        self._sizes: dict[int, int] = {}
        self._slots: dict[int, list[int]] = {}  # slot size -> free slots (offsets), taken from the allocator
        self._slot_bytes = 0  # bytes on those free lists
        self._cached: set[int] = set()  # the offsets on them (a second free of one is refused)
        self._lock = threading.Lock()

    def alloc(self, size: int) -> int | None:
        if self._alloc is None or size <= 0 or size > self.size:
            return None
        if size <= self.SMALL_MAX:
            size = max(self.SMALL_MIN, 1 << (size - 1).bit_length())
        with self._lock:
            free = self._slots.get(size)
            if free:
                self._slot_bytes -= size
                off = free.pop()
                self._cached.discard(off)
                return self.base + off
            off = self._alloc.allocate(size)
            if off is None:
                if not self._slot_bytes:
                    return None
                self._drop_slots_locked()
                off = self._alloc.allocate(size)
                if off is None:
                    return None
            self._sizes[off] = size
        return self.base + off

    def free(self, addr: int) -> None:
        """Gives back what alloc returned; ValueError for an address it did not hand out or already got back."""
        off = addr - self.base
        with self._lock:
            size = self._sizes.get(off)
            if size is None or off in self._cached:
                raise ValueError(f"staging address {addr:#x} is not allocated")
            if size <= self.SMALL_MAX and self._slot_bytes + size <= self.size // 4:
                self._slots.setdefault(size, []).append(off)
                self._cached.add(off)
                self._slot_bytes += size
                return
            del self._sizes[off]
            self._alloc.free(off, size)

    def _drop_slots_locked(self) -> None:
        for free in self._slots.values():
            for off in free:
                self._alloc.free(off, self._sizes.pop(off))
        self._slots.clear()
        self._cached.clear()
        self._slot_bytes = 0

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return (self._alloc.free_bytes + self._slot_bytes) if self._alloc else 0


class RegisteredRanges:
    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._lock = threading.Lock()

    def add(self, addr: int, size: int) -> bool:
        """False when [addr, addr+size) overlaps a range already present (nothing is added)."""
        with self._lock:
            i = bisect.bisect_right(self._starts, addr)
            if i > 0 and self._ends[i - 1] > addr:
                return False
            if i < len(self._starts) and self._starts[i] < addr + size:
                return False
            self._starts.insert(i, addr)
            self._ends.insert(i, addr + size)
            return True

    def remove(self, addr: int) -> int | None:
        """Removes the range starting at `addr`; its size, or None if no range starts there."""
        with self._lock:
            i = bisect.bisect_left(self._starts, addr)
            if i == len(self._starts) or self._starts[i] != addr:
                return None
            size = self._ends[i] - addr
            del self._starts[i], self._ends[i]
            return size

    def contains(self, addr: int, size: int) -> bool:
        with self._lock:
            i = bisect.bisect_right(self._starts, addr) - 1
            return i >= 0 and addr + size <= self._ends[i]

    def items(self) -> list[tuple[int, int]]:
        """(addr, size) of every range, in address order."""
        with self._lock:
            return [(a, e - a) for a, e in zip(self._starts, self._ends)]

    def clear(self) -> None:
        with self._lock:
            self._starts.clear()
            self._ends.clear()


BYTES_DATA = bytes.__basicsize__ - 1  # offset of ob_sval (the data) in a CPython bytes object


def gather(dst: int, regions: list) -> None:
    """Copies the (address, length) regions back to back to dst."""
    for a, n in regions:
        ctypes.memmove(dst, a, n)
        dst += n


def scatter(src: int, regions: list) -> None:
    """Copies back-to-back bytes at src into the (address, length) regions."""
    for a, n in regions:
        ctypes.memmove(a, src, n)
        src += n


def clip(regions: list, size: int) -> list:
    """The prefix of `regions` covering exactly `size` bytes."""
    out = []
    for a, n in regions:
        if size <= 0:
            break
        out.append((a, min(n, size)))
        size -= n
    return out
