"""Device memory of mooncake.ep's GPU path on the platform layer (`mooncake._native.platform`): allocation, IPC
between the processes of one host and copies, for one device of one platform ("cuda", or the "host_emulation"
in tests). Both devices of device.py's interface keep their memory here; nothing in mooncake.ep allocates,
maps or copies device memory by other means.

Contracts:
- malloc(size): `size` bytes of the platform's "device" kind, as the platform leaves them (cuda: not zeroed, so
  CudaDevice zeroes them; host_emulation: zero-filled).
- ipc_handle(ptr) is opaque bytes naming the whole allocation and its owner process: ipc_open in another
  process of this host maps it (the platform refuses a handle of the process itself where its vendor does).
- Errors of the platform (ValueError, RuntimeError, NotImplementedError) become DeviceError naming the call;
  a malformed handle is a ValueError, a wrong argument type a TypeError.
Threading: as the GPU path, one caller at a time.
"""

from __future__ import annotations

import os
import struct

_HANDLE = struct.Struct("<8sqQ")  # magic, owner pid, allocation bytes; the platform's handle text follows
_MAGIC = b"MCEPIPC2"


class DeviceError(RuntimeError):
    pass


def native_platform(name: str):
    """The platform `name` of mooncake._native.platform. ImportError when the extension does not import,
    KeyError when this installation has no such platform."""
    from mooncake._native import platform  # the extension loads only when a device is used
    return platform.get(name)


class PlatformMemory:
    """Allocations and IPC mappings on device `device` of `platform` (a mooncake._native.platform.Platform),
    with the sizes the platform needs to release them."""

    def __init__(self, platform, device: int):
        self.platform, self.device = platform, device
        self._allocated: dict[int, int] = {}  # address -> bytes
        self._mapped: dict[int, int] = {}     # address ipc_open returned -> bytes

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except (ValueError, RuntimeError) as e:
            raise DeviceError(f"mooncake.ep: {self.platform.name} {what} failed: {e}") from e

    def malloc(self, size: int) -> int:
        if not isinstance(size, int) or isinstance(size, bool):
            raise TypeError(f"size must be an int, got {type(size).__name__}")
        ptr = self._call(f"allocate({size})", self.platform.allocate, size, "device", self.device)
        self._allocated[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        size = self._allocated.get(ptr)
        if size is None:
            raise ValueError(f"mooncake.ep: {ptr:#x} was not allocated by malloc")
        self._call("free", self.platform.free, ptr, size, "device")
        del self._allocated[ptr]

    def ipc_handle(self, ptr: int) -> bytes:
        size = self._allocated.get(ptr)
        if size is None:
            raise ValueError(f"mooncake.ep: {ptr:#x} is not an allocation of malloc (only those are exported)")
        handle = self._call("export_ipc", self.platform.export_ipc, ptr, size)
        return _HANDLE.pack(_MAGIC, os.getpid(), size) + handle.encode()

    def ipc_open(self, handle: bytes) -> int:
        if not isinstance(handle, (bytes, bytearray)):
            raise TypeError(f"handle must be bytes, got {type(handle).__name__}")
        if len(handle) <= _HANDLE.size or handle[:len(_MAGIC)] != _MAGIC:
            raise ValueError("mooncake.ep: not a device IPC handle of mooncake.ep")
        _, pid, size = _HANDLE.unpack_from(handle)
        try:
            text = bytes(handle[_HANDLE.size:]).decode()
        except UnicodeDecodeError:
            raise ValueError("mooncake.ep: a damaged device IPC handle") from None
        ptr = self._call("import_ipc", self.platform.import_ipc, text, pid, size)
        self._mapped[ptr] = size
        return ptr

    def ipc_close(self, ptr: int) -> None:
        size = self._mapped.get(ptr)
        if size is None:
            raise ValueError(f"mooncake.ep: {ptr:#x} is not a mapping of ipc_open")
        self._call("close_ipc", self.platform.close_ipc, ptr, size)
        del self._mapped[ptr]

    def copy(self, dst: int, src: int, n: int, stream: int, wait: bool) -> None:
        """n bytes on `stream` (the platform's native handle; 0: its own), waited for when `wait`."""
        if n:
            self._call("copy", self.platform.copy, dst, src, n, self.device, stream, wait)
