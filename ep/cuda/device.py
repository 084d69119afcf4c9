"""The device operations of mooncake.ep's GPU path, behind one small interface with two implementations:

- `CudaDevice`: the CUDA kernels and runtime calls of libmooncake_ep_cuda.so (ep_kernels.cu), through ctypes.
- `HostEmulatedDevice` (ep/cuda/emulation.py): the same operations on host memory, a stand-in for machines
  without a GPU so the GPU path's orchestration is tested everywhere. It is an emulation, not a GPU.

Interface (all pointers are integer addresses; index arrays are int64 tensors on `torch_device`):
    torch_device                     where recv_x, handles and index arrays live
    stream()                         the stream to run on (the current torch stream)
    malloc(size) -> ptr; free(ptr)   zeroed memory shareable with peer processes on this host
    ipc_handle(ptr) -> bytes         64 bytes that `ipc_open` in another process maps to the same memory
    ipc_open(handle) -> ptr; ipc_close(ptr)
    copy(dst, src, n, kind)          kind: H2D, D2H or D2D, ordered on stream()
    synchronize()                    waits for everything issued on the device (every stream)
    host_register(ptr, n) / host_unregister(ptr)
    pack_rows / unpack_rows / combine_tokens: see ep_kernels.cu
    as_tensor(ptr, size) -> a uint8 tensor on torch_device viewing the memory

Errors: `DeviceError` names the failed call and the runtime's reason.
"""

from __future__ import annotations

import ctypes
import os

import torch

H2D, D2H, D2D = 1, 2, 3
LIBRARY = "libmooncake_ep_cuda.so"


class DeviceError(RuntimeError):
    pass


class CudaUnavailable(DeviceError):
    """No usable CUDA device: the library was not built (no toolkit), or no driver or GPU at run time."""


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
        "mc_ep_device_count": [ctypes.POINTER(c_int)],
        "mc_ep_set_device": [c_int],
        "mc_ep_malloc": [ctypes.POINTER(vp), ctypes.c_size_t],
        "mc_ep_free": [vp],
        "mc_ep_ipc_handle": [vp, ctypes.c_char_p],
        "mc_ep_ipc_open": [ctypes.c_char_p, ctypes.POINTER(vp)],
        "mc_ep_ipc_close": [vp],
        "mc_ep_memcpy_async": [vp, vp, ctypes.c_size_t, c_int, vp],
        "mc_ep_stream_sync": [vp],
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


def unavailable_reason() -> str | None:
    """None when CUDA kernels can run here; otherwise why not (used to skip GPU checks with a clear reason)."""
    try:
        lib = _library()
    except (CudaUnavailable, OSError) as e:
        return str(e)
    count = ctypes.c_int(0)
    err = lib.mc_ep_device_count(ctypes.byref(count))
    if err:
        return f"no CUDA device: cudaGetDeviceCount failed with {lib.mc_ep_error_string(err).decode()} ({err})"
    if count.value == 0:
        return "no CUDA device: cudaGetDeviceCount found 0 devices"
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

    def _check(self, err: int, what: str) -> None:
        if err:
            raise DeviceError(f"mooncake.ep: {what} failed: {self._lib.mc_ep_error_string(err).decode()} ({err})")

    def _enter(self) -> None:
        self._check(self._lib.mc_ep_set_device(self.index), f"cudaSetDevice({self.index})")

    def stream(self) -> int:
        return torch.cuda.current_stream(self.torch_device).cuda_stream

    def malloc(self, size: int) -> int:
        self._enter()
        ptr = ctypes.c_void_p()
        self._check(self._lib.mc_ep_malloc(ctypes.byref(ptr), size), f"cudaMalloc({size})")
        return ptr.value

    def free(self, ptr: int) -> None:
        self._enter()
        self._check(self._lib.mc_ep_free(ptr), "cudaFree")

    def ipc_handle(self, ptr: int) -> bytes:
        self._enter()
        out = ctypes.create_string_buffer(64)
        self._check(self._lib.mc_ep_ipc_handle(ptr, out), "cudaIpcGetMemHandle")
        return out.raw

    def ipc_open(self, handle: bytes) -> int:
        self._enter()
        ptr = ctypes.c_void_p()
        self._check(self._lib.mc_ep_ipc_open(handle, ctypes.byref(ptr)), "cudaIpcOpenMemHandle")
        return ptr.value

    def ipc_close(self, ptr: int) -> None:
        self._enter()
        self._check(self._lib.mc_ep_ipc_close(ptr), "cudaIpcCloseMemHandle")

    def copy(self, dst: int, src: int, n: int, kind: int) -> None:
        self._enter()
        self._check(self._lib.mc_ep_memcpy_async(dst, src, n, kind, self.stream()), "cudaMemcpyAsync")

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
