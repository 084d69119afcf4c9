"""Multi-process harness for Mooncake PG tests (not part of the public API).

`run_ranks(fn, world, ...)` forks `world` processes (fork: children skip the slow `import torch`) that run
fn(rank, world, port, *args) and returns their results by rank. Bounded: processes still running at the
deadline are killed and the test fails, naming them. A rank may be listed in `may_die` (it kills itself).
"""

import os
import socket
import time
import traceback
import multiprocessing as mp

import torch.distributed as dist


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(backend, rank, world, port, pg_options=None, timeout_s=60):
    import datetime

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            pg_options=pg_options, timeout=datetime.timedelta(seconds=timeout_s))


def exit_handshake(rank, world, ranks=None):
    """Rank 0 hosts the TCPStore: it leaves only after the others said they are done."""
    store = dist.distributed_c10d._get_default_store()
    ranks = range(world) if ranks is None else ranks
    if rank != 0:
        store.set(f"exit/{rank}", "1")
    else:
        store.wait([f"exit/{r}" for r in ranks if r != 0])


def _entry(fn, rank, world, port, q, args):
    try:
        q.put((rank, True, fn(rank, world, port, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, False, traceback.format_exc()))
    q.close()
    q.join_thread()
    os._exit(0)


def run_ranks(fn, world, *args, timeout=90, may_die=(), extra=None):
    """Run fn in `world` processes, plus `extra`: (fn, key, args) jobs started alongside, called as
    fn(key, world, port, *args) and reported under `key` (use keys >= world)."""
    port = free_port()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    jobs = [(fn, r, args) for r in range(world)] + list(extra or [])
    procs = {}
    for f, r, a in jobs:
        p = ctx.Process(target=_entry, args=(f, r, world, port, q, a), daemon=True)
        p.start()
        procs[r] = p
    results, errors = {}, {}
    deadline = time.monotonic() + timeout
    waiting = {r for r in procs if r not in may_die}
    while waiting and time.monotonic() < deadline:
        try:
            rank, ok, value = q.get(timeout=0.5)
        except Exception:  # noqa: BLE001 - queue.Empty
            continue
        (results if ok else errors)[rank] = value
        waiting.discard(rank)
    for p in procs.values():
        p.join(timeout=max(0.1, min(5, deadline - time.monotonic())))
        if p.is_alive():
            p.kill()
    if errors:
        raise AssertionError("\n".join(f"rank {r} failed:\n{e}" for r, e in sorted(errors.items())))
    if waiting:
        raise AssertionError(f"ranks {sorted(waiting)} did not finish within {timeout} s")
    return results
