"""Collective algorithms of Mooncake PG on top of `Mesh.exchange` (see transport.py).

Every function takes `ctx` (a `Ctx`: the mesh, this rank, the sorted list of active group ranks, the
deadline and the abort hook) and contiguous CPU tensors; callers make non-contiguous tensors contiguous
and copy results back. Only active members take part; outputs at positions of inactive ranks are left as
they are. Results are identical on every rank (reductions whose result all ranks see are done by one rank
or in member order).
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch.distributed import ReduceOp

from .transport import COLL

SMALL_ALLREDUCE = 64 << 10  # bytes; below this all_reduce is one all-to-all exchange instead of two phases

# Message kinds: both sides of an exchange must agree (a mismatch is reported instead of corrupting data).
K_BCAST, K_RS, K_AG, K_AR_SMALL, K_REDUCE, K_GATHER, K_SCATTER, K_A2A, K_BARRIER, K_RSCAT = range(1, 11)


@dataclass
class Ctx:
    mesh: object
    rank: int
    members: list  # sorted active group ranks (includes rank)
    deadline: float
    abort: object = None

    def exchange(self, sends, recvs, kind):
        self.mesh.exchange(COLL, sends, recvs, kind, self.deadline, self.abort)

    @property
    def others(self):
        return [m for m in self.members if m != self.rank]


def as_bytes(t):
    """The bytes of a contiguous tensor as a flat uint8 tensor (no copy)."""
    return t.reshape(-1).view(torch.uint8)


# Copies and reductions run on numpy views: numpy is single-threaded, while torch's OpenMP workers spin
# after each parallel region and starve the peer processes on a small machine (1 MiB all_reduce on 2
# cores: 6.8 ms with torch ops, 0.17 ms without). bfloat16 (no numpy type) falls back to torch.
_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.int8: np.int8,
       torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8,
       torch.bool: np.bool_}


def np_bytes(t):
    """as_bytes(t) as a numpy array (no copy)."""
    return as_bytes(t).numpy()


def local_copy(dst, src):
    """dst <- src for contiguous tensors of the same size and dtype (single-threaded memcpy)."""
    if dst.data_ptr() != src.data_ptr():
        np.copyto(np_bytes(dst), np_bytes(src))


def copy_into(dst):
    """consume() that copies the received bytes into the contiguous tensor dst."""
    dst_b = np_bytes(dst)

    def consume(off, view):
        np.copyto(dst_b[off:off + view.size], view)

    return consume


def _binary(op, dtype):
    """fn(a, b): a <- a (op) b in place, for contiguous flat tensors of `dtype`; AVG is SUM here (callers
    divide with `finish_avg`)."""
    kind = op.op if hasattr(op, "op") else op
    is_bool = dtype == torch.bool
    table = {  # (numpy ufunc, torch function)
        ReduceOp.SUM: (np.logical_or, torch.logical_or) if is_bool else (np.add, torch.add),
        ReduceOp.AVG: (np.add, torch.add),
        ReduceOp.PRODUCT: (np.logical_and, torch.logical_and) if is_bool else (np.multiply, torch.mul),
        ReduceOp.MIN: (np.minimum, torch.minimum),
        ReduceOp.MAX: (np.maximum, torch.maximum),
        ReduceOp.BAND: (np.bitwise_and, torch.bitwise_and),
        ReduceOp.BOR: (np.bitwise_or, torch.bitwise_or),
        ReduceOp.BXOR: (np.bitwise_xor, torch.bitwise_xor),
    }
    if kind not in table:
        raise ValueError(f"mooncake pg: unsupported reduce op {kind}")
    if kind == ReduceOp.AVG and not dtype.is_floating_point:
        raise ValueError(f"mooncake pg: ReduceOp.AVG needs a floating-point tensor, got {dtype}")
    if kind in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and dtype.is_floating_point:
        raise ValueError(f"mooncake pg: bitwise reduce op on {dtype}")
    ufunc, tfn = table[kind]
    if dtype not in _NP:
        return lambda a, b: tfn(a, b, out=a)

    def fn(a, b):
        with np.errstate(all="ignore"):  # overflow wraps / saturates silently, as with torch
            ufunc(a.numpy(), b.numpy(), out=a.numpy())

    return fn


def finish_avg(op, t, count):
    """For ReduceOp.AVG: t /= count (in place; t is floating point)."""
    if (op.op if hasattr(op, "op") else op) != ReduceOp.AVG:
        return
    if t.dtype in _NP:
        np.divide(t.numpy(), count, out=t.numpy())
    else:
        t.div_(count)


def _reduce_into(dst, fn):
    """consume() that folds the received elements into the contiguous tensor dst with fn."""
    flat, esize, dtype = dst.reshape(-1), dst.element_size(), dst.dtype

    def consume(off, view):
        b = torch.from_numpy(view).view(dtype)
        fn(flat[off // esize: off // esize + b.numel()], b)

    return consume


def _parts(n, count):
    """Element ranges splitting n elements into `count` nearly equal contiguous parts."""
    base, extra = divmod(n, count)
    bounds, start = [], 0
    for i in range(count):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _fold_in_order(ctx, dst, contributions, fn):
    """dst <- contributions folded in member order (identical on all ranks)."""
    first = True
    for m in ctx.members:
        if first:
            local_copy(dst, contributions[m])
            first = False
        else:
            fn(dst, contributions[m])


def broadcast(ctx, t, root):
    if ctx.rank == root:
        ctx.exchange({m: as_bytes(t) for m in ctx.others}, {}, K_BCAST)
    else:
        ctx.exchange({}, {root: (t.numel() * t.element_size(), copy_into(t))}, K_BCAST)


def all_reduce(ctx, t, op):
    """In place: small tensors are sent whole to everyone and folded in member order; large ones are
    reduce-scattered (part i reduced by member i) and then all-gathered."""
    fn = _binary(op, t.dtype)
    count = len(ctx.members)
    flat = t.reshape(-1)
    if count > 1 and t.numel() * t.element_size() <= SMALL_ALLREDUCE:
        recv = {m: torch.empty_like(flat) for m in ctx.others}
        recv[ctx.rank] = torch.empty_like(flat)
        local_copy(recv[ctx.rank], flat)
        ctx.exchange({m: as_bytes(flat) for m in ctx.others},
                     {m: (recv[m].numel() * t.element_size(), copy_into(recv[m])) for m in ctx.others},
                     K_AR_SMALL)
        _fold_in_order(ctx, flat, recv, fn)
    elif count > 1:
        bounds = _parts(flat.numel(), count)
        part = {m: flat[bounds[i][0]:bounds[i][1]] for i, m in enumerate(ctx.members)}
        mine = part[ctx.rank]
        ctx.exchange({m: as_bytes(part[m]) for m in ctx.others},
                     {m: (mine.numel() * t.element_size(), _reduce_into(mine, fn)) for m in ctx.others},
                     K_RS)
        finish_avg(op, mine, count)
        ctx.exchange({m: as_bytes(mine) for m in ctx.others},
                     {m: (part[m].numel() * t.element_size(), copy_into(part[m])) for m in ctx.others},
                     K_AG)
        return
    finish_avg(op, flat, count)


def all_gather(ctx, outputs, t):
    """outputs: {member: contiguous tensor shaped like t}."""
    nbytes = t.numel() * t.element_size()
    for m in ctx.members:
        if outputs[m].numel() * outputs[m].element_size() != nbytes:
            raise ValueError(f"mooncake pg: all_gather output for rank {m} has {outputs[m].numel()} elements, "
                             f"the input has {t.numel()}")
    ctx.exchange({m: as_bytes(t) for m in ctx.others},
                 {m: (nbytes, copy_into(outputs[m])) for m in ctx.others}, K_AG)
    local_copy(outputs[ctx.rank], t)


def reduce_scatter(ctx, out, inputs, op):
    """out <- op over members m of inputs_m[rank]; inputs: {member: contiguous tensor shaped like out}."""
    fn = _binary(op, out.dtype)
    nbytes = out.numel() * out.element_size()
    for m in ctx.members:
        if inputs[m].numel() != out.numel():
            raise ValueError(f"mooncake pg: reduce_scatter input for rank {m} has {inputs[m].numel()} elements, "
                             f"the output has {out.numel()}")
    recv = {m: torch.empty_like(out) for m in ctx.others}
    recv[ctx.rank] = inputs[ctx.rank]
    ctx.exchange({m: as_bytes(inputs[m]) for m in ctx.others},
                 {m: (nbytes, copy_into(recv[m])) for m in ctx.others}, K_RSCAT)
    _fold_in_order(ctx, out.reshape(-1), {m: r.reshape(-1) for m, r in recv.items()}, fn)
    finish_avg(op, out, len(ctx.members))


def reduce(ctx, t, root, op):
    fn = _binary(op, t.dtype)
    nbytes = t.numel() * t.element_size()
    if ctx.rank != root:
        ctx.exchange({root: as_bytes(t)}, {}, K_REDUCE)
        return
    recv = {m: torch.empty_like(t) for m in ctx.others}
    recv[ctx.rank] = torch.empty_like(t)
    local_copy(recv[ctx.rank], t)
    ctx.exchange({}, {m: (nbytes, copy_into(recv[m])) for m in ctx.others}, K_REDUCE)
    _fold_in_order(ctx, t.reshape(-1), {m: r.reshape(-1) for m, r in recv.items()}, fn)
    finish_avg(op, t, len(ctx.members))


def gather(ctx, outputs, t, root):
    """outputs: {member: contiguous tensor} on the root, ignored elsewhere."""
    nbytes = t.numel() * t.element_size()
    if ctx.rank != root:
        ctx.exchange({root: as_bytes(t)}, {}, K_GATHER)
        return
    ctx.exchange({}, {m: (nbytes, copy_into(outputs[m])) for m in ctx.others}, K_GATHER)
    local_copy(outputs[root], t)


def scatter(ctx, out, inputs, root):
    """inputs: {member: contiguous tensor} on the root."""
    if ctx.rank == root:
        for m in ctx.members:
            if inputs[m].numel() != out.numel():
                raise ValueError(f"mooncake pg: scatter input for rank {m} has {inputs[m].numel()} elements, "
                                 f"the output has {out.numel()}")
        ctx.exchange({m: as_bytes(inputs[m]) for m in ctx.others}, {}, K_SCATTER)
        local_copy(out, inputs[root])
    else:
        ctx.exchange({}, {root: (out.numel() * out.element_size(), copy_into(out))}, K_SCATTER)


def all_to_all(ctx, outputs, inputs):
    """outputs/inputs: {member: contiguous tensor}; inputs[m] goes to m, outputs[m] comes from m."""
    ctx.exchange({m: as_bytes(inputs[m]) for m in ctx.others},
                 {m: (outputs[m].numel() * outputs[m].element_size(), copy_into(outputs[m]))
                  for m in ctx.others}, K_A2A)
    local_copy(outputs[ctx.rank], inputs[ctx.rank])


def barrier(ctx):
    empty = torch.empty(0, dtype=torch.uint8)
    ctx.exchange({m: empty for m in ctx.others}, {m: (0, copy_into(empty)) for m in ctx.others}, K_BARRIER)

