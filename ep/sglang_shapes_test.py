"""SGLang 0.5.23's Mooncake EP calls (srt/layers/moe/token_dispatcher/mooncake.py and elastic_ep/elastic_ep.py, as
listed in client-callsites.md), made by 2 real processes through `from mooncake.mooncake_ep_buffer import Buffer`,
in SGLang's order and argument shapes, and checked against ep/testing_worker.py's plain-torch reference.

Run as `python -m mooncake.ep.sglang_shapes_test rank world port scenario`, this module is one rank (started by
the tests below through mooncake.ep.testing.run_ranks); it prints one JSON line and exits non-zero on a failed check.
"""

import json
import os
import sys

import pytest
import torch
import torch.distributed as dist

from mooncake.ep.testing import run_ranks
from mooncake.ep.testing_worker import HIDDEN, T, check_combined, check_recv, expected_combine, inputs

DEVICE = "cpu"  # SGLang puts active_ranks on "cuda"; the CPU path takes the same shapes
RESERVED = 2  # elastic-EP slots past the group (--max-ep-size = world + RESERVED), not joined yet


class EPBuffer:
    """SGLang's process-wide buffer holder (EPBuffer.get_ep_buffer, low-latency mode): one Buffer shared by the
    dispatchers of every MoE layer."""

    buffer = None

    @classmethod
    def get_ep_buffer(cls, group, hidden_size: int, num_max_dispatch_tokens_per_rank: int, num_experts: int):
        if cls.buffer is not None:
            return cls.buffer
        from mooncake.mooncake_ep_buffer import Buffer

        assert num_experts % group.size() == 0
        num_ep_buffer_bytes = Buffer.get_ep_buffer_size_hint(num_max_dispatch_tokens_per_rank, hidden_size,
                                                             group.size(), num_experts)
        cls.buffer = Buffer(group, num_ep_buffer_bytes)
        return cls.buffer


class Dispatcher:
    """The Buffer calls of one MoE layer's _MooncakeEPDispatcherImpl: dispatch_a/dispatch_b, combine_a/combine_b
    (use_fp8=True, timeout -1 on the layer's first execution, then 10 s; async_finish = not return_recv_hook)."""

    def __init__(self, group, num_experts: int, return_recv_hook: bool, active_ranks):
        self.group, self.num_experts, self.return_recv_hook = group, num_experts, return_recv_hook
        self.active_ranks = active_ranks  # () -> the int32 mask SGLang's _get_active_ranks() returns
        self.first_execution = True
        self.timeout_us = 10000000
        self.handle = None

    def _buffer(self):
        return EPBuffer.get_ep_buffer(self.group, HIDDEN, T, self.num_experts)

    def dispatch(self, hidden_states, topk_ids, topk_weights):
        buffer = self._buffer()
        topk_ids = topk_ids.to(torch.int64)
        expected_m = (hidden_states.shape[0] * buffer.group_size * topk_ids.shape[1] + self.num_experts) \
            // self.num_experts
        recv, masked_m, self.handle, event, hook = buffer.dispatch(
            hidden_states, topk_ids, self.active_ranks(), T, self.num_experts,
            -1 if self.first_execution else self.timeout_us, use_fp8=True,
            async_finish=not self.return_recv_hook, return_recv_hook=self.return_recv_hook)
        hook() if self.return_recv_hook else event.current_stream_wait()
        if isinstance(recv, tuple):
            recv, scale = recv
        else:
            scale = None
        return recv, scale, topk_ids, topk_weights, masked_m, expected_m

    def combine(self, hidden_states, topk_ids, topk_weights):
        buffer = self._buffer()
        combined, event, hook = buffer.combine(
            hidden_states, topk_ids, topk_weights, self.active_ranks(),
            -1 if self.first_execution else self.timeout_us, self.handle,
            async_finish=not self.return_recv_hook, return_recv_hook=self.return_recv_hook)
        self.first_execution = False
        self.handle = None
        hook() if self.return_recv_hook else event.current_stream_wait()
        return combined


