import torch

from mooncake.ep import layout


def test_tokens_per_expert_keeps_token_order_and_skips_masked_slots():
    idx = torch.tensor([[2, 0], [0, -1], [1, 2]], dtype=torch.int64)
    got = [t.tolist() for t in layout.tokens_per_expert(idx, 4)]
    assert got == [[0, 1], [2], [0, 2], []]
    # Pairs are flat token * num_topk + slot indices: they address topk_weights.reshape(-1) directly.
    assert [p.tolist() for p in layout.pairs_per_expert(idx, 4)] == [[1, 2], [4], [0, 5], []]


def test_fp8_round_trip_within_e4m3_precision():
    x = (torch.randn(8, 256) * torch.logspace(-3, 3, 256)).to(torch.bfloat16)
    data, scales = layout.quantize_fp8(x)
    assert data.dtype == torch.float8_e4m3fn and scales.shape == (8, 2)
    back = layout.dequantize_fp8(data, scales).float()
    blocks = x.float().reshape(8, 2, 128).abs().amax(dim=2, keepdim=True)
    assert ((back - x.float()).abs().reshape(8, 2, 128) <= blocks * 0.07 + 1e-6).all()


def test_ranges_pack_begin_and_count():
    packed = layout.pack_ranges([0, 5, 1 << 20], [5, 0, 7])
    assert [layout.unpack_range(int(v)) for v in packed] == [(0, 5), (5, 0), (1 << 20, 7)]
