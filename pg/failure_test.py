"""Failure handling: a rank dies (before / during a collective, rank 0 too); the survivors' operation fails
within the timeout naming it, they agree on the healthy set and continue; a replacement process rejoins."""

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

import mooncake.pg as pg
from mooncake.pg.testutil import exit_handshake, init, run_ranks

TIMEOUT_S = 3.0


def setup(rank, world, port, **options):
    init("mooncake-cpu", rank, world, port, pg_options=pg.MooncakeBackendOptions(world, False, **options))
    pg.set_collective_timeout_us(int(TIMEOUT_S * 1e6))
    t = torch.ones(4)
    dist.all_reduce(t)  # the group works before anyone dies
    assert t[0].item() == world


def expect_failure(t, dead):
    """all_reduce(t) fails within the timeout, naming `dead`; returns the elapsed seconds."""
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    with pytest.raises(pg.MooncakeOpError) as err:
        work.wait()
    elapsed = time.monotonic() - start
    assert pg.get_failed_ranks_hint(work) == dead and not pg.get_local_success(work), err.value
    assert f"{dead}" in str(err.value)
    assert elapsed < TIMEOUT_S + 2, elapsed
    return elapsed


def check_sum(ranks, n=1000):
    t = torch.full((n,), 1.0) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    want = float(sum(r + 1 for r in ranks))
    assert torch.equal(t, torch.full((n,), want)), (t[:4], want)


def body_dies_before(rank, world, port, victim):
    setup(rank, world, port)
    if rank == victim:
        os._exit(0)
    expect_failure(torch.ones(10), [victim])
    survivors = [r for r in range(world) if r != victim]
    assert pg.get_active_ranks(dist.group.WORLD) == survivors
    assert pg.get_current_epoch(dist.group.WORLD) == 1
    assert pg.get_peer_state(dist.group.WORLD, [victim, rank]) == [False, True]
    check_sum(survivors)
    check_sum(survivors, n=1 << 20)  # the two-phase path too
    with pytest.raises(ValueError, match="inactive"):
        dist.send(torch.ones(1), victim)
    with pytest.raises(ValueError, match="not active"):
        dist.broadcast(torch.ones(1), src=victim)
    dist.barrier()
    if victim != 0:
        exit_handshake(rank, world, survivors)
    return True


def body_dies_during(rank, world, port):
    setup(rank, world, port)
    victim = world - 1
    big = torch.ones(8 << 20)  # 32 MiB: many chunks
    store = dist.distributed_c10d._get_default_store()
    if rank == victim:
        def die():
            store.set("victim_dies", "1")
            os._exit(0)

        threading.Timer(0.2, die).start()
        dist.all_reduce(big)  # the others join only once it died: this rank dies in the middle
        time.sleep(5)
        os._exit(0)
    store.wait(["victim_dies"])  # not a fixed delay: the victim may leave setup() late on a loaded machine
    time.sleep(0.1)
    expect_failure(big, [victim])
    check_sum(range(world - 1))
    exit_handshake(rank, world, range(world - 1))
    return True


def body_rejoin(rank, world, port, joined):
    setup(rank, world, port)
    victim = world - 1
    if rank == victim:
        os._exit(0)
    expect_failure(torch.ones(10), [victim])
    joined.wait(30)  # the replacement process is in join_group now
    resp = pg.recover_ranks(dist.group.WORLD, [victim])
    assert resp.status == pg.ProposalStatus.Applied, resp
    check_sum(range(world))
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    assert [o[0].item() for o in outs] == list(range(world))
    exit_handshake(rank, world)
    return pg.get_current_epoch(dist.group.WORLD)


def body_replacement(key, world, port, rank, joined):
    time.sleep(1.5)  # well after the original died
    init("mooncake-cpu", rank, world, port, pg_options=pg.MooncakeBackendOptions(world, True))
    pg.set_collective_timeout_us(int(TIMEOUT_S * 1e6))
    t = torch.ones(3)
    dist.all_reduce(t)  # before join_group: local only
    assert t[0].item() == 1.0
    joined.set()
    pg.join_group(dist.group.WORLD, timeout_s=30)
    assert pg.get_active_ranks(dist.group.WORLD) == list(range(world))
    check_sum(range(world))
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    assert [o[0].item() for o in outs] == list(range(world))
    exit_handshake(rank, world)
    return pg.get_current_epoch(dist.group.WORLD)


def body_busy_rank(rank, world, port):
    """Rank 2 is alive (its engine answers probes) but does not reach the collective; rank 1 reaches it 1 s
    after rank 0. Rank 0 times out on rank 2 and starts a resync; rank 1, which has no evidence of its own,
    waits a full round for rank 2 before it proposes the same view. Rank 0 must wait for it instead of
    dropping the healthy rank 1 too."""
    setup(rank, world, port)
    if rank == 2:
        time.sleep(4 * TIMEOUT_S)
        os._exit(0)
    time.sleep(1.0 if rank == 1 else 0.0)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    with pytest.raises(pg.MooncakeOpError):
        work.wait()
    assert pg.get_failed_ranks_hint(work) == [2], pg.get_failed_ranks_hint(work)
    assert pg.get_active_ranks(dist.group.WORLD) == [0, 1]
    check_sum([0, 1])
    exit_handshake(rank, world, [0, 1])
    return pg.get_current_epoch(dist.group.WORLD)


