"""One rank of the multi-process EP tests (run by buffer_test.py, rejoin_test.py and early_exit_test.py): checks
dispatch/combine against a plain-torch reference that every rank computes for every other rank from shared seeds (no
communication needed).

argv: rank world port scenario; prints one JSON line with its findings; exits non-zero on a failed check.
The "rejoin" / "replacement" / "gone" scenarios also take a folder (MC_EP_TEST_DIR) for signals to and from the
test.
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
DEVICE = os.environ.get("MC_EP_TEST_DEVICE", "cpu")  # "cuda": the GPU check runs the same scenarios on a GPU


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


def run_round(buf, rank, world, rnd, num_experts, active, use_fp8, timeout_us, between=None) -> dict:
    """One dispatch + combine checked against the reference (`between()`, if given, runs after the dispatch's
    checks); returns each call's seconds. With MC_EP_TEST_DEVICE=cuda, the tensors given to the Buffer live on
    the GPU (active_ranks included); checks run on CPU copies."""
    x, idx, w = inputs(rank, rnd, world, num_experts)
    device_active = active.to(DEVICE)  # on CPU: `active` itself (.to and .cpu return the tensor unchanged)
    t0 = time.monotonic()
    recv_x, count, handle, _, _ = buf.dispatch(x.to(DEVICE), idx.to(DEVICE), device_active, T, num_experts,
                                               timeout_us, use_fp8=use_fp8)
    seconds = {"dispatch": time.monotonic() - t0}
    active.copy_(device_active.cpu())
    y = check_recv(rank, rnd, world, num_experts, active, recv_x, count, use_fp8)
    if between is not None:
        between()
    device_active = active.to(DEVICE)
    t0 = time.monotonic()
    combined, _, _ = buf.combine(y.to(DEVICE), idx.to(DEVICE), w.to(DEVICE), device_active, timeout_us, handle)
    seconds["combine"] = time.monotonic() - t0
    active.copy_(device_active.cpu())
    check_combined(expected_combine(rank, rnd, world, num_experts, active), combined, use_fp8)
    return seconds


def check_recv(rank, rnd, world, num_experts, active, recv_x, count, use_fp8) -> torch.Tensor:
    """Checks a dispatch's recv_x / recv_count (on any device) against the rows the `active` sources of round
    `rnd` send to `rank`; returns the experts' outputs for those rows (bf16, CPU), ready for combine."""
    recv_x = tuple(t.cpu() for t in recv_x) if use_fp8 else recv_x.cpu()
    count = count.cpu()
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
    return torch.stack([expert(y[le], le) for le in range(local)])


def check_combined(ref: torch.Tensor, combined: torch.Tensor, use_fp8: bool) -> None:
    """Checks a combine's output (on any device) against expected_combine's `ref`."""
    combined = combined.cpu()
    assert combined.dtype == torch.bfloat16 and combined.shape == ref.shape, (combined.dtype, combined.shape)
    tol = 0.1 if use_fp8 else 0.02
    err = (combined.float() - ref).abs().max().item() if ref.numel() else 0.0
    assert err <= tol * max(1.0, ref.abs().max().item() if ref.numel() else 0.0), err


def wait_for_file(path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.02)


def touch(path: str) -> None:
    with open(path + ".tmp", "w"):
        pass
    os.rename(path + ".tmp", path)


REJOIN_VICTIM = 1  # not rank 0: rank 0 hosts the store
KILLED_ROUND_TIMEOUT_US = 3_000_000


