"""HostEmulatedDevice: an EMULATION of the GPU path's device (ep/cuda/device.py interface) on host memory.

It exists so the GPU path's orchestration (layouts, offsets, which bytes go where, IPC mapping of peers,
failures) runs in tests on machines without a GPU. It is not a GPU and is never chosen for real tensors:
a Buffer uses it only when MC_EP_EMULATE_GPU=1 is set (tests do that).

"Device memory" is a memfd mapping; its "IPC handle" names (pid, fd), and a peer on this host maps it through
/proc/<pid>/fd/<fd> (needs the same rights as reading that process's fds: same user, or root). The kernels are
the same operations written with torch on CPU; copies are memmoves; there is no asynchrony.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

import torch

from .. import layout

_HANDLE = struct.Struct("<8sii")
_MAGIC = b"MCEPEMU1"


class HostEmulatedDevice:
    torch_device = torch.device("cpu")

    def __init__(self):
        self._maps: dict[int, tuple[mmap.mmap, int | None]] = {}  # address -> (mapping, owned memfd)

    @staticmethod
    def _address(m: mmap.mmap) -> int:
        return ctypes.addressof(ctypes.c_char.from_buffer(m))

    def stream(self) -> int:
        return 0

    def malloc(self, size: int) -> int:
        fd = os.memfd_create("mooncake-ep-emulated-gpu")
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size)
        addr = self._address(m)
        self._maps[addr] = (m, fd)
        return addr

    def free(self, ptr: int) -> None:
        self._unmap(ptr)

    def _unmap(self, ptr: int) -> None:
        m, fd = self._maps.pop(ptr)
        try:
            m.close()
        except BufferError:
            pass  # a tensor still views it; the mapping goes with the last view
        if fd is not None:
            os.close(fd)

    def ipc_handle(self, ptr: int) -> bytes:
        _, fd = self._maps[ptr]
        return _HANDLE.pack(_MAGIC, os.getpid(), fd).ljust(64, b"\0")

    def ipc_open(self, handle: bytes) -> int:
        if os.environ.get("MC_EP_EMULATE_IPC_OPEN_FAILS") == "1":  # tests: as cudaIpcOpenMemHandle may
            raise OSError("emulated IPC open failure")
        magic, pid, fd = _HANDLE.unpack_from(handle)
        if magic != _MAGIC:
            raise ValueError("not an emulated-device IPC handle")
        with open(f"/proc/{pid}/fd/{fd}", "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
        addr = self._address(m)
        self._maps[addr] = (m, None)
        return addr

    def ipc_close(self, ptr: int) -> None:
        self._unmap(ptr)

    def copy(self, dst: int, src: int, n: int, kind: int) -> None:
        if n:
            ctypes.memmove(dst, src, n)

    def synchronize(self) -> None:
        return None

    def host_register(self, ptr: int, n: int) -> None:
        return None

    def host_unregister(self, ptr: int) -> None:
        return None

    def as_tensor(self, ptr: int, size: int) -> torch.Tensor:
        return torch.frombuffer((ctypes.c_uint8 * size).from_address(ptr), dtype=torch.uint8)

    @staticmethod
    def _rows(base: int, offsets: torch.Tensor, nbytes: int) -> list[torch.Tensor]:
        return [torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(base + int(o)), dtype=torch.uint8)
                for o in offsets.tolist()]

    def pack_rows(self, x: torch.Tensor, src_rows: torch.Tensor, dst_offsets: torch.Tensor, hidden: int, base: int,
                  fp8: bool) -> None:
        if not src_rows.numel():
            return
        gathered = x.reshape(-1, hidden).index_select(0, src_rows)
        if fp8:
            data, scales = layout.quantize_fp8(gathered)
            packed = torch.cat([data.view(torch.uint8), scales.view(torch.uint8).view(len(src_rows), -1)], dim=1)
        else:
            packed = gathered.view(torch.uint8)
        for row, dst in zip(packed, self._rows(base, dst_offsets, packed.shape[1])):
            dst.copy_(row)

    def unpack_rows(self, base: int, src_offsets: torch.Tensor, dst_rows: torch.Tensor, hidden: int,
                    out_data: torch.Tensor, out_scales: torch.Tensor | None, fp8: bool) -> None:
        groups = hidden // layout.FP8_BLOCK
        width = hidden + 4 * groups if fp8 else 2 * hidden
        data = out_data.view(-1, hidden).view(torch.uint8)
        for src, row in zip(self._rows(base, src_offsets, width), dst_rows.tolist()):
            data[row] = src[:data.shape[1]]
            if fp8:
                out_scales.view(-1, groups)[row] = src[hidden:].view(torch.float32)

    def combine_tokens(self, base: int, slot_offsets: torch.Tensor, weights: torch.Tensor, hidden: int,
                       out: torch.Tensor) -> None:
        tokens, topk = weights.shape
        offsets = slot_offsets.view(tokens, topk).tolist()
        for t in range(tokens):
            acc = torch.zeros(hidden, dtype=torch.float32)
            for k, off in enumerate(offsets[t]):
                if off >= 0:
                    row = self._rows(base, torch.tensor([off]), 2 * hidden)[0].view(torch.bfloat16)
                    acc += float(weights[t, k]) * row.float()
            out[t] = acc.to(torch.bfloat16)
