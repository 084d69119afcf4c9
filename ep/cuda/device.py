"""The device operations of mooncake.ep's GPU path, behind one small interface with two implementations:

- `CudaDevice`: memory, IPC and copies through the platform layer's cuda platform (mooncake._native.platform,
  transfer_engine/platform/cuda: the driver API, loaded at run time); the kernels (ep_kernels.cu), device
  synchronize and host registration through libmooncake_ep_cuda.so (ctypes).
- `HostEmulatedDevice` (ep/cuda/emulation.py): the same operations on the platform layer's host emulation, a
  stand-in for machines without a GPU so the GPU path's orchestration is tested everywhere. It is an
  emulation, not a GPU.

Interface (all pointers are integer addresses; index arrays are int64 tensors on `torch_device`):
    torch_device                     where recv_x, handles and index arrays live
    stream()                         the stream to run on (the current torch stream)
    malloc(size) -> ptr; free(ptr)   zeroed memory shareable with peer processes on this host
    ipc_handle(ptr) -> bytes         opaque bytes that `ipc_open` in another process maps to the same memory
    ipc_open(handle) -> ptr; ipc_close(ptr)
    copy(dst, src, n, kind)          kind: H2D, D2H or D2D, ordered on stream(); not waited for
    synchronize()                    waits for everything issued on the device (every stream)
    host_register(ptr, n) / host_unregister(ptr)
    pack_rows / unpack_rows / combine_tokens: see ep_kernels.cu
    as_tensor(ptr, size) -> a uint8 tensor on torch_device viewing the memory

Errors: `DeviceError` names the failed call and the runtime's or platform's reason.
"""

from __future__ import annotations

import ctypes
import os

import torch

from .memory import DeviceError, PlatformMemory, native_platform

H2D, D2H, D2D = 1, 2, 3
LIBRARY = "libmooncake_ep_cuda.so"
CU_STREAM_LEGACY = 1  # the driver API's name for the legacy default stream (torch's default stream, handle 0)

__all__ = ["CudaDevice", "CudaUnavailable", "DeviceError", "H2D", "D2H", "D2D", "unavailable_reason"]


class CudaUnavailable(DeviceError):
    """No usable CUDA device: the kernels were not built (no toolkit), the cuda platform is missing or unusable
    (no driver or GPU at run time), or torch has no CUDA."""


