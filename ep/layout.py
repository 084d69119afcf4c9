"""Routing arithmetic for MoE dispatch/combine (pure torch, no communication).

Conventions shared by every rank (so sender and receiver agree without exchanging indices):
- Experts are split evenly: rank r owns global experts [r * L, (r + 1) * L), L = num_experts // num_ranks.
- The tokens a rank sends to expert e are its (token, slot) pairs with topk_idx[token, slot] == e, in
  ascending (token, slot) order; slot -1 is masked and sends nothing.
- fp8: e4m3 data with one fp32 scale per 128 channels of each token (scale = amax / 448).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
FP8_BLOCK = 128


def pairs_per_expert(topk_idx: torch.Tensor, num_experts: int) -> list[torch.Tensor]:
    """For each global expert: its (token, slot) pairs as flat indices token * num_topk + slot, in the shared
    order (int64 tensors). Token index = pair // num_topk; its weight = topk_weights.reshape(-1)[pair]."""
    flat = topk_idx.reshape(-1)
    valid = flat >= 0
    order = torch.arange(flat.numel(), dtype=torch.int64)[valid]
    experts = flat[valid]
    # A stable sort by expert keeps (token, slot) order inside each expert.
    sorted_experts, perm = torch.sort(experts, stable=True)
    pairs = order[perm]
    counts = torch.bincount(sorted_experts, minlength=num_experts).tolist()
    out, start = [], 0
    for c in counts:
        out.append(pairs[start:start + c])
        start += c
    return out


def tokens_per_expert(topk_idx: torch.Tensor, num_experts: int) -> list[torch.Tensor]:
    """For each global expert: the token indices routed to it, in the shared order (int64 tensors)."""
    return [p // topk_idx.shape[1] for p in pairs_per_expert(topk_idx, num_experts)]


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 [n, hidden] -> (float8_e4m3fn [n, hidden], fp32 scales [n, hidden // 128])."""
    n, hidden = x.shape
    blocks = x.float().reshape(n, hidden // FP8_BLOCK, FP8_BLOCK)
    scales = blocks.abs().amax(dim=2).clamp(min=1e-8) / FP8_MAX
    data = (blocks / scales.unsqueeze(2)).to(torch.float8_e4m3fn).reshape(n, hidden)
    return data, scales


def dequantize_fp8(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n, hidden = data.shape
    blocks = data.float().reshape(n, hidden // FP8_BLOCK, FP8_BLOCK) * scales.unsqueeze(2)
    return blocks.reshape(n, hidden).to(torch.bfloat16)


def pack_ranges(begins: list[int], counts: list[int]) -> torch.Tensor:
    """DeepEP's layout_range entries: begin << 32 | count (int64)."""
    return torch.tensor([(b << 32) | c for b, c in zip(begins, counts)], dtype=torch.int64)


def unpack_range(value: int) -> tuple[int, int]:
    return value >> 32, value & 0xFFFFFFFF
