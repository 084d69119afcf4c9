"""GpuPath: mooncake.ep's dispatch/combine for tensors in device memory (CUDA, or the host emulation in tests).

Placement: every rank holds a device buffer with the same layout as its host buffer (ep/buffer.py `_Layout`).
Rows (token rows in dispatch, answers in combine) are packed by a kernel into the device send staging, then
  - to a peer on this host that has a device buffer: copied device-to-device into the peer's device buffer,
    mapped through CUDA IPC (the same offsets as in the host layout);
  - to any other peer (another host, or a peer on the CPU path): copied to the host send staging and written by
    the Transfer Engine into the peer's host buffer, from where a GPU receiver copies them to its device buffer.
Dispatch metadata (counts, token ids) and the per-source sequence flags always travel through the host buffers,
so the control flow (ordering, timeouts, `active_ranks`) is the CPU path's own: a flag is written only after
this rank's device copies and Transfer Engine writes completed.

Route: the sender decides. It copies device-to-device to every peer whose device buffer it mapped (same host
key, both published an IPC handle, and cudaIpcOpenMemHandle succeeded), and through the host otherwise; it
states the route in the dispatch metadata, and the receiver fetches host rows accordingly, for that dispatch
and for the combine answers the same sender returns. MC_EP_GPU_IPC=0 publishes no handle (every transfer then
goes through the host buffers, e.g. where containers forbid CUDA IPC). Threading: as Buffer (one caller at a
time).
"""

from __future__ import annotations

import logging
import os
import socket

import numpy as np
import torch

from .. import layout
from .device import D2D, D2H, H2D, DeviceError

_log = logging.getLogger("mooncake.ep")


