"""One rank of the multi-process EP tests (run by buffer_test.py): checks dispatch/combine against a plain-torch
reference that every rank computes for every other rank from shared seeds (no communication needed).

argv: rank world port scenario; prints one JSON line with its findings; exits non-zero on a failed check.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from mooncake.ep import Buffer
from mooncake.ep import layout

T, HIDDEN, TOPK = 16, 256, 4


def inputs(rank: int, rnd: int, world: int, num_experts: int):
    g = torch.Generator().manual_seed(1000 * rnd + rank)
    n = T - (rank % 3)  # ranks send different numbers of tokens
    x = (torch.randn(n, HIDDEN, generator=g) * 2).to(torch.bfloat16)
    # Uneven loads: half of the slots go to the first quarter of the experts.
    hot = torch.randint(0, max(1, num_experts // 4), (n, TOPK), generator=g)
    cold = torch.randint(0, num_experts, (n, TOPK), generator=g)
    idx = torch.where(torch.rand(n, TOPK, generator=g) < 0.5, hot, cold)
    idx = torch.stack([torch.randperm(num_experts, generator=g)[:TOPK] if len(set(r.tolist())) < TOPK else r
                       for r in idx]).to(torch.int64)  # distinct experts per token
    idx[torch.rand(n, TOPK, generator=g) < 0.1] = -1  # masked slots
    w = torch.rand(n, TOPK, generator=g, dtype=torch.float32)
    return x, idx, w


def expected_recv(rank, rnd, world, num_experts, active):
    local = num_experts // world
    out = []
    for le in range(local):
        e = rank * local + le
        rows = []
        for s in range(world):
            if not active[s]:
                continue
            x, idx, _ = inputs(s, rnd, world, num_experts)
            rows.append(x[layout.tokens_per_expert(idx, num_experts)[e]])
        out.append(torch.cat(rows) if rows else torch.zeros(0, HIDDEN, dtype=torch.bfloat16))
    return out


def expert(y: torch.Tensor, le: int) -> torch.Tensor:
    return (y.float() * (le + 1)).to(torch.bfloat16)


def expected_combine(rank, rnd, world, num_experts, active):
    x, idx, w = inputs(rank, rnd, world, num_experts)
    local = num_experts // world
    acc = torch.zeros(x.shape[0], HIDDEN)
    for j in range(x.shape[0]):
        for k in range(TOPK):
            e = int(idx[j, k])
            if e >= 0 and active[e // local]:
                acc[j] += w[j, k] * expert(x[j:j + 1], e % local)[0].float()
    return acc


def run_round(buf, rank, world, rnd, num_experts, active, use_fp8, timeout_us):
    x, idx, w = inputs(rank, rnd, world, num_experts)
    recv_x, count, handle, _, _ = buf.dispatch(x, idx, active, T, num_experts, timeout_us, use_fp8=use_fp8)
    local = num_experts // world
    exp_rows = expected_recv(rank, rnd, world, num_experts, active)
    for le in range(local):
        c = int(count[le])
        assert c == len(exp_rows[le]), (le, c, len(exp_rows[le]))
        got = layout.dequantize_fp8(recv_x[0][le, :c], recv_x[1][le, :c]) if use_fp8 else recv_x[le, :c]
        tol = 0.07 if use_fp8 else 0
        err = (got.float() - exp_rows[le].float()).abs().max().item() if c else 0.0
        scale = exp_rows[le].float().abs().max().item() if c else 1.0
        assert err <= tol * scale + 1e-6, (le, err, scale)
    y = recv_x if not use_fp8 else torch.stack(
        [layout.dequantize_fp8(recv_x[0][le], recv_x[1][le]) for le in range(local)])
    y = torch.stack([expert(y[le], le) for le in range(local)])
    combined, _, _ = buf.combine(y, idx, w, active, timeout_us, handle)
    ref = expected_combine(rank, rnd, world, num_experts, active)
    tol = 0.1 if use_fp8 else 0.02
    err = (combined.float() - ref).abs().max().item()
    assert err <= tol * max(1.0, ref.abs().max().item()), (rnd, err)


def main() -> int:
    rank, world, port, scenario = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    backend = os.environ.get("MC_EP_TEST_BACKEND", "gloo")
    if backend == "mooncake-cpu":
        import mooncake.pg  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    num_experts = 4 * world
    buf = Buffer(dist.group.WORLD)
    active = torch.ones(world, dtype=torch.int32)
    report = {"rank": rank}
    if scenario == "basic":
        for rnd, fp8 in enumerate([False, True, False]):
            run_round(buf, rank, world, rnd, num_experts, active, fp8, 10_000_000)
        report["active"] = active.tolist()
    elif scenario == "errors":
        x, idx, _ = inputs(rank, 0, world, num_experts)
        checks = {
            "fp32": lambda: buf.dispatch(x.float(), idx, active, T, num_experts, -1),
            "hidden": lambda: buf.dispatch(x[:, :200].contiguous(), idx, active, T, num_experts, -1),
            "capacity": lambda: buf.dispatch(x, idx, active, x.shape[0] - 1, num_experts, -1),
            "experts": lambda: buf.dispatch(x, idx, active, T, num_experts + 1, -1),
            "active_shape": lambda: buf.dispatch(x, idx, torch.ones(world + 1, dtype=torch.int32), T, num_experts, -1),
            "noncontig": lambda: buf.dispatch(x.t().contiguous().t(), idx, active, T, num_experts, -1),
        }
        for name, fn in checks.items():
            try:
                fn()
                report[name] = "accepted"
            except (ValueError, TypeError) as e:
                report[name] = str(e)
    elif scenario == "stall":
        # Rank world-1 stops answering for round 1; the others time out on it, go on without it, and take it
        # back after update_ep_member().
        victim = world - 1
        run_round(buf, rank, world, 0, num_experts, active, False, 10_000_000)
        if rank == victim:
            time.sleep(3)
            try:
                run_round(buf, rank, world, 1, num_experts, active, False, 1_000_000)
            except AssertionError:
                pass  # it missed its peers' combine answers: expected
        else:
            t0 = time.monotonic()
            run_round(buf, rank, world, 1, num_experts, active, False, 1_000_000)
            report["round1_seconds"] = time.monotonic() - t0
            report["active_after_stall"] = active.tolist()
            assert active[victim] == 0 and sum(active.tolist()) == world - 1
        buf.update_ep_member()
        active.fill_(1)
        run_round(buf, rank, world, 2, num_experts, active, False, 10_000_000)
        report["active_after_recovery"] = active.tolist()
    elif scenario == "killed":
        victim = world - 1
        run_round(buf, rank, world, 0, num_experts, active, False, 10_000_000)
        if rank == victim:
            os._exit(0)
        t0 = time.monotonic()
        run_round(buf, rank, world, 1, num_experts, active, False, 2_000_000)
        report["round1_seconds"] = time.monotonic() - t0
        report["active"] = active.tolist()
        assert active[victim] == 0
        run_round(buf, rank, world, 2, num_experts, active, False, 2_000_000)  # skipped without waiting
        print(json.dumps(report), flush=True)
        os._exit(0)  # the process group lost a member: skip its teardown
    print(json.dumps(report), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
