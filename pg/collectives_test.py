"""Every collective, reduce op and dtype of mooncake-cpu against gloo (same processes, same inputs), with
2, 3 and 4 processes; async work objects, non-contiguous tensors, subgroups, destroy and re-init, DDP."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import mooncake.pg  # noqa: F401  (registers the backends)
from mooncake.pg.testutil import exit_handshake, init, run_ranks

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.bool]
OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]


def make(dtype, rank, n, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g) * 2 + 0.5).to(dtype)
    return torch.randint(0, 4, (n,), generator=g).to(dtype)


def direct_reduce(tensors, op):
    """Reference reduction computed locally from every rank's input (for cases gloo does not support)."""
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            acc = acc | t if acc.dtype == torch.bool else acc + t
        elif op == ReduceOp.PRODUCT:
            acc = acc & t if acc.dtype == torch.bool else acc * t
        elif op == ReduceOp.MIN:
            acc = torch.minimum(acc, t)
        else:
            acc = torch.maximum(acc, t)
    return acc / len(tensors) if op == ReduceOp.AVG else acc


def check(got, want, what):
    if got.dtype.is_floating_point:
        tol = 1e-5 if got.dtype == torch.float32 else 2e-2
        ok = torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    assert ok, f"{what}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}"


def all_reduce_case(gloo, rank, world, dtype, op, n):
    """Expected all_reduce result: gloo's where it supports the case, else the direct reduction."""
    if op != ReduceOp.AVG and dtype != torch.bool:
        want = make(dtype, rank, n)
        try:
            dist.all_reduce(want, op=op, group=gloo)
            return want
        except RuntimeError:
            pass
    return direct_reduce([make(dtype, r, n) for r in range(world)], op)


def body_reductions(rank, world, port):
    init("mooncake-cpu", rank, world, port)
    gloo = dist.new_group(backend="gloo")
    for n in (5, 40_000):  # one-exchange path and reduce-scatter + all-gather path
        for dtype in DTYPES:
            for op in OPS:
                if op == ReduceOp.AVG and not dtype.is_floating_point:
                    t = make(dtype, rank, n)
                    with pytest.raises(ValueError, match="AVG"):
                        dist.all_reduce(t, op=op)
                    continue
                want = all_reduce_case(gloo, rank, world, dtype, op, n)
                t = make(dtype, rank, n)
                dist.all_reduce(t, op=op)
                check(t, want, f"all_reduce {dtype} {op} n={n}")
                if n == 5 and op in (ReduceOp.SUM, ReduceOp.MAX):
                    t = make(dtype, rank, n)
                    dist.reduce(t, dst=world - 1, op=op)
                    if rank == world - 1:
                        check(t, want, f"reduce {dtype} {op}")
                    out = torch.empty(n, dtype=dtype)
                    ins = [make(dtype, rank, n, salt=s) for s in range(world)]
                    dist.reduce_scatter(out, ins, op=op)
                    check(out, direct_reduce([make(dtype, r, n, salt=rank) for r in range(world)], op),
                          f"reduce_scatter {dtype} {op}")
    for dtype in (torch.int32, torch.int64, torch.uint8):  # bitwise ops
        for op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
            t, want = make(dtype, rank, 9), make(dtype, rank, 9)
            dist.all_reduce(t, op=op)
            dist.all_reduce(want, op=op, group=gloo)
            check(t, want, f"all_reduce {dtype} {op}")
    # reduce_scatter_tensor against gloo (float32 SUM)
    inp = make(torch.float32, rank, world * 1000)
    out, ref = torch.empty(1000), torch.empty(1000)
    dist.reduce_scatter_tensor(out, inp)
    dist.reduce_scatter_tensor(ref, inp, group=gloo)
    check(out, ref, "reduce_scatter_tensor")
    exit_handshake(rank, world)