def host_key() -> str:
    """Processes with the same key can map each other's device memory (same machine, same boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """The kernels load rows 16 bytes at a time: a tensor starting at an odd offset of its storage is copied."""
    return x if x.data_ptr() % 16 == 0 else x.clone()


def _index(values: list | np.ndarray, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64)).to(device)


class GpuPath:
    def __init__(self, buf, device):
        self.buf, self.dev = buf, device
        size = buf._layout.size
        self.base = device.malloc(size)
        self.handle = device.ipc_handle(self.base).hex() if os.environ.get("MC_EP_GPU_IPC", "1") != "0" else None
        self.host = host_key()
        device.host_register(buf._base, size)
        self._peer_base: list[int | None] = [None] * buf.world  # mapped device buffer of each same-host peer
        self._peer_handle: list[str | None] = [None] * buf.world
        self._via_host_from: list[bool] = [True] * buf.world  # route of each source's rows, from its metadata
        self._outputs: dict = {}

    def info(self) -> dict:
        return {"host": self.host, "ipc": self.handle}

    def close(self) -> None:
        for r, ptr in enumerate(self._peer_base):
            if ptr is not None and r != self.buf.rank:
                self.dev.ipc_close(ptr)
        self._peer_base = [None] * self.buf.world
        self.dev.host_unregister(self.buf._base)
        self.dev.free(self.base)

    def connect(self, peers: list[dict]) -> None:
        """Maps the device buffers of same-host peers (again, when a peer was replaced by a new process); a None
        entry (a rank whose record is unknown, hence inactive) maps nothing."""
        for r, peer in enumerate(peers):
            gpu = peer.get("gpu") if peer is not None else None
            if r == self.buf.rank:
                self._peer_base[r], self._peer_handle[r] = self.base, "self"
                continue
            same_host = gpu is not None and gpu["host"] == self.host
            handle = gpu["ipc"] if same_host and self.handle and gpu["ipc"] else None
            if handle == self._peer_handle[r] and self._peer_base[r] is not None:
                continue
            if self._peer_base[r] is not None:
                self.dev.ipc_close(self._peer_base[r])
            self._peer_base[r], self._peer_handle[r] = None, handle
            if handle:
                try:
                    self._peer_base[r] = self.dev.ipc_open(bytes.fromhex(handle))
                except (DeviceError, OSError, ValueError) as e:
                    _log.warning("mooncake.ep: cannot map the device buffer of rank %d (%s); rows to it go through "
                                 "the host buffers", r, e)

    def _direct(self, r: int) -> bool:
        """Whether this rank writes rank r's device buffer directly (else through the host buffers)."""
        return self._peer_base[r] is not None

    def _move(self, targets: list[tuple[int, int, int, int]], region_of) -> dict[int, list]:
        """Sends staged rows: targets = (rank, staging offset, bytes of metadata before the rows, row bytes).
        Device copies are issued and completed here; returns the Transfer Engine writes still to do."""
        writes = {}
        for r, stage, meta, nbytes in targets:
            remote = region_of(r)
            if self._direct(r):
                self.dev.copy(self._peer_base[r] + remote + meta, self.base + stage + meta, nbytes, D2D)
                writes[r] = [(stage, remote, meta)] if meta else []
            else:
                self.dev.copy(self.buf._base + stage + meta, self.base + stage + meta, nbytes, D2H)
                writes[r] = [(stage, remote, meta + nbytes)] if meta + nbytes else []
        self.dev.synchronize()
        return writes

    def _fetch_host_rows(self, source: int, offset: int, nbytes: int) -> None:
        """Rows that came through the host buffer go to the same offset of the device buffer."""
        if nbytes and self._via_host_from[source]:
            self.dev.copy(self.base + offset, self.buf._base + offset, nbytes, H2D)

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, x: torch.Tensor, pairs: list[torch.Tensor], topk: int, t: int, use_fp8: bool, seq: int,
                 deadline: float):
        buf, lay = self.buf, self.buf._layout
        hidden, local = x.shape[1], lay.local
        x = _aligned(x)
        src_rows, dst_offsets, targets = [], [], []
        for r in range(buf.world):
            if not buf._active[r]:
                continue
            stage = lay.send_dispatch + r * lay.region
            token_idx = buf._stage_meta(stage, [pairs[r * local + le] // topk for le in range(local)], t,
                                        via_host=not self._direct(r))
            total = len(token_idx)
            src_rows.append(token_idx.numpy())
            dst_offsets.append(stage + lay.meta + np.arange(total, dtype=np.int64) * lay.row)
            targets.append((r, stage, lay.meta, total * lay.row))
        if targets:
            rows = np.concatenate(src_rows)
            self.dev.pack_rows(x, _index(rows, x.device), _index(np.concatenate(dst_offsets), x.device), hidden,
                               self.base, use_fp8)
        writes = self._move(targets, lambda r: lay.dispatch_region(seq, buf.rank))
        buf._exchange(writes, lay.area(seq, "dispatch_flags"), seq, list(range(buf.world)), deadline)
        return self._collect(seq, t, hidden, use_fp8, x.device)

    def _collect(self, seq: int, t: int, hidden: int, use_fp8: bool, device):
        buf, lay = self.buf, self.buf._layout
        local, slots = lay.local, buf.world * t
        received = buf._received(seq, t)
        src_offsets, dst_rows = [], []
        for s, blocks in received.blocks.items():
            self._via_host_from[s] = received.via_host[s]
            region = lay.dispatch_region(seq, s) + lay.meta
            self._fetch_host_rows(s, region, received.rows[s] * lay.row)
            for le, first, begin, c in blocks:
                src_offsets.append(region + (first + np.arange(c, dtype=np.int64)) * lay.row)
                dst_rows.append(le * slots + begin + np.arange(c, dtype=np.int64))
        key = (seq % 2, use_fp8)
        if key not in self._outputs:
            data_type = torch.float8_e4m3fn if use_fp8 else torch.bfloat16
            scales = torch.empty(local, slots, hidden // layout.FP8_BLOCK, dtype=torch.float32, device=device) \
                if use_fp8 else None
            self._outputs[key] = (torch.empty(local, slots, hidden, dtype=data_type, device=device), scales)
        data, scales = self._outputs[key]
        if src_offsets:
            self.dev.unpack_rows(self.base, _index(np.concatenate(src_offsets), device),
                                 _index(np.concatenate(dst_rows), device), hidden, data, scales, use_fp8)
        recv_x = (data, scales) if use_fp8 else data
        count = torch.tensor(received.begins, dtype=torch.int32).to(device)
        return recv_x, count, (received.src_info.to(device), received.ranges.to(device))

    # ------------------------------------------------------------------ combine

    def combine(self, x: torch.Tensor, pairs: list[torch.Tensor], topk_weights: torch.Tensor, ranges: torch.Tensor,
                owners: list[int], seq: int, deadline: float, out: torch.Tensor | None) -> torch.Tensor:
        buf, lay = self.buf, self.buf._layout
        slots, hidden = x.shape[1], x.shape[2]
        x = _aligned(x.contiguous())
        ranges = ranges.cpu()
        src_rows, dst_offsets, targets = [], [], []
        for s, stage, blocks in buf._answer_plan(ranges):
            n = 0
            for le, begin, c in blocks:
                src_rows.append(le * slots + begin + np.arange(c, dtype=np.int64))
                n += c
            dst_offsets.append(stage + np.arange(n, dtype=np.int64) * lay.row)
            targets.append((s, stage, 0, n * lay.row))
        if targets:
            self.dev.pack_rows(x, _index(np.concatenate(src_rows), x.device),
                               _index(np.concatenate(dst_offsets), x.device), hidden, self.base, False)
        writes = self._move(targets, lambda s: lay.combine_region(seq, buf.rank))
        buf._exchange(writes, lay.area(seq, "combine_flags"), seq, owners, deadline)
        tokens, topk = topk_weights.shape
        slot_offsets = np.full(tokens * topk, -1, dtype=np.int64)
        for r, region, blocks in buf._answers_received(pairs, owners, seq):
            rows = 0
            for chosen, first in blocks:
                slot_offsets[chosen.numpy()] = region + (first + np.arange(len(chosen), dtype=np.int64)) * lay.row
                rows = first + len(chosen)
            self._fetch_host_rows(r, region, rows * lay.row)
        result = out if out is not None else torch.empty(tokens, hidden, dtype=torch.bfloat16, device=x.device)
        self.dev.combine_tokens(self.base, _index(slot_offsets, x.device), topk_weights.contiguous(), hidden, result)
        return result
