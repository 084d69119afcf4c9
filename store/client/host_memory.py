"""Host memory for the zero-copy store calls and NUMA placement: ``MooncakeHostMemAllocator``,
``get_alloc_func_addr``, ``get_free_func_addr`` and ``bind_to_numa_node`` (exported by ``mooncake.store``).

The memory comes from the native library next to this file (host_memory.cc): each block is its own
page-aligned, zero-filled anonymous mapping, usable with ``register_buffer`` / ``put_from`` / ``get_into``
and with ``torch.frombuffer``. One process-wide table knows the live blocks, so a free of a pointer the
allocator did not hand out (foreign, interior, already freed) changes nothing: ``MooncakeHostMemAllocator.free``
raises ValueError for it, the C free function reports it on stderr. Every function is thread-safe.

C entry points (for ctypes / C callers; the addresses stay valid for the life of the process):
``get_alloc_func_addr()`` -> ``void* alloc(size_t size)`` (NULL on failure) and ``get_free_func_addr()`` ->
``void free(void* ptr)``; in ctypes ``CFUNCTYPE(c_void_p, c_size_t)`` and ``CFUNCTYPE(None, c_void_p)``.
"""

from __future__ import annotations

import ctypes
import logging
import os

_log = logging.getLogger("mooncake.store")

LIBRARY = "_host_memory.so"
ERR_NUMA = -300  # the Transfer Engine's NUMA error code (reference §1, include/error.h)

def _load() -> ctypes.CDLL:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY)
    if not os.path.exists(path):
        raise ImportError(f"mooncake.store: {LIBRARY} is missing next to {__file__} (build //store/client)")
    lib = ctypes.CDLL(path, use_errno=True)
    vp, size_t = ctypes.c_void_p, ctypes.c_size_t
    for name, args, res in (("mc_host_alloc", [size_t], vp), ("mc_host_free", [vp], None),
                            ("mc_host_release", [vp], ctypes.c_int), ("mc_host_block_size", [vp], size_t),
                            ("mc_host_live_blocks", [], size_t),
                            ("mc_host_bind_numa", [ctypes.c_int, ctypes.c_char_p, size_t], ctypes.c_int)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


_lib = _load()  # at import: a missing library is an ImportError, as clients expect of an absent feature


def _int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


class MooncakeHostMemAllocator:
    """Mooncake's host allocator: ``alloc(size) -> int`` address (0 when it fails, with the reason logged) and
    ``free(ptr)``. Instances share one process-wide pool of blocks: any of them (or the C free function) may
    free a block another one allocated."""

    def alloc(self, size: int) -> int:
        """Address of a zero-filled, page-aligned block of at least `size` bytes, or 0 (size < 1, or the kernel
        has no memory for it). TypeError for a non-int size."""
        size = _int("size", size)
        if size < 1 or size >= 1 << 63:
            _log.error("MooncakeHostMemAllocator.alloc: size must be in [1, 2**63), got %d", size)
            return 0
        ptr = _lib.mc_host_alloc(size) or 0
        if not ptr:
            reason = os.strerror(ctypes.get_errno() or 12)  # ENOMEM when the size itself was refused
            _log.error("MooncakeHostMemAllocator.alloc: cannot map %d bytes: %s", size, reason)
        return ptr

    def free(self, ptr: int) -> None:
        """Releases a block alloc returned; 0 is a no-op. ValueError, with nothing freed, for any other pointer
        (not from this allocator, inside a block, or already freed); TypeError for a non-int."""
        ptr = _int("ptr", ptr)
        if ptr == 0:
            return
        if not 0 < ptr < 1 << 64 or _lib.mc_host_release(ptr) != 0:
            raise ValueError(f"MooncakeHostMemAllocator.free: {ptr:#x} is not a block of this allocator (a foreign "
                             "or interior pointer, or one already freed); nothing was freed")

    def block_size(self, ptr: int) -> int:
        """Bytes mapped for the live block starting at `ptr` (`size` rounded up to pages), 0 if there is none."""
        ptr = _int("ptr", ptr)
        return _lib.mc_host_block_size(ptr) if 0 < ptr < 1 << 64 else 0

    def live_blocks(self) -> int:
        """Number of blocks allocated and not yet freed (in this process)."""
        return _lib.mc_host_live_blocks()


def get_alloc_func_addr() -> int:
    """Address of the C function ``void* alloc(size_t size)`` (see the module docstring)."""
    return ctypes.cast(_lib.mc_host_alloc, ctypes.c_void_p).value


def get_free_func_addr() -> int:
    """Address of the C function ``void free(void* ptr)`` (see the module docstring)."""
    return ctypes.cast(_lib.mc_host_free, ctypes.c_void_p).value


def bind_to_numa_node(node: int) -> int:
    """Runs the calling thread (and the threads it starts afterwards) on the CPUs of NUMA node `node` and
    prefers that node for its new memory pages (so later allocations, this allocator's included, land there).
    0 on success; ERR_NUMA (-300) with the reason logged and nothing changed when the node does not exist or
    none of its CPUs can be used. A refused memory policy (e.g. by a container's seccomp profile) keeps the
    CPU binding, is logged as a warning and returns 0. TypeError for a non-int node."""
    node = _int("node", node)
    if not -(1 << 31) <= node < 1 << 31:
        _log.error("bind_to_numa_node: NUMA node %d does not exist", node)
        return ERR_NUMA
    why = ctypes.create_string_buffer(512)
    rc = _lib.mc_host_bind_numa(node, why, len(why))
    if rc < 0:
        _log.error("bind_to_numa_node: %s", why.value.decode(errors="replace"))
        return ERR_NUMA
    if rc > 0:
        _log.warning("bind_to_numa_node(%d): %s", node, why.value.decode(errors="replace"))
    return 0
