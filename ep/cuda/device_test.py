"""The GPU path's device operations: the CUDA library builds and says why it cannot run here; the host
emulation computes what the kernels compute (the CPU path's row formats); on a machine with a GPU the kernels
are checked against the emulation."""

import ctypes
import os

import pytest
import torch

from mooncake.ep import layout
from mooncake.ep.cuda import device as devmod
from mooncake.ep.cuda.emulation import HostEmulatedDevice

HIDDEN = 256


def test_cuda_library_loads_or_explains_why_not():
    reason = devmod.unavailable_reason()
    lib_path = os.path.join(os.path.dirname(devmod.__file__), devmod.LIBRARY)
    if not os.path.exists(lib_path):
        assert "was not built" in reason
        return
    lib = ctypes.CDLL(lib_path)
    for name in ("mc_ep_pack_rows", "mc_ep_unpack_rows", "mc_ep_combine_tokens", "mc_ep_device_sync",
                 "mc_ep_host_register"):
        assert hasattr(lib, name), name
    for name in ("mc_ep_malloc", "mc_ep_ipc_open", "mc_ep_memcpy_async"):  # the platform layer's job now
        assert not hasattr(lib, name), name
    if reason is not None:
        with pytest.raises(devmod.CudaUnavailable, match="CUDA tensors given"):
            devmod.CudaDevice(torch.device("cuda:0"))


def test_the_reason_is_the_cuda_platforms_probe():
    """Under Bazel the cuda platform plugin is in MC_PLUGIN_DIR; without a driver (here) the reason is its probe's."""
    from mooncake._native import platform
    try:
        probe = platform.get("cuda").probe()
    except KeyError:
        assert "no cuda platform plugin" in devmod.unavailable_reason()
        return
    reason = devmod.unavailable_reason()
    if not probe["usable"] and os.path.exists(os.path.join(os.path.dirname(devmod.__file__), devmod.LIBRARY)):
        assert reason == f"no CUDA device: the cuda platform says: {probe['reason']}"
    elif probe["usable"] and not torch.cuda.is_available():
        assert "has no CUDA support" in reason, reason


def _routing(seed=0, tokens=12, slots=3):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, HIDDEN, generator=g) * 3).to(torch.bfloat16)
    rows = torch.randperm(tokens, generator=g)[:8]
    return x, rows


def _pack_unpack(dev, x, rows, fp8):
    """Packs x[rows] into a device buffer with gaps between rows, unpacks them to reversed output rows."""
    row_bytes = 2 * HIDDEN
    n = len(rows)
    base = dev.malloc(64 + 2 * n * row_bytes)
    offsets = 64 + torch.arange(n, dtype=torch.int64) * 2 * row_bytes
    device = dev.torch_device
    dev.pack_rows(x.to(device), rows.to(device), offsets.to(device), HIDDEN, base, fp8)
    dst = torch.arange(n - 1, -1, -1, dtype=torch.int64)
    data = torch.empty(n, HIDDEN, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, device=device)
    scales = torch.empty(n, HIDDEN // layout.FP8_BLOCK, dtype=torch.float32, device=device) if fp8 else None
    dev.unpack_rows(base, offsets.to(device), dst.to(device), HIDDEN, data, scales, fp8)
    dev.synchronize()
    return base, offsets, data.flip(0).cpu(), scales.flip(0).cpu() if fp8 else None


@pytest.mark.parametrize("fp8", [False, True])
def test_emulated_pack_and_unpack_use_the_cpu_row_format(fp8):
    dev = HostEmulatedDevice()
    x, rows = _routing()
    _, _, data, scales = _pack_unpack(dev, x, rows, fp8)
    if fp8:
        ref_data, ref_scales = layout.quantize_fp8(x[rows])
        assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8))
        assert torch.equal(scales, ref_scales)
    else:
        assert torch.equal(data, x[rows])


def test_emulated_combine_sums_weighted_slots_and_skips_negative_offsets():
    dev = HostEmulatedDevice()
    x, rows = _routing()
    base, offsets, _, _ = _pack_unpack(dev, x, rows, False)
    tokens, topk = 4, 3
    slot = torch.tensor([[0, 1, -1], [2, -1, -1], [3, 4, 5], [-1, -1, -1]])
    slot_offsets = torch.where(slot >= 0, offsets[slot.clamp(min=0)], torch.tensor(-1)).reshape(-1)
    weights = torch.rand(tokens, topk)
    out = torch.empty(tokens, HIDDEN, dtype=torch.bfloat16)
    dev.combine_tokens(base, slot_offsets, weights, HIDDEN, out)
    packed = x[rows].float()
    for t in range(tokens):
        ref = sum((weights[t, k] * packed[int(slot[t, k])] for k in range(topk) if slot[t, k] >= 0),
                  torch.zeros(HIDDEN))
        assert torch.allclose(out[t].float(), ref.to(torch.bfloat16).float(), rtol=0, atol=0)


def test_emulated_ipc_maps_the_same_memory():
    owner, peer = HostEmulatedDevice(), HostEmulatedDevice()
    base = owner.malloc(4096)
    mapped = peer.ipc_open(owner.ipc_handle(base))
    ctypes.memmove(mapped + 100, b"mooncake", 8)
    assert ctypes.string_at(base + 100, 8) == b"mooncake"
    peer.ipc_close(mapped)
    owner.free(base)


@pytest.mark.skipif(devmod.unavailable_reason() is not None, reason=str(devmod.unavailable_reason()))
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_kernels_match_the_emulation(fp8):
    gpu, emu = devmod.CudaDevice(torch.device("cuda:0")), HostEmulatedDevice()
    x, rows = _routing(seed=3)
    _, _, gdata, gscales = _pack_unpack(gpu, x, rows, fp8)
    _, _, edata, escales = _pack_unpack(emu, x, rows, fp8)
    assert torch.equal(gdata.view(torch.uint8), edata.view(torch.uint8))
    if fp8:
        assert torch.equal(gscales, escales)
