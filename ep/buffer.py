"""mooncake.ep.Buffer: MoE dispatch/combine in DeepEP's low-latency shapes, over the Transfer Engine, with
`active_ranks` fault tolerance.

Data path: every rank owns one engine-allocated buffer (shared memory for peers on this host, TCP otherwise)
holding its receive slots and send staging. A call writes each peer's slots one-sidedly, then a per-source
sequence number into the peer's flag array (a WRITE completes only after the bytes landed, so a flag always
follows its data), and finally polls its own flags. No collective of the process group runs on the hot path.

Set-up (ep/peers.py): constructing a Buffer is collective over the group: the ranks trade mailbox addresses
through the group's store, waiting for each other up to the store's timeout. The first dispatch sizes and
registers the buffer and trades its address through the mailboxes, not the store, so a rank that exits after
constructing its Buffer, even the one hosting the store, only becomes an inactive rank.

Failures: waiting for a rank is bounded by `timeout_us` (-1: 10 s), the first dispatch's wait for the peers'
records included; a rank that does not deliver in time, or whose memory cannot be written, is set to 0 in
`active_ranks` and skipped by later calls without waiting.
Inactive ranks' tokens are neither sent nor received; in combine, experts on inactive ranks contribute
nothing (the remaining top-k weights are not renormalised). `update_ep_member()` re-reads the peers'
registrations (through the store, which it needs) and re-activates ranks that answer again, including a
replacement process that took over a lost rank (its Buffers created in the same order as on the other ranks).
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
import logging
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from . import layout
from . import peers

_log = logging.getLogger("mooncake.ep")
_BUFFER_IDS = itertools.count()
_ENGINE = None  # mooncake.engine.TransferEngine, created on first use
DEFAULT_TIMEOUT_US = 10_000_000
_ITEMSIZE = {torch.uint8: 1, torch.int32: 4, torch.int64: 8, torch.bfloat16: 2, torch.float32: 4,
             torch.float8_e4m3fn: 1}
ALIGN = 64


def _engine():
    """One Transfer Engine per process, shared by every Buffer (P2P handshake; MC_EP_LOCAL_HOSTNAME names the
    address peers use, 127.0.0.1 by default; MC_EP_PROTOCOL the preferred protocol, by default none: the engine
    installs every usable transport and picks the best path per peer; MC_EP_DEVICE the NIC allow-list, the
    engine's device_name: "" = all)."""
    global _ENGINE
    if _ENGINE is None:
        from mooncake.engine import TransferEngine  # the native extension loads only when a Buffer is made
        engine = TransferEngine()
        host = os.environ.get("MC_EP_LOCAL_HOSTNAME", "127.0.0.1")
        protocol = os.environ.get("MC_EP_PROTOCOL", "")
        if engine.initialize(host, "P2PHANDSHAKE", protocol, os.environ.get("MC_EP_DEVICE", "")) != 0:
            raise RuntimeError(f"mooncake.ep: cannot start the Transfer Engine on {host} (see the log above)")
        _ENGINE = engine
    return _ENGINE


def _emulate_gpu() -> bool:
    """MC_EP_EMULATE_GPU=1 (tests only): CPU tensors take the GPU path on an emulated device."""
    return os.environ.get("MC_EP_EMULATE_GPU") == "1"


def _make_device(device: torch.device):
    if device.type == "cuda":
        from .cuda.device import CudaDevice
        return CudaDevice(device)
    from .cuda.emulation import HostEmulatedDevice
    return HostEmulatedDevice()


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclasses.dataclass
class _Received:
    """What the sources of one dispatch sent: DeepEP's src_info and layout ranges, the rows per local expert
    (begins), and per active source its row blocks (local expert, first row in its region, first output row,
    count), row total and route (via_host: its rows, and later its combine answers, came through the host
    buffers)."""

    src_info: torch.Tensor
    ranges: torch.Tensor
    begins: list[int]
    blocks: dict[int, list[tuple[int, int, int, int]]]
    rows: dict[int, int]
    via_host: dict[int, bool]


class EventOverlap:
    """DeepEP's event handle. The CPU path completes before returning, so waiting is a no-op."""

    def __init__(self, event=None):
        self.event = event

    def current_stream_wait(self) -> None:
        return None


class _Layout:
    """Byte offsets inside one rank's buffer (identical on every rank).

    Dispatch area, per source rank: [counts int32[L] | token ids int32[L*T] | route int32 | rows [L*T, row]],
    the rows of local expert 0, then 1, ... packed, so a source fills a peer's area with a single write (the
    route says whether the rows came through this host buffer or straight into the GPU buffer). Combine area, per
    owner rank: the answers for the rows this rank sent to that owner, in the same packed order.
    Receive areas are double-buffered by call parity: a fast peer may start call k+1 (writing parity k+1)
    while this rank still reads call k; it cannot start k+2 before this rank's signal for k+1, which is sent
    only after call k returned.
    """

    def __init__(self, world: int, local_experts: int, tokens: int, hidden: int):
        self.world, self.local, self.tokens, self.hidden = world, local_experts, tokens, hidden
        self.row = 2 * hidden  # a bf16 row; an fp8 row (hidden + hidden/32 bytes) fits in it
        self.route = 4 * local_experts * (1 + tokens)  # int32: 1 = the rows are in the host buffer (GPU path)
        self.meta = _align(self.route + 4)
        self.region = self.meta + local_experts * tokens * self.row  # one source's dispatch area
        self.answers = local_experts * tokens * self.row  # one owner's combine area
        off = 0
        self._recv = []
        for _ in range(2):
            area = {}
            area["dispatch_flags"] = off
            off += _align(8 * world)
            area["combine_flags"] = off
            off += _align(8 * world)
            area["dispatch"] = off
            off += world * self.region
            area["combine"] = off
            off += world * self.answers
            self._recv.append(area)
        self.send_dispatch = off  # per target: a dispatch area as the target will hold it
        off += world * self.region
        self.send_combine = off  # per source: its answers
        off += world * self.answers
        self.send_flag = off  # one int64 holding the current sequence number
        off += ALIGN
        self.size = off

    def area(self, seq: int, name: str) -> int:
        return self._recv[seq % 2][name]

    def dispatch_region(self, seq: int, source: int) -> int:
        return self.area(seq, "dispatch") + source * self.region

    def combine_region(self, seq: int, owner: int) -> int:
        return self.area(seq, "combine") + owner * self.answers


class Buffer:
    """Dispatch/combine buffer for one expert-parallel group.

    Arguments:
        group: the process group of the EP ranks (any backend; used only to learn ranks and for its store).
            Every rank of the group constructs its Buffers in the same order; a constructor waits, up to the
            store's timeout, for the other ranks' constructors (a rank that does not come starts inactive).
        num_ep_buffer_bytes: accepted for compatibility; the buffer is sized at the first dispatch from the
            actual token capacity, hidden size and expert count.
    Raises RuntimeError when the store cannot be reached before any peer's address was learnt.

    Attributes: group; rank (this rank in the group); group_size (the number of ranks, the name
    DeepEP's and Mooncake's Buffer use and SGLang reads); num_ep_buffer_bytes as given.
    """

    def __init__(self, group, num_ep_buffer_bytes: int = 0, disable_p2p: bool = False):
        if not dist.is_initialized():
            raise RuntimeError("mooncake.ep.Buffer needs torch.distributed to be initialized")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.num_ep_buffer_bytes = num_ep_buffer_bytes
        self._id = next(_BUFFER_IDS)
        self._store = dist.distributed_c10d._get_default_store()
        self._engine = _engine()
        self._shape: tuple | None = None
        self._layout: _Layout | None = None
        self._base = 0
        self._mem: torch.Tensor | None = None  # the whole registered buffer as bytes
        self._outputs: dict = {}  # (parity, fp8) -> reusable recv_x tensors
        self._peers: list[dict | None] = []  # per rank its buffer record, None while unknown (rank inactive)
        self._active = torch.ones(self.world, dtype=torch.int32)
        self._dispatch_seq = 0
        self._combine_seq = 0
        self._epoch = 0
        self._gpu = None  # GpuPath when the Buffer was set up with device tensors
        self._mailbox = peers.Mailbox(self._engine, self.world, self.rank)
        deadline = time.monotonic() + self._store.timeout.total_seconds()
        self._introductions = peers.introduce(
            self._store, f"mooncake_ep/{self._id}", self.rank, self.world,
            {"segment": self._engine.get_local_segment_name(), "mailbox": self._mailbox.base}, deadline)
        for r in range(self.world):
            if r not in self._introductions:
                self._active[r] = 0

    @property
    def group_size(self) -> int:
        return self.world

    # ------------------------------------------------------------------ sizing and connection

    @staticmethod
    def get_ep_buffer_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                num_experts: int) -> int:
        """DeepEP/Mooncake's hint: 4*E*4 + 4*E*T*(32 + 2*hidden) bytes (num_ranks unused)."""
        e, t = num_experts, num_max_dispatch_tokens_per_rank
        return 4 * e * 4 + 4 * e * t * (32 + 2 * hidden)

    def _set_up(self, tokens: int, hidden: int, num_experts: int, device: torch.device) -> bool:
        """Sizes and registers the buffer for this shape and device kind on first use (False: it already was;
        ValueError for another shape or device). The peers' records are learnt by the caller."""
        shape = (tokens, hidden, num_experts)
        if self._shape == shape:
            if (self._gpu is not None) != (device.type != "cpu" or _emulate_gpu()) or \
                    (self._gpu is not None and device != self._gpu.dev.torch_device):
                raise ValueError(f"this Buffer was set up for tensors on "
                                 f"{self._gpu.dev.torch_device if self._gpu else 'cpu'}, got {device}")
            return False
        if self._shape is not None:
            raise ValueError(f"this Buffer was set up for (tokens, hidden, experts) = {self._shape}; "
                             f"create another Buffer for {shape}")
        lay = _Layout(self.world, num_experts // self.world, tokens, hidden)
        base = self._engine.allocate_managed_buffer(lay.size)
        if base == 0:
            raise RuntimeError(f"mooncake.ep: cannot allocate {lay.size} bytes of registered memory")
        ctypes.memset(base, 0, lay.size)
        self._shape, self._layout, self._base = shape, lay, base
        self._mem = torch.frombuffer((ctypes.c_uint8 * lay.size).from_address(base), dtype=torch.uint8)
        if device.type == "cuda" or _emulate_gpu():
            from .cuda.path import GpuPath  # imported on first use: the CPU path needs no device code
            try:
                self._gpu = GpuPath(self, _make_device(device))
            except Exception:
                self._shape = self._layout = None  # nothing was published: a later call may try again
                raise
        own = {"segment": self._engine.get_local_segment_name(), "base": self._base, "shape": list(shape)}
        if self._gpu is not None:
            own["gpu"] = self._gpu.info()
        self._peers = [None] * self.world
        self._peers[self.rank] = own
        return True

    def _connect(self, tokens: int, hidden: int, num_experts: int, device: torch.device, deadline: float) -> None:
        """The first dispatch's set-up: registers the buffer and trades records with the active peers through
        their mailboxes until `deadline`; a peer whose record does not come (or is for another shape), or that
        cannot be written to, becomes inactive."""
        if not self._set_up(tokens, hidden, num_experts, device):
            return
        own = self._peers[self.rank]
        targets = {r: self._introductions[r] for r in range(self.world) if r != self.rank and self._active[r]}
        records: dict[int, dict] = {}
        try:
            records, _ = self._mailbox.exchange(own, targets, deadline)
        finally:  # even when the exchange raised: a rank without a record is inactive
            for r in targets:
                rec = records.get(r)
                if rec is not None and rec.get("shape") != own["shape"]:
                    _log.error("mooncake.ep: rank %d set this Buffer up for (tokens, hidden, experts) = %s, this "
                               "rank for %s; it is left inactive", r, rec.get("shape"), own["shape"])
                    rec = None
                self._peers[r] = rec
                if rec is None:
                    self._active[r] = 0
        if self._gpu is not None:
            self._gpu.connect(self._peers)

    def _sync_key(self, rank: int) -> str:
        return f"mooncake_ep/{self._id}/sync/{self._epoch}/{rank}"

    def _synced_key(self, rank: int) -> str:
        return f"mooncake_ep/{self._id}/synced/{rank}"  # the last update_ep_member round `rank` completed

    def update_ep_member(self, timeout_s: float = 10.0) -> None:
        """Collective over the ranks that are alive: re-reads the registrations of the ranks that take part,
        re-activates them, and aligns the call counters (a rank that was stalled may be behind). Ranks that do
        not call it within `timeout_s` stay inactive. It needs the group's store: raises
        mooncake.ep.peers.StoreUnreachable (a RuntimeError) when the store does not answer.

        A Buffer that has not dispatched yet first takes the shape and device kind its peers were set up for and
        registers its memory: this is how a replacement process (creating its Buffers in the same order as the
        other ranks) takes over a lost rank."""
        deadline = time.monotonic() + timeout_s
        # The round is one past the last one any rank completed: no rank completes the round this rank joins
        # before this rank's record is in (or it gave up waiting for it), so every caller picks the same round,
        # including a fresh Buffer that took part in none of the earlier ones.
        synced = peers.poll_store(self._store, {r: self._synced_key(r) for r in range(self.world)}, 0)
        self._epoch = max([self._epoch, *synced.values()]) + 1
        if self._layout is None:
            self._store_set(self._sync_key(self.rank), {"shape": None})
            peer = self._peer_setup(deadline)
            if peer is not None:
                device = torch.device("cuda", torch.cuda.current_device()) if peer["device"] == "cuda" \
                    else torch.device("cpu")
                self._set_up(*peer["shape"], device)
        if self._layout is not None:
            device = self._gpu.dev.torch_device.type if self._gpu is not None else "cpu"
            self._store_set(self._sync_key(self.rank), {**self._peers[self.rank], "device": device,
                                                        "seq": [self._dispatch_seq, self._combine_seq]})
            records = self._peer_records(deadline)
            for r in range(self.world):
                if r in records:
                    self._peers[r] = records[r]  # a replacement process registered new memory
                self._active[r] = 1 if r in records else 0
            if self._gpu is not None:
                self._gpu.connect(self._peers)
            self._dispatch_seq = max(rec["seq"][0] for rec in records.values())
            self._combine_seq = max(rec["seq"][1] for rec in records.values())
        self._store_set(self._synced_key(self.rank), self._epoch)

    def _store_set(self, key: str, value) -> None:
        try:
            self._store.set(key, json.dumps(value))
        except RuntimeError as e:
            raise peers.StoreUnreachable(e, {}) from e

    def _peer_setup(self, deadline: float) -> dict | None:
        """The record of a peer in this round that is set up; None when no rank is (or none said so in time)."""
        records = peers.poll_store(self._store, {r: self._sync_key(r) for r in range(self.world)}, deadline,
                                    enough=lambda got: any(rec["shape"] is not None for rec in got.values()))
        return next((rec for rec in records.values() if rec["shape"] is not None), None)

    def _peer_records(self, deadline: float) -> dict[int, dict]:
        """The records of the ranks in this round set up for this Buffer's shape (their memory is registered)."""
        return peers.poll_store(self._store, {r: self._sync_key(r) for r in range(self.world)}, deadline,
                                 accept=lambda rec: rec["shape"] == list(self._shape))

    # ------------------------------------------------------------------ helpers

    def _view(self, offset: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
        n = int(np.prod(shape)) * _ITEMSIZE[dtype]
        return self._mem[offset:offset + n].view(dtype).view(shape)

    def _flags(self, offset: int) -> np.ndarray:
        return np.ctypeslib.as_array((ctypes.c_int64 * self.world).from_address(self._base + offset))

    def _resolve_active(self, active_ranks) -> torch.Tensor:
        """Folds the caller's mask into the Buffer's: a rank the caller deactivated stays off until
        update_ep_member(). A mask longer than the group is accepted when its extra slots are 0 (SGLang's
        elastic-EP mask, sized by --max-ep-size, reserves slots for ranks that have not joined yet)."""
        if active_ranks is None:
            return self._active
        if not isinstance(active_ranks, torch.Tensor) or active_ranks.dtype != torch.int32:
            raise TypeError("active_ranks must be an int32 tensor of shape [num_ranks]")
        if active_ranks.dim() != 1 or active_ranks.shape[0] < self.world:
            raise ValueError(f"active_ranks must have shape [{self.world}], got {list(active_ranks.shape)}")
        mask = active_ranks.cpu()
        if mask[self.world:].any():
            raise ValueError(f"active_ranks marks slots past this group's {self.world} ranks active "
                             f"({mask.tolist()}): this Buffer knows only ranks 0..{self.world - 1}; "
                             f"create a new Buffer for the grown group")
        self._active &= mask[:self.world]
        return self._active

    def _report_active(self, active_ranks) -> None:
        """Writes the ranks found inactive back into the caller's mask (its first num_ranks slots)."""
        if active_ranks is not None and active_ranks is not self._active:
            active_ranks[:self.world].copy_(self._active)

    def _send(self, writes: dict[int, list[tuple[int, int, int]]], deadline: float) -> None:
        """Writes (local offset, remote offset, length) lists to each rank; ranks whose writes fail or do not
        finish by the deadline are deactivated."""
        batches = {}
        for r, items in writes.items():
            if items and self._active[r]:
                peer = self._peers[r]
                batches[r] = (peer["segment"], [self._base + lo for lo, _, _ in items],
                              [peer["base"] + ro for _, ro, _ in items], [n for _, _, n in items])
        for r in peers.write_batches(self._engine, batches, deadline):
            self._active[r] = 0

    def _signal(self, flag_offset: int, seq: int, targets: list[int], deadline: float) -> None:
        self._view(self._layout.send_flag, torch.int64, (1,))[0] = seq
        self._send({r: [(self._layout.send_flag, flag_offset + 8 * self.rank, 8)] for r in targets}, deadline)

    def _wait(self, flag_offset: int, seq: int, sources: list[int], deadline: float) -> None:
        flags = self._flags(flag_offset)
        pending = [s for s in sources if self._active[s]]
        spins = 0
        while pending:
            pending = [s for s in pending if flags[s] != seq and self._active[s]]
            if not pending:
                return
            if time.monotonic() > deadline:
                for s in pending:
                    self._active[s] = 0
                return
            spins += 1
            if spins > 200:
                time.sleep(20e-6)

    @staticmethod
    def _deadline(timeout_us: int) -> float:
        return time.monotonic() + (DEFAULT_TIMEOUT_US if timeout_us is None or timeout_us < 0 else timeout_us) / 1e6

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, active_ranks, num_max_dispatch_tokens_per_rank: int,
                 num_experts: int, timeout_us: int = -1, use_fp8: bool = True, async_finish: bool = False,
                 return_recv_hook: bool = False):
        """Sends each token to the ranks owning its top-k experts.

        Arguments:
            x: bf16 [num_tokens, hidden], contiguous, hidden % 128 == 0, num_tokens <= num_max_dispatch_tokens_per_rank.
            topk_idx: int64 [num_tokens, num_topk]; -1 masks a slot.
            active_ranks: int32 [num_ranks] (1 = healthy), updated in place when a rank times out; None: internal.
                A longer mask is accepted when its slots past num_ranks are 0 (SGLang's --max-ep-size mask).
            num_experts: divisible by the number of ranks.
        Returns:
            recv_x: bf16 [num_local_experts, num_ranks * T, hidden], or (float8_e4m3fn data, fp32 scales
                [num_local_experts, num_ranks * T, hidden // 128]) with use_fp8; the tokens of each local expert
                are packed from row 0, source rank by source rank. Like DeepEP's low-latency buffers, recv_x is
                double-buffered: it stays valid until the dispatch after next (clone it to keep it longer).
            recv_count: int32 [num_local_experts].
            handle: (src_info int32 [L, num_ranks * T], layout_range int64 [L, num_ranks] = begin << 32 | count,
                T, hidden, num_experts).
            event: EventOverlap; hook: a no-op callable when return_recv_hook, else None.
        """
        t = num_max_dispatch_tokens_per_rank
        self._check_tokens(x, topk_idx, t, num_experts)
        active = self._resolve_active(active_ranks)
        hidden = x.shape[1]
        self._connect(t, hidden, num_experts, x.device, self._deadline(timeout_us))
        lay = self._layout
        local = num_experts // self.world
        self._dispatch_seq += 1
        seq = self._dispatch_seq
        deadline = self._deadline(timeout_us)
        pairs = layout.pairs_per_expert(topk_idx.cpu(), num_experts)
        topk = topk_idx.shape[1]
        if self._gpu is not None:
            recv = self._gpu.dispatch(x, pairs, topk, t, use_fp8, seq, deadline)
        else:
            writes: dict[int, list] = {}
            for r in range(self.world):
                if not active[r]:
                    continue
                stage = lay.send_dispatch + r * lay.region
                all_idx = self._stage_meta(stage, [pairs[r * local + le] // topk for le in range(local)], t)
                if len(all_idx):
                    self._store_rows(stage + lay.meta, x, all_idx, use_fp8)
                writes[r] = [(stage, lay.dispatch_region(seq, self.rank), lay.meta + len(all_idx) * lay.row)]
            self._exchange(writes, lay.area(seq, "dispatch_flags"), seq, list(range(self.world)), deadline)
            recv = self._collect(seq, t, hidden, use_fp8)
        self._report_active(active_ranks)
        hook = (lambda: None) if return_recv_hook else None
        return recv[0], recv[1], recv[2] + (t, hidden, num_experts), EventOverlap(), hook

    def _stage_meta(self, stage: int, chosen: list[torch.Tensor], t: int, via_host: bool = True) -> torch.Tensor:
        """Writes a target's counts and token ids (chosen[le]: the tokens for its local expert le) and the route
        of this rank's rows to it (via_host: through the host buffers; else device to device, GPU path) into
        the host staging area at `stage`; returns the tokens in row order."""
        local = self._layout.local
        self._view(stage + self._layout.route, torch.int32, (1,))[0] = int(via_host)
        counts = self._view(stage, torch.int32, (local,))
        ids = self._view(stage + 4 * local, torch.int32, (local * t,))
        for le, idx in enumerate(chosen):
            if len(idx) > t:
                raise ValueError(f"an expert gets {len(idx)} token slots, more than the capacity {t}")
            counts[le] = len(idx)
        all_idx = torch.cat(chosen)
        ids[:len(all_idx)] = all_idx
        return all_idx

    def _exchange(self, writes: dict[int, list], flags: int, seq: int, wait_for: list[int], deadline: float) -> None:
        """Sends the writes, then the sequence flag to every rank written to, then waits for `wait_for`'s flags."""
        self._send(writes, deadline)
        self._signal(flags, seq, [r for r in writes if self._active[r]], deadline)
        self._wait(flags, seq, wait_for, deadline)

    def _store_rows(self, offset: int, x: torch.Tensor, idx: torch.Tensor, use_fp8: bool) -> None:
        """Gathers x[idx] into the staging rows at `offset` (bf16 rows, or fp8 data followed by its scales)."""
        c, hidden = len(idx), x.shape[1]
        if use_fp8:
            data, scales = layout.quantize_fp8(x.index_select(0, idx))
            packed = self._view(offset, torch.uint8, (c, self._layout.row))
            packed[:, :hidden] = data.view(torch.uint8)
            packed[:, hidden:hidden + 4 * (hidden // layout.FP8_BLOCK)] = scales.view(torch.uint8).view(c, -1)
        else:
            torch.index_select(x, 0, idx, out=self._view(offset, torch.bfloat16, (c, hidden)))

    def _received(self, seq: int, t: int) -> "_Received":
        """Parses the dispatch metadata every active source wrote for call `seq`."""
        lay = self._layout
        local, slots = lay.local, self.world * t
        got = _Received(torch.full((local, slots), -1, dtype=torch.int32),
                        torch.zeros(local, self.world, dtype=torch.int64), [0] * local, {}, {}, {})
        for s in range(self.world):
            if not self._active[s]:
                continue
            region = lay.dispatch_region(seq, s)
            counts = self._view(region, torch.int32, (local,)).tolist()
            ids = self._view(region + 4 * local, torch.int32, (local * t,))
            blocks, first = [], 0
            for le, c in enumerate(counts):
                b = got.begins[le]
                if c:
                    got.src_info[le, b:b + c] = ids[first:first + c]
                    blocks.append((le, first, b, c))
                got.ranges[le, s] = (b << 32) | c
                got.begins[le] += c
                first += c
            got.blocks[s], got.rows[s] = blocks, first
            got.via_host[s] = bool(self._view(region + lay.route, torch.int32, (1,))[0])
        return got

    def _collect(self, seq: int, t: int, hidden: int, use_fp8: bool):
        lay = self._layout
        local, slots = lay.local, self.world * t
        # Rows past recv_count[le] are unspecified, as in DeepEP. The output tensors are reused by call parity
        # (fresh 100 MB allocations would cost more in page faults than the exchange itself).
        key = (seq % 2, use_fp8)
        if key not in self._outputs:
            if use_fp8:
                self._outputs[key] = (torch.empty(local, slots, hidden, dtype=torch.float8_e4m3fn),
                                      torch.empty(local, slots, hidden // layout.FP8_BLOCK, dtype=torch.float32))
            else:
                self._outputs[key] = (torch.empty(local, slots, hidden, dtype=torch.bfloat16), None)
        data, scales = self._outputs[key]
        received = self._received(seq, t)
        for s, blocks in received.blocks.items():
            region = lay.dispatch_region(seq, s)
            total = received.rows[s]
            rows = self._view(region + lay.meta, torch.uint8, (max(total, 1), lay.row))[:total]
            for le, first, b, c in blocks:
                block = rows[first:first + c]
                if use_fp8:
                    data[le, b:b + c] = block[:, :hidden].view(torch.float8_e4m3fn)
                    scales[le, b:b + c] = block[:, hidden:hidden + 4 * (hidden // layout.FP8_BLOCK)] \
                        .contiguous().view(torch.float32)
                else:
                    data[le, b:b + c] = block.view(torch.bfloat16)
        count = torch.tensor(received.begins, dtype=torch.int32)
        recv_x = (data, scales) if use_fp8 else data
        return recv_x, count, (received.src_info, received.ranges)

    # ------------------------------------------------------------------ combine

    def combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, active_ranks,
                timeout_us: int, handle, zero_copy: bool = False, async_finish: bool = False,
                return_recv_hook: bool = False, out: torch.Tensor | None = None):
        """Returns each token's expert outputs to its rank, weighted and summed.

        Arguments:
            x: bf16 [num_local_experts, num_ranks * T, hidden]: the experts' outputs for dispatch's recv_x rows.
            topk_idx, topk_weights: the dispatch's routing; fp32 weights [num_tokens, num_topk].
            handle: from dispatch.
            out: optional bf16 [num_tokens, hidden] to write into.
        Returns:
            combined_x bf16 [num_tokens, hidden]; event; hook (as dispatch).
        """
        if zero_copy:
            raise NotImplementedError("zero-copy combine is not supported (neither is it in Mooncake)")
        src_info, ranges, t, hidden, num_experts = handle
        if self._layout is None or self._shape != (t, hidden, num_experts):
            raise ValueError("handle does not come from this Buffer's dispatch")
        local = num_experts // self.world
        if x.dtype != torch.bfloat16 or x.dim() != 3 or tuple(x.shape) != (local, self.world * t, hidden):
            raise ValueError(f"x must be bf16 [{local}, {self.world * t}, {hidden}], got {x.dtype} {list(x.shape)}")
        if topk_weights.dtype != torch.float32 or topk_weights.shape != topk_idx.shape:
            raise ValueError("topk_weights must be fp32 with the shape of topk_idx")
        expected = self._gpu.dev.torch_device if self._gpu is not None else torch.device("cpu")
        if x.device != expected or topk_weights.device != expected:
            raise ValueError(f"x and topk_weights must be on {expected} (where this Buffer's dispatch ran), "
                             f"got {x.device} and {topk_weights.device}")
        if out is not None and (out.dtype != torch.bfloat16 or tuple(out.shape) != (topk_idx.shape[0], hidden)
                                or not out.is_contiguous() or out.device != x.device):
            raise ValueError(f"out must be a contiguous bf16 [{topk_idx.shape[0]}, {hidden}] tensor on {x.device}")
        self._resolve_active(active_ranks)
        self._combine_seq += 1
        seq = self._combine_seq
        deadline = self._deadline(timeout_us)
        pairs = layout.pairs_per_expert(topk_idx.cpu(), num_experts)
        owners = sorted({e // local for e in range(num_experts) if len(pairs[e])})
        if self._gpu is not None:
            result = self._gpu.combine(x, pairs, topk_weights, ranges, owners, seq, deadline, out)
        else:
            result = self._combine_on_host(x.contiguous(), pairs, topk_idx, topk_weights, ranges, owners, seq,
                                           deadline, out)
        self._report_active(active_ranks)
        hook = (lambda: None) if return_recv_hook else None
        return result, EventOverlap(), hook

    def _answer_plan(self, ranges: torch.Tensor):
        """Per active source s: (s, its answers' staging offset, [(local expert, first recv_x row, count)] for the
        non-empty blocks, in the order the answers are packed)."""
        lay = self._layout
        for s in range(self.world):
            if self._active[s]:
                blocks = [(le, *layout.unpack_range(int(ranges[le, s]))) for le in range(lay.local)]
                yield s, lay.send_combine + s * lay.answers, [b for b in blocks if b[2]]

    def _answers_received(self, pairs: list[torch.Tensor], owners: list[int], seq: int):
        """Per active owner r: (r, its combine region, [(pairs answered, first row in the region)]) for the
        non-empty experts of r. Inactive owners are left out: their experts contribute nothing."""
        lay = self._layout
        for r in owners:
            if not self._active[r]:
                continue
            blocks, first = [], 0
            for le in range(lay.local):
                chosen = pairs[r * lay.local + le]
                if len(chosen):
                    blocks.append((chosen, first))
                first += len(chosen)
            yield r, lay.combine_region(seq, r), blocks

    def _combine_on_host(self, x, pairs, topk_idx, topk_weights, ranges, owners, seq, deadline, out):
        lay = self._layout
        hidden, topk = x.shape[2], topk_idx.shape[1]
        writes: dict[int, list] = {}
        for s, stage, blocks in self._answer_plan(ranges):
            offset = 0
            for le, begin, c in blocks:
                self._view(stage + offset * lay.row, torch.bfloat16, (c, hidden)).copy_(x[le, begin:begin + c])
                offset += c
            writes[s] = [(stage, lay.combine_region(seq, self.rank), offset * lay.row)] if offset else []
        self._exchange(writes, lay.area(seq, "combine_flags"), seq, owners, deadline)
        weights = topk_weights.reshape(-1)
        acc = torch.zeros(topk_idx.shape[0], hidden, dtype=torch.float32)
        for r, region, blocks in self._answers_received(pairs, owners, seq):
            for chosen, first in blocks:
                rows = self._view(region + first * lay.row, torch.bfloat16, (len(chosen), hidden))
                acc.index_add_(0, chosen // topk, rows.float().mul_(weights[chosen].unsqueeze(1)))
        result = acc.to(torch.bfloat16)
        if out is not None:
            out.copy_(result)
            result = out
        return result

    # ------------------------------------------------------------------ validation

    def _check_tokens(self, x, topk_idx, t, num_experts) -> None:
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2 or not x.is_contiguous():
            raise ValueError("x must be a contiguous bf16 tensor [num_tokens, hidden]")
        if x.shape[1] % 128:
            raise ValueError(f"hidden must be a multiple of 128, got {x.shape[1]}")
        if x.shape[0] > t:
            raise ValueError(f"{x.shape[0]} tokens exceed num_max_dispatch_tokens_per_rank={t}")
        if topk_idx.dtype != torch.int64 or topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
            raise ValueError("topk_idx must be int64 [num_tokens, num_topk]")
        if num_experts <= 0 or num_experts % self.world:
            raise ValueError(f"num_experts ({num_experts}) must be a positive multiple of the {self.world} ranks")
        if topk_idx.numel() and (int(topk_idx.max()) >= num_experts or int(topk_idx.min()) < -1):
            raise ValueError(f"topk_idx entries must be -1 or in [0, {num_experts})")
