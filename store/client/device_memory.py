"""Device memory among the buffers a client registered (``register_buffer``), and copies that respect it.

The store copies between its own segment (host memory) and a caller's buffer with memmove when both are in this
process, without the Transfer Engine. A buffer that is device memory (a CUDA tensor's pointer, or the host
emulation's "device" memory in tests) must be copied by its platform instead: memmove on a device pointer
crashes the process on a real GPU. ``DeviceBuffers.note`` classifies a buffer once, at registration
(``mooncake._native.platform.classify``), and ``copy`` picks memmove or the owning platform's copy.

Threading: thread-safe; copies run outside the lock.
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import threading

_log = logging.getLogger("mooncake.store.client")


def _platform_for(kind: str):
    """The usable platform whose memory type is that of `kind` ("cuda:0" -> a usable cuda-type platform)."""
    from mooncake._native import platform

    mtype = kind.split(":", 1)[0]
    for p in platform.platforms():
        if p.get("usable") and p.get("memory_type") == mtype:
            return platform.get(p["name"])
    return None


class DeviceBuffers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._platforms: list = []

    def note(self, addr: int, size: int) -> str:
        """Classifies a newly registered buffer; returns its kind ("host", "cuda:0", ...)."""
        from mooncake._native import platform

        kind = platform.classify(addr)
        if kind == "host":
            return kind
        plat = _platform_for(kind)
        if plat is None:  # registered through the engine, which found a platform; be safe: no memmove either
            _log.warning("buffer %#x is %s memory but no usable platform copies it here", addr, kind)
        self._add(addr, size, plat)
        return kind

    def _add(self, addr: int, size: int, plat) -> None:
        with self._lock:
            i = bisect.bisect_right(self._starts, addr)
            self._starts.insert(i, addr)
            self._ends.insert(i, addr + size)
            self._platforms.insert(i, plat)

    def forget(self, addr: int) -> None:
        with self._lock:
            i = bisect.bisect_left(self._starts, addr)
            if i < len(self._starts) and self._starts[i] == addr:
                del self._starts[i], self._ends[i], self._platforms[i]

    def clear(self) -> None:
        with self._lock:
            self._starts.clear()
            self._ends.clear()
            self._platforms.clear()

    def _find(self, addr: int, n: int):
        """("device", platform or None) when [addr, addr+n) lies in one registered device buffer; ("host", None)
        when it touches none; ("straddle", None) when it runs over a device buffer's edge (neither memmove nor
        one platform copy is safe for it)."""
        if not self._starts:
            return "host", None
        end = addr + max(n, 1)
        with self._lock:
            i = bisect.bisect_right(self._starts, addr) - 1
            if i >= 0 and addr < self._ends[i]:
                return ("device", self._platforms[i]) if end <= self._ends[i] else ("straddle", None)
            if i + 1 < len(self._starts) and self._starts[i + 1] < end:
                return "straddle", None
        return "host", None

    def copy(self, dst: int, src: int, n: int, device_side: int) -> bool:
        """Copies n bytes from src to dst, where `device_side` (dst or src) may be registered device memory and
        the other side is host memory. False (logged, nothing copied) when device memory has no platform here
        or the platform's copy fails."""
        where, plat = self._find(device_side, n)
        if where == "host":
            ctypes.memmove(dst, src, n)
            return True
        if where == "straddle":
            _log.error("copy of %d bytes at %#x runs over the edge of a registered device buffer: refused", n,
                       device_side)
            return False
        if plat is None:
            _log.error("copy of %d bytes: %#x is device memory and no usable platform copies it", n, device_side)
            return False
        try:
            plat.copy(dst, src, n)
        except (RuntimeError, ValueError) as e:
            _log.error("device copy of %d bytes (%#x -> %#x) failed: %s", n, src, dst, e)
            return False
        return True