def rejoin(rank: int, world: int, port: int, scenario: str) -> int:
    """A rank is SIGKILLed between rounds; the survivors go on without it, a replacement process takes its rank
    in the mooncake-cpu group and in the EP Buffer, and every rank matches the full reference again.

    Sequence (files in MC_EP_TEST_DIR): the victim writes `ready` after its rounds and waits to be killed; the
    test kills it and writes `killed`; each survivor writes `dropped.<rank>` once the group dropped the victim;
    the test then starts the "replacement" process, which says `ep_test/joining` in the store before join_group.
    """
    import datetime

    import mooncake.pg as pg

    signals = os.environ["MC_EP_TEST_DIR"]
    victim = REJOIN_VICTIM
    replacement = scenario == "replacement"
    dist.init_process_group("mooncake-cpu", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            pg_options=pg.MooncakeBackendOptions(world, replacement),
                            timeout=datetime.timedelta(seconds=60))
    store = dist.distributed_c10d._get_default_store()
    num_experts = 4 * world
    buf = Buffer(dist.group.WORLD)  # every process creates its Buffers in the same order, replacements too
    active = torch.ones(world, dtype=torch.int32)
    survivors = [r for r in range(world) if r != victim]
    report = {"rank": rank, "replacement": replacement}
    if not replacement:
        run_round(buf, rank, world, 0, num_experts, active, False, 10_000_000)
        buf.update_ep_member()  # a round of it before the kill, which the replacement never saw
        run_round(buf, rank, world, 1, num_experts, active, True, 10_000_000)
        assert active.tolist() == [1] * world, active
        if rank == victim:
            touch(os.path.join(signals, "ready"))
            time.sleep(60)  # killed here
            return 1
        wait_for_file(os.path.join(signals, "killed"), 60)
        # The victim's process is gone: the next call gives up on it within the timeout, and the reference
        # leaves out its tokens (dispatch) and its experts (combine).
        t0 = time.monotonic()
        run_round(buf, rank, world, 2, num_experts, active, False, KILLED_ROUND_TIMEOUT_US)
        report["dead_round_seconds"] = time.monotonic() - t0
        report["active_after_kill"] = active.tolist()
        assert active.tolist() == [0 if r == victim else 1 for r in range(world)], active
        t0 = time.monotonic()
        run_round(buf, rank, world, 3, num_experts, active, True, 10_000_000)  # the victim is not waited for
        report["skip_round_seconds"] = time.monotonic() - t0
        assert active[victim] == 0
        # The application drops it from the process group as well (the same change from every survivor), so
        # that a replacement can take its rank.
        resp = pg.deactivate_ranks(dist.group.WORLD, [victim])
        assert resp.status == pg.ProposalStatus.Applied, resp
        assert pg.get_active_ranks(dist.group.WORLD) == survivors
        touch(os.path.join(signals, f"dropped.{rank}"))
        store.wait(["ep_test/joining"], datetime.timedelta(seconds=60))
        resp = pg.recover_ranks(dist.group.WORLD, [victim])
        assert resp.status == pg.ProposalStatus.Applied, resp
    else:
        store.set("ep_test/joining", "1")
        pg.join_group(dist.group.WORLD, timeout_s=60)
    assert pg.get_active_ranks(dist.group.WORLD) == list(range(world))
    # Every rank, the replacement included, re-reads the registrations and aligns the call counters.
    buf.update_ep_member()
    active.fill_(1)
    for rnd, fp8 in [(4, False), (5, True), (6, False)]:
        run_round(buf, rank, world, rnd, num_experts, active, fp8, 10_000_000)
        assert active.tolist() == [1] * world, (rnd, active)
    report["active_after_rejoin"] = active.tolist()
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == world
    # A rank whose all_reduce returned may still be needed by peers finishing theirs (they read its memory):
    # nobody leaves before everyone is done. Rank 0 hosts the store: it leaves last.
    store.set(f"ep_test/done/{rank}", "1")
    store.wait([f"ep_test/done/{r}" for r in range(world)], datetime.timedelta(seconds=60))
    if rank != 0:
        store.set(f"ep_test/exit/{rank}", "1")
    else:
        store.wait([f"ep_test/exit/{r}" for r in range(1, world)], datetime.timedelta(seconds=60))
    print(json.dumps(report), flush=True)
    os._exit(0)  # the group lost a member on the way: skip its teardown


GONE_TIMEOUT_US = 3_000_000  # the calls that lose the victim
CALM_TIMEOUT_US = 30_000_000  # the others: far above any call's time on a loaded machine