def body_manual_policy(rank, world, port):
    """auto_sync off: the failure is reported, the group changes only when asked."""
    setup(rank, world, port, auto_deactivate_on_failure=True, auto_sync_on_failure=False)
    victim = world - 1
    if rank == victim:
        os._exit(0)
    expect_failure(torch.ones(10), [victim])
    assert pg.get_peer_state(dist.group.WORLD, [victim]) == [False]  # seen failing: not ready
    pg.set_p2p_timeout_us(2_000_000)
    start, work = time.monotonic(), dist.irecv(torch.empty(1), victim)  # still active: fails in time
    with pytest.raises(pg.MooncakeOpError, match=f"{[victim]}"):
        work.wait()
    assert pg.get_failed_ranks_hint(work) == [victim] and time.monotonic() - start < 4
    assert pg.get_active_ranks(dist.group.WORLD) == list(range(world))
    resp = pg.sync_after_failure(dist.group.WORLD)
    assert resp.status == pg.SyncAfterFailureStatus.Reconciled, resp
    assert pg.sync_after_failure(dist.group.WORLD).status == pg.SyncAfterFailureStatus.NoPending
    assert pg.get_active_ranks(dist.group.WORLD) == list(range(world - 1))
    check_sum(range(world - 1))
    # explicit deactivation of a live rank, then its re-activation
    if rank == 0:
        assert pg.deactivate_ranks(dist.group.WORLD, [1]).status == pg.ProposalStatus.Applied
        assert pg.deactivate_ranks(dist.group.WORLD, [99]).status == pg.ProposalStatus.Rejected
    dist.group.WORLD.barrier() if rank != 1 else None
    exit_handshake(rank, world, range(world - 1))
    return True


def body_skewed_entry(rank, world, port, warm, late, skew):
    """After rank 1 died, the survivors start the same collective `skew` seconds apart (the late one finds
    the early one's resync request on entry): both fail that collective, agree on the same view and run
    the next ones in it; the late one must not time out on the early one and drop it."""
    if warm:
        setup(rank, world, port)
    else:  # no collective before the failure
        init("mooncake-cpu", rank, world, port, pg_options=pg.MooncakeBackendOptions(world))
        pg.set_collective_timeout_us(int(TIMEOUT_S * 1e6))
    if rank == 1:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0 + (skew if rank == late else 0))
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(4), async_op=True)
    with pytest.raises(pg.MooncakeOpError):
        work.wait()
    elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT_S + 2, elapsed
    outcome = (pg.get_active_ranks(dist.group.WORLD), pg.get_current_epoch(dist.group.WORLD),
               pg.get_failed_ranks_hint(work))
    check_sum([0, 2])  # the next operations run in the new view on both survivors
    outs = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    assert [o[0].item() for o in outs] == [0.0, 0.0, 2.0]  # the inactive rank's output is left as it was
    exit_handshake(rank, world, [0, 2])
    return outcome


# Cold, the early rank's write to the dead one fails at once; warm (same host: shared memory), the early rank
# finds the death by probing after 0.5 s, so the late rank is later than that only with skew 1.0.
@pytest.mark.parametrize("warm,late,skew", [(False, 2, 0.0), (False, 2, 0.1), (False, 2, 0.5), (False, 0, 0.5),
                                            (True, 2, 0.0), (True, 2, 0.1), (True, 2, 0.5), (True, 2, 1.0)])
def test_survivors_enter_collective_apart(warm, late, skew):
    res = run_ranks(body_skewed_entry, 3, warm, late, skew, may_die=(1,), timeout=40)
    assert res[0] == res[2] == ([0, 2], 1, [1]), res


@pytest.mark.parametrize("world,victim", [(3, 2), (3, 0), (4, 1)])
def test_rank_dies_before_collective(world, victim):
    res = run_ranks(body_dies_before, world, victim, may_die=(victim,))
    assert sorted(res) == [r for r in range(world) if r != victim]


def test_rank_dies_during_collective():
    run_ranks(body_dies_during, 3, may_die=(2,))


def test_replacement_rejoins():
    joined = mp.get_context("fork").Event()
    res = run_ranks(body_rejoin, 3, joined, may_die=(2,), extra=[(body_replacement, 10, (2, joined))])
    assert res[0] == res[1] == res[10] == 2  # epoch 1: rank 2 dropped; epoch 2: it rejoined


def test_busy_rank_is_dropped_and_only_it():
    res = run_ranks(body_busy_rank, 3, may_die=(2,), timeout=60)
    assert res[0] == res[1] == 1


def test_manual_policy():
    run_ranks(body_manual_policy, 3, may_die=(2,))
