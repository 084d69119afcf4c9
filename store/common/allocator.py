"""Per-segment offset allocator: two-level segregated fits (TLSF-style), O(1) allocate/free.

A segment's address range [0, capacity) is managed in granules (default 64 B, Mooncake's minimum allocation).
Free blocks are indexed three ways: by start, by end (for O(1) coalescing with both neighbours on free) and
by size class. Size classes are 8 linear sub-bins per power of two, so a block taken from the first non-empty
class at or above the request's class always fits and wastes < 12.5 % of itself before the split; the
remainder is returned to the free lists. A one-bit-per-class bitmap (a Python int) finds that class without
scanning. When no class above has a block, the request's own class is scanned for a block large enough
(rare; keeps the allocator from failing while a fitting block exists).

Allocated blocks are not recorded: the owner keeps (offset, size) and passes it back to ``free``. This keeps
the allocator's memory proportional to the number of *free* blocks, not of objects.

Threading: not thread-safe; the master serialises all calls under its lock.
Errors: ``allocate`` returns None when nothing fits; ``free`` raises ValueError, leaving the allocator
unchanged, for a block that is misaligned or out of range and (best effort, O(1)) for one whose start or end
coincides with free space, which catches the usual double free.
"""

from __future__ import annotations

DEFAULT_GRANULE = 64
_SUB_BITS = 3
_SUBS = 1 << _SUB_BITS


def _bin_of(units: int) -> int:
    """Index of the size class holding blocks of `units` granules (classes are ordered by size)."""
    if units < _SUBS:
        return units
    fl = units.bit_length() - 1
    return (fl - _SUB_BITS + 1) * _SUBS + ((units >> (fl - _SUB_BITS)) & (_SUBS - 1))


def _bin_lower(b: int) -> int:
    """Smallest block size (granules) of class `b`."""
    if b < _SUBS:
        return b
    fl = b // _SUBS + _SUB_BITS - 1
    return (_SUBS + b % _SUBS) << (fl - _SUB_BITS)


class OffsetAllocator:
    """Allocates contiguous byte ranges of one segment; offsets are relative to the segment base."""

    __slots__ = ("granule", "capacity_units", "_free_units", "_by_start", "_by_end", "_bins", "_bitmap")

    def __init__(self, capacity: int, granule: int = DEFAULT_GRANULE) -> None:
        if granule <= 0 or granule & (granule - 1):
            raise ValueError(f"granule must be a power of two, got {granule}")
        if capacity < granule:
            raise ValueError(f"capacity {capacity} is smaller than one granule ({granule} B)")
        self.granule = granule
        self.capacity_units = capacity // granule
        self._free_units = 0
        self._by_start: dict[int, int] = {}  # start -> size (granules)
        self._by_end: dict[int, int] = {}  # end (exclusive) -> start
        self._bins: list[dict[int, None]] = [{} for _ in range(_bin_of(self.capacity_units) + 1)]
        self._bitmap = 0
        self._insert(0, self.capacity_units)

    @classmethod
    def from_used(cls, capacity: int, used, granule: int = DEFAULT_GRANULE) -> "OffsetAllocator":
        """An allocator whose allocated blocks are exactly `used`: (offset, size) pairs sorted by offset, not
        overlapping (a master rebuilding a segment's free space from its metadata). ValueError otherwise."""
        a = cls(capacity, granule)
        a._remove(0, a.capacity_units)
        cursor = 0
        for offset, size in used:
            if size <= 0 or offset < 0 or offset % granule:
                raise ValueError(f"bad used block: offset={offset} size={size}")
            start = offset // granule
            if start < cursor:
                raise ValueError(f"used blocks overlap or are not sorted at offset {offset}")
            if start > cursor:
                a._insert(cursor, start - cursor)
            cursor = start + -(-size // granule)
            if cursor > a.capacity_units:
                raise ValueError(f"used block [{offset}, {offset + size}) lies outside the segment")
        if cursor < a.capacity_units:
            a._insert(cursor, a.capacity_units - cursor)
        return a

    # -- queries -------------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.capacity_units * self.granule

    @property
    def free_bytes(self) -> int:
        return self._free_units * self.granule

    @property
    def used_bytes(self) -> int:
        """Bytes handed out, rounded up to granules (what the segment really lost)."""
        return (self.capacity_units - self._free_units) * self.granule

    @property
    def free_block_count(self) -> int:
        return len(self._by_start)

    def rounded(self, size: int) -> int:
        """The number of bytes an allocation of `size` occupies."""
        return -(-size // self.granule) * self.granule

    def largest_free(self) -> int:
        """Largest contiguous free range in bytes (scans only the highest non-empty class)."""
        if not self._bitmap:
            return 0
        return max(self._by_start[s] for s in self._bins[self._bitmap.bit_length() - 1]) * self.granule

    def fragmentation(self) -> float:
        """1 - largest_free / free: 0 when all free space is one block, near 1 when it is shredded."""
        free = self._free_units * self.granule
        return 0.0 if free == 0 else 1.0 - self.largest_free() / free

    # -- allocate / free -----------------------------------------------------------------------------------
    def allocate(self, size: int) -> int | None:
        """Offset of a new block of at least `size` bytes (size > 0), or None when nothing fits."""
        if size <= 0:
            raise ValueError(f"allocation size must be positive, got {size}")
        units = -(-size // self.granule)
        if units > self._free_units:
            return None
        b = _bin_of(units)
        exact = b
        if _bin_lower(b) != units:
            b += 1
        mask = self._bitmap >> b
        if mask:
            b += (mask & -mask).bit_length() - 1
            start = next(iter(self._bins[b]))
        else:
            start = next((s for s in self._bins[exact] if self._by_start[s] >= units), None)
            if start is None:
                return None
        bsize = self._by_start[start]
        self._remove(start, bsize)
        if bsize > units:
            self._insert(start + units, bsize - units)
        return start * self.granule

    def free(self, offset: int, size: int) -> None:
        """Returns the block [offset, offset+size) obtained from ``allocate(size)``; coalesces neighbours."""
        if size <= 0 or offset < 0 or offset % self.granule:
            raise ValueError(f"bad block to free: offset={offset} size={size}")
        start = offset // self.granule
        units = -(-size // self.granule)
        end = start + units
        if end > self.capacity_units:
            raise ValueError(f"block [{offset}, {offset + size}) lies outside the segment ({self.capacity} B)")
        if self._overlaps_free(start, end):
            raise ValueError(f"block [{offset}, {offset + size}) overlaps free space (double free?)")
        prev_start = self._by_end.get(start)
        if prev_start is not None:
            self._remove(prev_start, start - prev_start)
            start = prev_start
        next_size = self._by_start.get(end)
        if next_size is not None:
            self._remove(end, next_size)
            end += next_size
        self._insert(start, end - start)

    # -- internals -----------------------------------------------------------------------------------------
    def _overlaps_free(self, start: int, end: int) -> bool:
        # An allocated block can touch free blocks only at their ends: a free block that starts where it
        # starts, or ends where it ends, means the range is (partly) free already.
        return start in self._by_start or end in self._by_end

    def _insert(self, start: int, units: int) -> None:
        self._by_start[start] = units
        self._by_end[start + units] = start
        b = _bin_of(units)
        self._bins[b][start] = None
        self._bitmap |= 1 << b
        self._free_units += units

    def _remove(self, start: int, units: int) -> None:
        del self._by_start[start]
        del self._by_end[start + units]
        b = _bin_of(units)
        bucket = self._bins[b]
        del bucket[start]
        if not bucket:
            self._bitmap &= ~(1 << b)
        self._free_units -= units