def gone(rank: int, world: int, port: int) -> int:
    """Rank MC_EP_TEST_VICTIM leaves after constructing its Buffer (MC_EP_TEST_WHEN=dispatch) or between its
    dispatch and its combine of a round (=combine), by os._exit (MC_EP_TEST_HOW=exit), by the test's SIGKILL
    (=kill), or by staying alive without calling again until the survivors are done (=stall). The survivors' calls return within the timeout, set the victim to 0 in active_ranks and match the
    reference without it; the next round skips it without waiting. When the victim is rank 0, which hosts the
    store, update_ep_member() fails clearly and the Buffer goes on as before. With =construct, rank 0 leaves
    before the Buffers are constructed: the survivors' constructors fail clearly (no peer can be learnt).

    Files in MC_EP_TEST_DIR: the victim writes `ready` when it is about to leave (or to be killed); the test
    writes `gone` once the victim's process ended. The ranks line up (`<step>.<rank>`) when their process group
    is up (=construct) and before each round, so that a loaded machine does not make a healthy rank miss a short
    timeout (the store may be gone, so files are the barrier); a survivor writes `done.<rank>` after its rounds
    and exits when every survivor did (the others' last call may still write into its memory).
    """
    import datetime

    from mooncake.ep.peers import StoreUnreachable

    signals = os.environ["MC_EP_TEST_DIR"]
    victim = int(os.environ["MC_EP_TEST_VICTIM"])
    when, how = os.environ["MC_EP_TEST_WHEN"], os.environ["MC_EP_TEST_HOW"]
    backend = os.environ.get("MC_EP_TEST_BACKEND", "mooncake-cpu")
    if backend == "mooncake-cpu":
        import mooncake.pg  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    num_experts = 4 * world
    active = torch.ones(world, dtype=torch.int32)
    survivors = [r for r in range(world) if r != victim]
    expected = [0 if r == victim else 1 for r in range(world)]

    def leave():
        touch(os.path.join(signals, "ready"))
        if how == "exit":
            os._exit(0)
        if how == "stall":  # alive, but never comes to its next call
            for r in survivors:
                wait_for_file(os.path.join(signals, f"done.{r}"), 60)
            os._exit(0)
        time.sleep(60)  # killed here
        os._exit(1)

    def wait_until_gone():
        wait_for_file(os.path.join(signals, "gone"), 60)

    def line_up(name, ranks):
        touch(os.path.join(signals, f"{name}.{rank}"))
        for r in ranks:
            wait_for_file(os.path.join(signals, f"{name}.{r}"), 60)

    def finish(report):
        line_up("done", survivors)
        print(json.dumps(report), flush=True)
        os._exit(0)  # the group lost a member: skip its teardown

    report = {"rank": rank}
    if when == "construct":
        line_up("inited", range(world))
        if rank == victim:
            leave()
        wait_until_gone()
        t0 = time.monotonic()
        try:
            Buffer(dist.group.WORLD)
            report["construct"] = "accepted"
        except RuntimeError as e:
            report["construct"] = str(e)
        report["construct_seconds"] = time.monotonic() - t0
        finish(report)
    buf = Buffer(dist.group.WORLD)
    if when == "dispatch":
        if rank == victim:
            leave()
        wait_until_gone()
        report["first"] = run_round(buf, rank, world, 0, num_experts, active, False, GONE_TIMEOUT_US)
    else:
        run_round(buf, rank, world, 0, num_experts, active, False, CALM_TIMEOUT_US)
        assert active.tolist() == [1] * world, active
        line_up("round1", range(world))
        report["first"] = run_round(buf, rank, world, 1, num_experts, active, False, GONE_TIMEOUT_US,
                                    between=leave if rank == victim else wait_until_gone)
    report["active"] = active.tolist()
    assert report["active"] == expected, report
    line_up("round2", survivors)
    report["next"] = run_round(buf, rank, world, 2, num_experts, active, True, CALM_TIMEOUT_US)
    assert active.tolist() == expected, active
    if victim == 0:
        try:
            buf.update_ep_member(timeout_s=10)
            report["update"] = "accepted"
        except StoreUnreachable as e:
            report["update"] = str(e)
        line_up("round3", survivors)
        report["after_update"] = run_round(buf, rank, world, 3, num_experts, active, False, CALM_TIMEOUT_US)
        assert active.tolist() == expected, active
    finish(report)


def main() -> int:
    rank, world, port, scenario = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if scenario in ("rejoin", "replacement"):
        return rejoin(rank, world, port, scenario)
    if scenario == "gone":
        return gone(rank, world, port)
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
        report["path"] = "gpu" if buf._gpu is not None else "cpu"
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
        # The survivors' timeout leaves room for a loaded machine (a survivor must not time out on another);
        # the victim sleeps well past it.
        if rank == victim:
            time.sleep(5)
            try:
                run_round(buf, rank, world, 1, num_experts, active, False, 1_000_000)
            except AssertionError:
                pass  # it missed its peers' combine answers: expected
        else:
            t0 = time.monotonic()
            run_round(buf, rank, world, 1, num_experts, active, False, 2_500_000)
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
        # 4 s: long enough that a survivor scheduled late on a loaded 2-core machine is not taken for dead.
        run_round(buf, rank, world, 1, num_experts, active, False, 4_000_000)
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