_LIB: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    global _LIB
    if _LIB is not None:
        return _LIB
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY)
    if not os.path.exists(path):
        raise CudaUnavailable(f"{LIBRARY} was not built (this build had no CUDA toolkit, or the installed wheel "
                              "is the non-CUDA one)")
    lib = ctypes.CDLL(path)
    vp, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    signatures = {
        "mc_ep_pack_rows": [vp, vp, vp, i64, c_int, vp, c_int, vp],
        "mc_ep_unpack_rows": [vp, vp, vp, i64, c_int, vp, vp, c_int, vp],
        "mc_ep_combine_tokens": [vp, vp, vp, i64, c_int, c_int, vp, vp],
        "mc_ep_set_device": [c_int],
        "mc_ep_device_sync": [],
        "mc_ep_host_register": [vp, ctypes.c_size_t],
        "mc_ep_host_unregister": [vp],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, c_int
    lib.mc_ep_error_string.argtypes, lib.mc_ep_error_string.restype = [c_int], ctypes.c_char_p
    _LIB = lib
    return lib


def cuda_platform():
    """The cuda platform of mooncake._native.platform; CudaUnavailable saying why there is none."""
    try:
        return native_platform("cuda")
    except ImportError as e:
        raise CudaUnavailable(f"the Transfer Engine extension mooncake._native does not import ({e}); install a "
                              "mooncake wheel, or build it for this Python with ci/build_native.sh") from e
    except KeyError as e:
        raise CudaUnavailable("this installation has no cuda platform plugin (libmc_platform_cuda.so in "
                              "mooncake/_plugins/ or an MC_PLUGIN_DIR folder): the non-CUDA wheel, or a source "
                              "tree without the plugin") from e


def unavailable_reason() -> str | None:
    """None when CUDA kernels can run here; otherwise why not (used to skip GPU checks with a clear reason)."""
    try:
        _library()
        platform = cuda_platform()
    except (CudaUnavailable, OSError) as e:
        return str(e)
    probe = platform.probe()
    if not probe["usable"]:
        return f"no CUDA device: the cuda platform says: {probe['reason']}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has no CUDA support (CPU wheel)"
    return None


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class CudaDevice:
    """The GPU path's operations on CUDA device `torch_device` (one per Buffer)."""

    def __init__(self, torch_device: torch.device):
        reason = unavailable_reason()
        if reason:
            raise CudaUnavailable(f"mooncake.ep: CUDA tensors given, but {reason}")
        self.torch_device = torch_device
        self.index = torch_device.index if torch_device.index is not None else torch.cuda.current_device()
        self._lib = _library()
        self._memory = PlatformMemory(cuda_platform(), self.index)

    def _check(self, err: int, what: str) -> None:
        if err:
            raise DeviceError(f"mooncake.ep: {what} failed: {self._lib.mc_ep_error_string(err).decode()} ({err})")

    def _enter(self) -> None:
        self._check(self._lib.mc_ep_set_device(self.index), f"cudaSetDevice({self.index})")

    def stream(self) -> int:
        return torch.cuda.current_stream(self.torch_device).cuda_stream

    def malloc(self, size: int) -> int:
        """Zeroed before it returns: no later copy on any stream (or from a peer) can be overtaken by the zeroing."""
        ptr = self._memory.malloc(size)
        try:
            self.as_tensor(ptr, size).zero_()
            self.synchronize()
        except Exception:
            self._memory.free(ptr)
            raise
        return ptr

    def free(self, ptr: int) -> None:
        self._memory.free(ptr)

    def ipc_handle(self, ptr: int) -> bytes:
        return self._memory.ipc_handle(ptr)

    def ipc_open(self, handle: bytes) -> int:
        return self._memory.ipc_open(handle)

    def ipc_close(self, ptr: int) -> None:
        self._memory.ipc_close(ptr)

    def copy(self, dst: int, src: int, n: int, kind: int) -> None:
        """Enqueued on the current torch stream (the legacy default stream when that is torch's default one);
        the platform infers the direction from the addresses, `kind` states it for the reader."""
        if kind not in (H2D, D2H, D2D):
            raise ValueError(f"kind must be H2D, D2H or D2D, got {kind!r}")
        self._memory.copy(dst, src, n, self.stream() or CU_STREAM_LEGACY, False)

    def synchronize(self) -> None:
        """Waits for the whole device, not only the current stream: a caller may run consecutive calls on
        different streams, and a kernel of an earlier call must not still read a region a peer may now reuse."""
        self._enter()
        self._check(self._lib.mc_ep_device_sync(), "cudaDeviceSynchronize")

    def host_register(self, ptr: int, n: int) -> None:
        self._enter()
        self._check(self._lib.mc_ep_host_register(ptr, n), "cudaHostRegister")

    def host_unregister(self, ptr: int) -> None:
        self._enter()
        self._check(self._lib.mc_ep_host_unregister(ptr), "cudaHostUnregister")

    def as_tensor(self, ptr: int, size: int) -> torch.Tensor:
        class _Memory:  # torch.as_tensor understands __cuda_array_interface__ (no copy)
            __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3}
        return torch.as_tensor(_Memory(), device=self.torch_device)

    def pack_rows(self, x: torch.Tensor, src_rows: torch.Tensor, dst_offsets: torch.Tensor, hidden: int, base: int,
                  fp8: bool) -> None:
        self._enter()
        self._check(self._lib.mc_ep_pack_rows(_ptr(x), _ptr(src_rows), _ptr(dst_offsets), src_rows.numel(), hidden,
                                              base, int(fp8), self.stream()), "pack_rows kernel")

    def unpack_rows(self, base: int, src_offsets: torch.Tensor, dst_rows: torch.Tensor, hidden: int,
                    out_data: torch.Tensor, out_scales: torch.Tensor | None, fp8: bool) -> None:
        self._enter()
        scales = _ptr(out_scales) if out_scales is not None else None
        self._check(self._lib.mc_ep_unpack_rows(base, _ptr(src_offsets), _ptr(dst_rows), src_offsets.numel(), hidden,
                                                _ptr(out_data), scales, int(fp8), self.stream()), "unpack_rows kernel")

    def combine_tokens(self, base: int, slot_offsets: torch.Tensor, weights: torch.Tensor, hidden: int,
                       out: torch.Tensor) -> None:
        self._enter()
        tokens, topk = weights.shape
        self._check(self._lib.mc_ep_combine_tokens(base, _ptr(slot_offsets), _ptr(weights), tokens, topk, hidden,
                                                   _ptr(out), self.stream()), "combine_tokens kernel")
