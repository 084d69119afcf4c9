"""HostEmulatedDevice: an EMULATION of the GPU path's device (ep/cuda/device.py interface) on host memory.

It exists so the GPU path's orchestration (layouts, offsets, which bytes go where, IPC mapping of peers,
failures) runs in tests on machines without a GPU. It is not a GPU and is never chosen for real tensors:
a Buffer uses it only when MC_EP_EMULATE_GPU=1 is set (tests do that).

Memory, IPC and copies are the platform layer's host emulation (`host_emulation` of mooncake._native.platform,
transfer_engine/platform/host_emulation): "device" memory is a memfd mapping classified as cuda:0, its IPC
handle is mapped by a peer on this host through pidfd_getfd or /proc/<pid>/fd (same user, or root), and copies
run on the platform's workers; each copy is waited for (on the platform's own stream: nothing is left in
flight). Creating a HostEmulatedDevice enables that platform in this process (as MC_PLATFORM_EMULATION=1
would). The kernels are the same operations written with torch on CPU. Test hook: MC_EP_EMULATE_IPC_OPEN_FAILS=1
makes ipc_open fail (as cudaIpcOpenMemHandle may).
"""

from __future__ import annotations

import ctypes
import os

import torch

from .. import layout
from .memory import PlatformMemory, native_platform


def _host_emulation():
    """The host_emulation platform of this process, enabled (by MC_PLATFORM_EMULATION=1, else here)."""
    p = native_platform("host_emulation")
    if not p.probe()["usable"]:
        from mooncake._native import platform
        platform.enable_host_emulation()
        p = platform.get("host_emulation")
    return p


class HostEmulatedDevice:
    torch_device = torch.device("cpu")

    def __init__(self):
        self._memory = PlatformMemory(_host_emulation(), 0)

    def stream(self) -> int:
        return 0

    def malloc(self, size: int) -> int:
        return self._memory.malloc(size)

    def free(self, ptr: int) -> None:
        self._memory.free(ptr)

    def ipc_handle(self, ptr: int) -> bytes:
        return self._memory.ipc_handle(ptr)

    def ipc_open(self, handle: bytes) -> int:
        if os.environ.get("MC_EP_EMULATE_IPC_OPEN_FAILS") == "1":  # tests: as cudaIpcOpenMemHandle may
            raise OSError("emulated IPC open failure")
        return self._memory.ipc_open(handle)

    def ipc_close(self, ptr: int) -> None:
        self._memory.ipc_close(ptr)

    def copy(self, dst: int, src: int, n: int, kind: int) -> None:
        self._memory.copy(dst, src, n, 0, True)

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
