"""Store clients across master restarts: a master killed (SIGKILL) and restarted on the same port, over and over
on a seeded schedule, under put / batch_put_from / get / get_into load from two client processes. A call made
while the master is away waits and retries (within MC_RPC_TIMEOUT_MS, where retrying is safe) and succeeds
once it is back; reads never return wrong bytes; no client process dies.

Measurement: ``python -m mooncake.store.client.restart_test --restarts 7 --seconds 60`` prints the counts.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from mooncake.store.client.testing import SoakWorker
from mooncake.store.master.testing import MasterProcess

_MASTER_FLAGS = ("--log_level=ERROR",)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _merge(into: dict, counts: dict) -> None:
    for op, codes in counts.items():
        mine = into.setdefault(op, {})
        for code, n in codes.items():
            mine[code] = mine.get(code, 0) + n


def run_soak(restarts: int, seconds: float, seed: int, clients: int = 2, env: dict | None = None) -> dict:
    """Runs the soak; returns {"counts": {op: {code: n}}, "bad": n, "returncodes": [...], "restarts": n}."""
    rng = random.Random(seed)
    port = _free_port()
    master = MasterProcess(*_MASTER_FLAGS, f"--port={port}")
    workers = []
    try:
        workers = [SoakWorker(master.address, seconds, seed * 100 + i, prefix=f"c{i}", env=env)
                   for i in range(clients)]
        assert all(w.ready.get("ready") for w in workers), [w.ready for w in workers]
        start = time.monotonic()
        # Kills spread over the load's first 80 %; each master lives a while, dies, and comes back later.
        period = seconds * 0.8 / max(1, restarts)
        done = 0
        for _ in range(restarts):
            time.sleep(rng.uniform(0.5, 1.0) * max(0.0, period - 1.5))
            master.kill()
            time.sleep(rng.uniform(0.2, 1.0))
            master = MasterProcess(*_MASTER_FLAGS, f"--port={port}")
            done += 1
        counts, bad = {}, 0
        for w in workers:
            left = seconds - (time.monotonic() - start) + 60
            out = w.result(max(5.0, left))
            _merge(counts, out["counts"])
            bad += out["bad"]
        return {"counts": counts, "bad": bad, "returncodes": [w.proc.wait(30) for w in workers],
                "restarts": done}
    finally:
        for w in workers:
            w.stop()
        master.stop()


def failed(counts: dict, op: str) -> tuple[int, int]:
    """(failures, calls) of a put-like op: every non-zero result is a failure."""
    codes = counts.get(op, {})
    return sum(n for c, n in codes.items() if c != "0"), sum(codes.values())


def test_hold_outlasts_what_clients_trust():
    """A restarted master's hold on re-mounted memory must outlast every promise a client acts on without
    asking: a cached descriptor (core.TRUST_SEC) and a reserved block (reserved.FRESH_SEC)."""
    from mooncake.store.client import core, reserved
    from mooncake.store.common import master_client
    from mooncake.store.master import segments
    assert segments.REMOUNT_HOLD_SEC >= max(core.TRUST_SEC, reserved.FRESH_SEC) + 1.0
    assert master_client.RESTART_WAIT_SEC > segments.REMOUNT_HOLD_SEC


def test_puts_survive_master_restarts():
    out = run_soak(restarts=3, seconds=24, seed=20)
    assert out["returncodes"] == [0, 0], out
    assert out["bad"] == 0, out
    for op in ("put", "batch_put_from"):
        bad, total = failed(out["counts"], op)
        assert total > 100, out
        # Only a put caught in the middle (its start on the old master, its end on the new one) may fail:
        # a handful per restart, not the calls made while the master was away.
        assert bad <= 8 * out["restarts"], (op, bad, total, out)
    gets = out["counts"].get("get_into", {})
    assert not any(c in ("-900", "-901") for c in gets), out  # reads wait for the master too


def test_cached_descriptor_is_not_trusted_across_a_master_restart():
    """A reader whose heartbeat has not yet seen the restart must not read a cached descriptor's memory once
    the new master may have handed it to another object (it did: same segment, same offset, same size)."""
    from mooncake.store.client.store_worker import pattern
    from mooncake.store.client.testing import StoreWorker

    port = _free_port()
    flags = ("--client_ttl=60", "--default_kv_lease_ttl=10000", f"--port={port}")
    master = MasterProcess(*flags)
    procs = [master]
    try:
        pool = StoreWorker(master.address, "64MB", "8MB")
        writer = StoreWorker(master.address, "0", "8MB")
        reader = StoreWorker(master.address, "0", "8MB", env={"MC_STORE_HEARTBEAT_INTERVAL": "30"})
        procs += [pool, writer, reader]
        old, new = pattern(64 << 10, 1), pattern(64 << 10, 2)
        assert writer.call("put", "old", old) == 0
        assert reader.call("get", "old") == old  # cached: a 10 s lease
        master.kill()
        time.sleep(0.3)
        master = MasterProcess(*flags)
        procs.append(master)
        deadline = time.monotonic() + 30
        while writer.call("put", "new", new) != 0:  # where "old" was, once the pool has re-mounted
            assert time.monotonic() < deadline
        assert writer.call("get", "new") == new
        assert reader.call("get", "old") == b""  # gone with the old master; never the new object's bytes
    finally:
        for p in reversed(procs):
            p.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--restarts", type=int, default=7)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=20)
    args = p.parse_args(argv)
    out = run_soak(args.restarts, args.seconds, args.seed)
    summary = {op: "%d of %d failed" % failed(out["counts"], op) for op in ("put", "batch_put_from")}
    print(json.dumps({"summary": summary, **out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
