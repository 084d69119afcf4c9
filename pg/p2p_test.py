"""Point-to-point operations, bad inputs (clear errors, no hang) and the CUDA backend on a CPU-only host."""

import pytest
import torch
import torch.distributed as dist

import mooncake.pg as pg
from mooncake.pg.testutil import exit_handshake, init, run_ranks

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.bool]


def pattern(dtype, n, salt):
    return (torch.arange(n) * 7 + salt).remainder(2 if dtype == torch.bool else 100).to(dtype)


def body_p2p(rank, world, port):
    init("mooncake-cpu", rank, world, port)
    gloo = dist.new_group(backend="gloo")
    right, left = (rank + 1) % world, (rank - 1) % world
    # ring with blocking send/recv, every dtype; the same exchange over gloo must agree
    for dtype in DTYPES:
        got, ref = torch.empty(1000, dtype=dtype), torch.empty(1000, dtype=dtype)
        for g, out in ((None, got), (gloo, ref)):
            if rank % 2 == 0:
                dist.send(pattern(dtype, 1000, rank), right, group=g)
                dist.recv(out, left, group=g)
            else:
                dist.recv(out, left, group=g)
                dist.send(pattern(dtype, 1000, rank), right, group=g)
        assert torch.equal(got, ref) and torch.equal(got, pattern(dtype, 1000, left)), dtype
    # isend/irecv issued in the same order on every rank, larger than the slots (several chunks)
    big = torch.arange(3_000_000, dtype=torch.float32) + rank
    into = torch.empty_like(big)
    works = [dist.isend(big, right), dist.irecv(into, left)]
    for w in works:
        w.wait()
    assert torch.equal(into, torch.arange(3_000_000, dtype=torch.float32) + left)
    # batch_isend_irecv, non-contiguous receive buffer
    nc = torch.empty(6, 4).t()
    ops = [dist.P2POp(dist.isend, torch.full((4, 6), float(rank)), right),
           dist.P2POp(dist.irecv, nc, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(nc, torch.full((4, 6), float(left)))
    exit_handshake(rank, world)


def body_bad_inputs(rank, world, port):
    init("mooncake-cpu", rank, world, port)
    pg.set_collective_timeout_us(3_000_000)
    # mismatched shapes: named, on every rank, within the timeout
    t = torch.ones(10 + rank)
    with pytest.raises(Exception, match="mismatched|elements"):
        dist.all_reduce(t)
    # mismatched dtypes for all_gather_into_tensor
    x = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
    with pytest.raises(Exception, match="mismatched"):
        dist.all_gather_into_tensor(torch.empty(4 * world, dtype=x.dtype), x)
    dist.barrier()
    # wrong splits: refused locally, before any data moves
    with pytest.raises(ValueError, match="splits"):
        dist.all_to_all_single(torch.empty(4), torch.empty(4), [1, 1], [5, 1])
    # invalid peer ranks
    with pytest.raises((ValueError, RuntimeError)):
        dist.send(torch.ones(1), world + 3)
    with pytest.raises(ValueError, match="invalid peer"):
        dist.group.WORLD.send([torch.ones(1)], rank, 0)
    with pytest.raises(ValueError, match="all_gather needs"):
        dist.all_gather([torch.empty(1)], torch.ones(1))
    with pytest.raises(ValueError, match="AVG"):
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG)
    with pytest.raises(ValueError, match="auto_sync_on_failure"):
        pg.MooncakeBackendOptions(world, False, False, True)
    # the group still works after all that
    t = torch.ones(5)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(world)))
    exit_handshake(rank, world)


def body_cuda_backend(rank, world, port):
    with pytest.raises(RuntimeError, match="CUDA, which is not available"):
        init("mooncake", rank, world, port)
    return True


@pytest.mark.parametrize("world", [2, 3])
def test_p2p(world):
    run_ranks(body_p2p, world)


def test_bad_inputs():
    run_ranks(body_bad_inputs, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_backend_refused_without_cuda():
    assert run_ranks(body_cuda_backend, 1) == {0: True}
