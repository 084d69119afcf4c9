"""MooncakeBackendOptions with Mooncake's active-ranks mask and the calls SGLang makes on the group:
init_process_group / new_group with MooncakeBackendOptions(mask, recovered[, max_world_size]), collectives,
get_peer_state (polled until True), recover_ranks and join_group for a replacement, set_transfer_engine with
a shared engine; wrong options refused with a clear error, a deactivated rank's collectives refused."""

import multiprocessing as mp
import os
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import mooncake.pg as pg
from mooncake.pg.testutil import exit_handshake, init, run_ranks

TIMEOUT_S = 3.0


def sglang_mask(n, active):
    """The mask as SGLang builds it: zeros(n), then 1 for the first `active` ranks."""
    m = torch.zeros(n, dtype=torch.int32)
    m[:active] = 1
    return m


def check_collectives(rank, ranks, group=None):
    """all_reduce, all_gather and broadcast from every member of `ranks` (group ranks, all active)."""
    t = torch.full((8,), float(rank + 1))
    dist.all_reduce(t, group=group)
    assert torch.equal(t, torch.full((8,), float(sum(r + 1 for r in ranks)))), t
    n = dist.get_world_size(group)
    outs = [torch.full((3,), -1.0) for _ in range(n)]
    dist.all_gather(outs, torch.full((3,), float(rank)), group=group)
    assert [o.tolist() for o in outs] == [[float(r)] * 3 if r in ranks else [-1.0] * 3 for r in range(n)], outs
    for root in ranks:
        b = torch.full((4,), float(rank * 10))
        dist.broadcast(b, src=root, group=group)
        assert torch.equal(b, torch.full((4,), float(root * 10))), (root, b)


# --- options checked where they are built ------------------------------------------------------------
def test_options_forms():
    o = pg.MooncakeBackendOptions(sglang_mask(4, 2), True, 4)
    assert o.is_extension and o.max_group_size == 4 and o.initial_view(2, 2) == (4, {2})
    assert pg.MooncakeBackendOptions(sglang_mask(2, 2)).initial_view(0, 2) == (2, {0, 1})
    assert pg.MooncakeBackendOptions(sglang_mask(2, 2), False).initial_view(1, 2) == (2, {0, 1})
    o = pg.MooncakeBackendOptions(sglang_mask(4, 2), False, max_world_size=4)
    assert o.initial_view(1, 2) == (4, {0, 1})
    assert pg.MooncakeBackendOptions(3, False, True, False).auto_sync_on_failure is False
    assert pg.MooncakeBackendOptions(-1).initial_view(0, 3) == (3, {0, 1, 2})  # Mooncake's "unset"
    assert pg.MooncakeBackendOptions(torch.tensor([0, 1, 1], dtype=torch.int32)).initial_view(2, 3) == (3, {1, 2})