def sglang_round(layer: Dispatcher, rank: int, world: int, rnd: int, idle_rank: int | None = None) -> None:
    """One MoE layer's dispatch -> experts -> combine, checked against the reference; `idle_rank` sends no tokens
    (an idle batch under DP attention)."""
    num_experts, local = layer.num_experts, layer.num_experts // world
    x, idx, w = inputs(rank, rnd, world, num_experts)
    if rank == idle_rank:
        x, idx, w = x[:0], idx[:0], w[:0]
    hidden, scale, topk_ids, topk_weights, masked_m, expected_m = layer.dispatch(x, idx.to(torch.int32), w)
    assert hidden.dtype == torch.float8_e4m3fn and tuple(hidden.shape) == (local, world * T, HIDDEN), hidden.shape
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (local, world * T, HIDDEN // 128), scale.shape
    assert masked_m.dtype == torch.int32 and tuple(masked_m.shape) == (local,), masked_m
    assert expected_m == (x.shape[0] * world * idx.shape[1] + num_experts) // num_experts
    senders = torch.tensor([0 if r == idle_rank else 1 for r in range(world)], dtype=torch.int32)
    y = check_recv(rank, rnd, world, num_experts, senders, (hidden, scale), masked_m, True)
    combined = layer.combine(y, topk_ids, topk_weights)
    ref = expected_combine(rank, rnd, world, num_experts, torch.ones(world, dtype=torch.int32))
    check_combined(ref[:x.shape[0]], combined, True)


def main() -> int:
    rank, world, port, _ = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    backend = os.environ["MC_EP_TEST_BACKEND"]
    if backend == "mooncake-cpu":
        import mooncake.pg  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.group.WORLD
    num_experts = 4 * world
    elastic_mask = torch.ones(world + RESERVED, dtype=torch.int32, device=DEVICE)  # ElasticEPState.active_ranks
    elastic_mask[world:] = 0
    fresh = Dispatcher(group, num_experts, False,
                       lambda: torch.ones(group.size(), dtype=torch.int32, device=DEVICE))
    hooked = Dispatcher(group, num_experts, True,
                        lambda: torch.ones(group.size(), dtype=torch.int32, device=DEVICE))
    elastic = Dispatcher(group, num_experts, False, lambda: elastic_mask)
    sglang_round(fresh, rank, world, 0)  # the first execution: timeout -1, async_finish=True
    sglang_round(hooked, rank, world, 1)  # return_recv_hook=True: hook() instead of the event
    sglang_round(fresh, rank, world, 2, idle_rank=1)
    sglang_round(elastic, rank, world, 3)
    buf = EPBuffer.buffer
    report = {"rank": buf.rank, "group_size": buf.group_size, "num_ep_buffer_bytes": buf.num_ep_buffer_bytes}
    # A mask naming a rank this Buffer does not know (the group grew) is refused before anything is sent.
    grown = elastic_mask.clone()
    grown[world] = 1
    x, idx, _ = inputs(rank, 4, world, num_experts)
    try:
        buf.dispatch(x, idx, grown, T, num_experts, 10000000, use_fp8=True, async_finish=True)
        report["grown"] = "accepted"
    except ValueError as e:
        report["grown"] = str(e)
    buf.update_ep_member()  # elastic_ep._refresh_ep_members, after recover_ranks / join_group
    sglang_round(elastic, rank, world, 5)
    sglang_round(hooked, rank, world, 6, idle_rank=0)
    report["elastic_mask"] = elastic_mask.tolist()
    print(json.dumps(report), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def test_import_path_is_mooncake_ep():
    import mooncake.ep
    from mooncake.mooncake_ep_buffer import Buffer, EventOverlap

    assert Buffer is mooncake.ep.Buffer and EventOverlap is mooncake.ep.EventOverlap
    # Static, before any Buffer exists; Mooncake's formula 4*E*4 + 4*E*T*(32 + 2*hidden).
    assert Buffer.get_ep_buffer_size_hint(128, 7168, 16, 256) == 4 * 256 * 4 + 4 * 256 * 128 * (32 + 2 * 7168)
    assert EventOverlap().current_stream_wait() is None


@pytest.mark.parametrize("backend", ["gloo", "mooncake-cpu"])
def test_sglang_call_sequence_matches_the_reference(backend):
    reports = run_ranks(2, "sglang", backend=backend, module="mooncake.ep.sglang_shapes_test")
    for rank, (rc, out, err) in enumerate(reports):
        assert rc == 0, err[-3000:]
        report = json.loads(out)
        assert report["rank"] == rank and report["group_size"] == 2
        assert report["num_ep_buffer_bytes"] == 4 * 8 * 4 + 4 * 8 * T * (32 + 2 * HIDDEN)
        assert "past this group's 2 ranks" in report["grown"], report["grown"]
        assert report["elastic_mask"] == [1, 1] + [0] * RESERVED


if __name__ == "__main__":
    sys.exit(main())