def body_data_movement(rank, world, port):
    init("mooncake-cpu", rank, world, port)
    gloo = dist.new_group(backend="gloo")
    for dtype in DTYPES:
        for n in (3, 300_000):  # 300k elements: several chunks for the wider dtypes
            x = make(dtype, rank, n)
            outs, refs = [torch.empty(n, dtype=dtype) for _ in range(world)], [torch.empty(n, dtype=dtype)
                                                                              for _ in range(world)]
            dist.all_gather(outs, x)
            dist.all_gather(refs, x, group=gloo)
            for r in range(world):
                check(outs[r], refs[r], f"all_gather {dtype} from {r}")
            flat, ref = torch.empty(world * n, dtype=dtype), torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, x)
            dist.all_gather_into_tensor(ref, x, group=gloo)
            check(flat, ref, f"all_gather_into_tensor {dtype}")
            b, bref = make(dtype, rank, n), make(dtype, rank, n)
            dist.broadcast(b, src=1)
            dist.broadcast(bref, src=1, group=gloo)
            check(b, bref, f"broadcast {dtype}")
    # gather / scatter / all_to_all against gloo
    x = make(torch.float32, rank, 7)
    got = [torch.empty(7) for _ in range(world)] if rank == 0 else None
    ref = [torch.empty(7) for _ in range(world)] if rank == 0 else None
    dist.gather(x, got, dst=0)
    dist.gather(x, ref, dst=0, group=gloo)
    if rank == 0:
        for r in range(world):
            check(got[r], ref[r], "gather")
    parts = [make(torch.int64, 0, 4, salt=r) for r in range(world)] if rank == world - 1 else None
    out, oref = torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.int64)
    dist.scatter(out, parts, src=world - 1)
    dist.scatter(oref, parts, src=world - 1, group=gloo)
    check(out, oref, "scatter")
    ins = [make(torch.float32, rank, 3, salt=r) for r in range(world)]
    outs, refs = [torch.empty(3) for _ in range(world)], [torch.empty(3) for _ in range(world)]
    dist.all_to_all(outs, ins)
    dist.all_to_all(refs, ins, group=gloo)
    for r in range(world):
        check(outs[r], refs[r], "all_to_all")
    ins = [make(torch.float32, rank, 3 + r, salt=r) for r in range(world)]  # uneven (gloo refuses these)
    outs = [torch.empty(3 + rank) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        check(outs[r], make(torch.float32, r, 3 + rank, salt=rank), "uneven all_to_all")
    in_splits = [r + rank + 1 for r in range(world)]  # rank r gets r + rank + 1 rows from this rank
    out_splits = [rank + r + 1 for r in range(world)]
    src = make(torch.float32, rank, sum(in_splits) * 2).view(-1, 2)
    dst, dref = torch.empty(sum(out_splits), 2), torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(dst, src, out_splits, in_splits)
    dist.all_to_all_single(dref, src, out_splits, in_splits, group=gloo)
    check(dst, dref, "all_to_all_single with splits")
    even, eref = torch.empty(world * 2), torch.empty(world * 2)
    dist.all_to_all_single(even, make(torch.float32, rank, world * 2))
    dist.all_to_all_single(eref, make(torch.float32, rank, world * 2), group=gloo)
    check(even, eref, "all_to_all_single even")
    dist.barrier()
    exit_handshake(rank, world)


def body_work_layout_groups(rank, world, port):
    init("mooncake-cpu", rank, world, port)
    gloo = dist.new_group(backend="gloo")
    # async work objects and their futures
    t = torch.full((1000,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    assert work.get_future().wait()[0] is t and work.is_completed() and work.wait()
    check(t, torch.full((1000,), float(world * (world + 1) // 2)), "async all_reduce")
    assert mooncake.pg.get_local_success(work) and mooncake.pg.get_failed_ranks_hint(work) == []
    outs = [torch.empty(3) for _ in range(world)]
    dist.all_gather(outs, torch.full((3,), float(rank)), async_op=True).wait()
    assert [o[0].item() for o in outs] == list(range(world))
    # non-contiguous inputs and outputs
    base = make(torch.float32, rank, 64).view(8, 8)
    nc, ref = base.t(), base.t().contiguous()
    assert not nc.is_contiguous()
    dist.all_reduce(nc)
    dist.all_reduce(ref, group=gloo)
    check(nc.contiguous(), ref, "non-contiguous all_reduce")
    outs = [torch.empty(8, 8).t() for _ in range(world)]
    refs = [torch.empty(8, 8) for _ in range(world)]
    dist.all_gather(outs, base[:, ::2].contiguous().view(8, 4).repeat(1, 2).t())
    dist.all_gather(refs, base[:, ::2].contiguous().view(8, 4).repeat(1, 2).t().contiguous(), group=gloo)
    for r in range(world):
        check(outs[r].contiguous(), refs[r], "non-contiguous all_gather")
    # subgroups: the even ranks, and a group without rank 0
    for ranks in ([r for r in range(world) if r % 2 == 0], list(range(1, world))):
        sub = dist.new_group(ranks=ranks, backend="mooncake-cpu")
        if rank in ranks:
            t = torch.full((5,), float(rank))
            dist.all_reduce(t, group=sub)
            check(t, torch.full((5,), float(sum(ranks))), f"subgroup {ranks} all_reduce")
            b = torch.tensor([rank])
            dist.broadcast(b, src=ranks[-1], group=sub)
            assert b.item() == ranks[-1]
    exit_handshake(rank, world)
    dist.destroy_process_group()
    # re-init in the same processes (new store port: the old store went with rank 0's group)
    init("mooncake-cpu", rank, world, port + 1 if port + 1 < 65536 else port - 1)
    t = torch.ones(10)
    dist.all_reduce(t)
    check(t, torch.full((10,), float(world)), "all_reduce after re-init")
    exit_handshake(rank, world)
    dist.destroy_process_group()


def body_ddp(rank, world, port):
    """DistributedDataParallel (C++ reducer calling this Python backend) keeps replicas identical."""
    init("mooncake-cpu", rank, world, port)
    torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    model = torch.nn.Linear(8, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        loss = ddp(torch.randn(16, 8) * (rank + 1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    weights = [torch.empty_like(model.weight) for _ in range(world)]
    dist.all_gather(weights, model.weight.detach())
    assert all(torch.equal(weights[0], w) for w in weights)
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)]
    exit_handshake(rank, world)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_reductions(world):
    run_ranks(body_reductions, world)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_data_movement(world):
    run_ranks(body_data_movement, world)


@pytest.mark.parametrize("world", [2, 3])
def test_async_noncontiguous_subgroups_reinit(world):
    run_ranks(body_work_layout_groups, world)


def test_ddp_and_objects():
    run_ranks(body_ddp, 2)