@pytest.mark.parametrize("args,kwargs,error,match", [
    (([0, 1],), {}, TypeError, "active_ranks .a\\s*torch.int32 tensor"),  # a list of rank ids is not the format
    ((torch.tensor([1, 1]),), {}, TypeError, "torch.int32.*int64"),
    ((torch.ones(2),), {}, TypeError, "torch.int32.*float32"),
    ((torch.ones(2, 2, dtype=torch.int32),), {}, ValueError, "1-D"),
    ((torch.zeros(0, dtype=torch.int32),), {}, ValueError, "1-D"),
    ((torch.tensor([1, 2], dtype=torch.int32),), {}, ValueError, "mask.*\\(1, 2\\)"),
    ((torch.tensor([0, 1, -1], dtype=torch.int32),), {}, ValueError, "\\(2, -1\\)"),
    ((sglang_mask(2, 2), False, 4), {}, ValueError, "2 entries but max_group_size is 4"),
    ((sglang_mask(2, 2), "yes"), {}, TypeError, "is_extension must be a bool"),
    ((sglang_mask(2, 2), False, 2, 3), {}, TypeError, "at most 3 positional"),
    ((2.5,), {}, TypeError, "max_group_size .an int"),
    ((2, False, False, True), {}, ValueError, "auto_sync_on_failure requires"),
    ((2,), {"max_world_size": 3}, TypeError, "both max_group_size and max_world_size"),
])
def test_bad_options_are_refused(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        pg.MooncakeBackendOptions(*args, **kwargs)


@pytest.mark.parametrize("options,rank,size,match", [
    (lambda: pg.MooncakeBackendOptions(sglang_mask(3, 2)), 0, 2, "3 entries; this group has 2 ranks"),
    (lambda: pg.MooncakeBackendOptions(sglang_mask(1, 1)), 0, 2, "1 entries; this group has 2 ranks"),
    (lambda: pg.MooncakeBackendOptions(sglang_mask(3, 3), False, 3), 0, 2, "slot\\(s\\) \\[2\\] active"),
    (lambda: pg.MooncakeBackendOptions(sglang_mask(2, 1)), 1, 2, "rank 1 is 0 in active_ranks"),
    (lambda: pg.MooncakeBackendOptions(1), 0, 2, "max_group_size 1 is smaller than the group"),
])
def test_options_that_do_not_fit_the_group(options, rank, size, match):
    with pytest.raises(ValueError, match=match):
        options().initial_view(rank, size)


def test_bad_timeouts_are_refused():
    for setter in (pg.set_collective_timeout_us, pg.set_p2p_timeout_us):
        with pytest.raises(ValueError, match="positive"):
            setter(0)
        with pytest.raises(ValueError, match="positive"):
            setter(-5)
        with pytest.raises(TypeError, match="takes an int"):
            setter("10s")


# --- SGLang's group creation and collectives ----------------------------------------------------------
def body_sglang_groups(rank, world, port):
    mask = sglang_mask(world, world)
    init("mooncake-cpu", rank, world, port, pg_options=pg.MooncakeBackendOptions(mask, False))
    check_collectives(rank, list(range(world)))
    assert pg.get_peer_state(dist.group.WORLD, list(range(world))) == [True] * world
    assert pg.get_peer_state(dist.group.WORLD, torch.tensor([0])) == [True]
    with pytest.raises(ValueError, match="invalid rank"):
        pg.get_peer_state(dist.group.WORLD, [world])
    assert mask.tolist() == [1] * world
    # new_group as SGLang's parallel_state calls it, with reserved slots (max_world_size)
    m4 = sglang_mask(world + 2, world)
    g = dist.new_group(list(range(world)), backend="mooncake-cpu", group_desc="sglang_cpu_group",
                       pg_options=pg.MooncakeBackendOptions(m4, False, world + 2))
    check_collectives(rank, list(range(world)), g)
    assert pg.get_peer_state(g, [world, world + 1]) == [False, False]  # empty slots
    resp = pg.recover_ranks(g, [world])
    assert resp.status == pg.ProposalStatus.Rejected and "reserved slots" in resp.reject_reason, resp
    # options that do not fit this group: refused on every rank, the group keeps working
    for bad, error, match in ((pg.MooncakeBackendOptions(sglang_mask(world + 1, world)), ValueError,
                               "entries; this group has"),
                              ({"active_ranks": mask}, TypeError, "must be a mooncake.pg.MooncakeBackendOptions")):
        with pytest.raises(error, match=match):
            dist.new_group(list(range(world)), backend="mooncake-cpu", pg_options=bad)
    # members that disagree on the mask: each finds out from the other's view when it looks it up
    mine = pg.MooncakeBackendOptions(world) if rank == 0 else pg.MooncakeBackendOptions(
        sglang_mask(world + 1, world), False, world + 1)
    with pytest.raises(ValueError, match="every member must pass the same"):
        dist.new_group(list(range(world)), backend="mooncake-cpu", pg_options=mine)
    check_collectives(rank, list(range(world)))
    # a deactivated rank: its collectives are refused (not run alone), until it is activated again
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        assert pg.deactivate_ranks(dist.group.WORLD, [1]).status == pg.ProposalStatus.Applied
        assert mask.tolist() == [1, 0]  # the view is mirrored into the caller's tensor
        store.set("opts/deactivated", "1")
        store.wait(["opts/refused"])
        t = torch.ones(2)
        dist.all_reduce(t)  # rank 0 alone now
        assert t.tolist() == [1.0, 1.0]
        assert pg.activate_ranks(dist.group.WORLD, [1]).status == pg.ProposalStatus.Applied
        store.set("opts/reactivated", "1")
    else:
        store.wait(["opts/deactivated"])
        with pytest.raises(RuntimeError, match="rank 1 is not active"):
            dist.all_reduce(torch.ones(2))
        assert mask.tolist() == [1, 0]
        store.set("opts/refused", "1")
        store.wait(["opts/reactivated"])
    check_collectives(rank, list(range(world)))
    assert mask.tolist() == [1, 1]
    exit_handshake(rank, world)
    return True


def test_sglang_group_calls():
    assert run_ranks(body_sglang_groups, 2) == {0: True, 1: True}


# --- recovery: the dead rank is replaced, polled with get_peer_state, recovered, joins ---------------
def body_survivor(rank, world, port, dead_seen, joined):
    mask = sglang_mask(world, world)
    init("mooncake-cpu", rank, world, port, pg_options=pg.MooncakeBackendOptions(mask, False))
    pg.set_collective_timeout_us(int(TIMEOUT_S * 1e6))
    check_collectives(rank, list(range(world)))
    victim = world - 1
    if rank == victim:
        os._exit(0)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    with pytest.raises(pg.MooncakeOpError):
        work.wait()
    assert pg.get_failed_ranks_hint(work) == [victim]
    assert mask.tolist() == [1] * (world - 1) + [0]
    assert pg.get_peer_state(dist.group.WORLD, [victim]) == [False]  # dead: not ready
    check_collectives(rank, list(range(world - 1)))
    dead_seen.set()
    deadline = time.monotonic() + 30
    while not all(pg.get_peer_state(dist.group.WORLD, [victim])):  # SGLang's poll
        assert time.monotonic() < deadline, "the replacement never became ready"
        time.sleep(0.05)
    resp = pg.recover_ranks(dist.group.WORLD, [victim])
    assert resp.status == pg.ProposalStatus.Applied, resp
    assert joined.wait(30)
    check_collectives(rank, list(range(world)))
    assert mask.tolist() == [1] * world
    exit_handshake(rank, world)
    return pg.get_current_epoch(dist.group.WORLD)


def body_replacement(key, world, port, rank, dead_seen, joined):
    assert dead_seen.wait(30)
    mask = sglang_mask(world, world)  # a recovered rank builds the same mask, with recovered_rank=True
    init("mooncake-cpu", rank, world, port, pg_options=pg.MooncakeBackendOptions(mask, True))
    pg.set_collective_timeout_us(int(TIMEOUT_S * 1e6))
    pg.join_group(dist.group.WORLD, timeout_s=30)
    joined.set()
    assert pg.get_active_ranks(dist.group.WORLD) == list(range(world))
    assert mask.tolist() == [1] * world
    check_collectives(rank, list(range(world)))
    exit_handshake(rank, world)
    return pg.get_current_epoch(dist.group.WORLD)


def test_sglang_recovery():
    ctx = mp.get_context("fork")
    dead_seen, joined = ctx.Event(), ctx.Event()
    res = run_ranks(body_survivor, 3, dead_seen, joined, may_die=(2,),
                    extra=[(body_replacement, 10, (2, dead_seen, joined))])
    assert res[0] == res[1] == res[10] == 2, res  # epoch 1: rank 2 dropped; epoch 2: its replacement active


# --- a transfer engine shared with the caller ---------------------------------------------------------
def body_shared_engine(rank, world, port):
    from mooncake.engine import TransferEngine

    with pytest.raises(TypeError, match="takes a mooncake.engine.TransferEngine"):
        pg.set_transfer_engine("127.0.0.1:1234")
    with pytest.raises(ValueError, match="not initialized"):
        pg.set_transfer_engine(TransferEngine())
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    with pytest.raises(TypeError, match="not get_engine"):
        pg.set_transfer_engine(engine.get_engine())
    pg.set_transfer_engine(engine)
    pg.set_transfer_engine(engine)  # the same engine again: nothing changes
    init("mooncake-cpu", rank, world, port, pg_options=pg.MooncakeBackendOptions(sglang_mask(world, world)))
    check_collectives(rank, list(range(world)))
    store = dist.distributed_c10d._get_default_store()
    segment = engine.get_local_segment_name()
    mesh = dist.group.WORLD.mesh
    assert mesh.engine is engine and mesh.proc.segment == segment  # the group's region lives in this engine
    other = TransferEngine()
    assert other.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    with pytest.raises(RuntimeError, match="before the first Mooncake"):
        pg.set_transfer_engine(other)
    other.close()
    # the caller keeps using the engine for its own transfers (as SGLang's KV transfer does)
    buf = np.zeros(1 << 16, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    store.set(f"own/{rank}", f"{segment}@{buf.ctypes.data}")
    peer = 1 - rank
    peer_segment, peer_addr = store.get(f"own/{peer}").decode().rsplit("@", 1)
    assert mesh.peer(peer)[0] == peer_segment  # and the peer's group region lives in the peer's engine
    src = np.full(1 << 16, rank + 1, dtype=np.uint8)
    assert engine.register_memory(src.ctypes.data, src.nbytes) == 0
    assert engine.transfer_sync_write(peer_segment, src.ctypes.data, int(peer_addr), src.nbytes) == 0
    dist.barrier()
    assert (buf == peer + 1).all()
    check_collectives(rank, list(range(world)))
    exit_handshake(rank, world)
    return True


def test_shared_transfer_engine():
    assert run_ranks(body_shared_engine, 2) == {0: True, 1: True}
