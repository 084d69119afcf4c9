"""Chaos soak: HTTP metadata, two pool clients (segments, fixed ``local_hostname``) and two workers, all under
put / batch_put_from / get / get_into load, while a seeded schedule SIGKILLs a pool client and restarts it
under its old name, pauses a worker (SIGSTOP / SIGCONT) and kills and restarts the master. No process may
die on its own (a restarted client once died of SIGSEGV copying from its dead predecessor's segment, which
carries the same name), no read may return other bytes than were put, and every restarted client sets up.

Longer runs: ``python -m mooncake.store.client.chaos_test --seconds 120 --seed 5``.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time

from mooncake.http_metadata_server import HttpMetadataServer
from mooncake.store.client.testing import SoakWorker
from mooncake.store.master.testing import MasterProcess

_MASTER_FLAGS = ("--log_level=ERROR", "--client_ttl=3", "--default_kv_lease_ttl=1000")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_chaos(seconds: float, seed: int, segment: str = "32MB") -> dict:
    """Returns {"crashes": [(who, returncode)] (one per dead instance), "bad": n, "setup_failures": [...],
    "events": [...], "summaries": n}."""
    rng = random.Random(seed)
    port = _free_port()
    meta = HttpMetadataServer("127.0.0.1", 0).start()
    master = MasterProcess(*_MASTER_FLAGS, f"--port={port}")
    end = time.monotonic() + seconds
    out = {"crashes": [], "bad": 0, "setup_failures": [], "events": [], "summaries": 0}
    procs: dict[str, SoakWorker] = {}
    finished: list[tuple[str, SoakWorker]] = []  # instances stopped by the schedule (killed: no summary)
    crashed: set[int] = set()

    def crash(who: str, w: SoakWorker, rc: int) -> None:  # each instance counted once
        if id(w) not in crashed:
            crashed.add(id(w))
            out["crashes"].append((who, rc))

    def start(who: str, n: int, **flags) -> None:
        left = end - time.monotonic()
        w = SoakWorker(master.address, max(1.0, left), seed * 1000 + n, metadata=meta.url, prefix=f"{who}.{n}",
                       **flags)
        if not w.ready.get("ready"):
            out["setup_failures"].append((who, w.ready))
        procs[who] = w

    try:
        pools = {f"pool{i}": f"127.0.0.1:{_free_port()}" for i in range(2)}
        for i, (who, host) in enumerate(pools.items()):
            start(who, i, hostname=host, segment=segment)
        for i in range(2):
            start(f"worker{i}", 10 + i, segment="8MB")
        n = 100
        while time.monotonic() < end - 4:
            time.sleep(rng.uniform(1.0, 3.0))
            for who, w in procs.items():  # nobody may have died on its own
                if w.returncode is not None:
                    crash(who, w, w.returncode)
            kind = rng.choice(("pool", "pool", "pause", "master"))
            out["events"].append(kind)
            if kind == "pool":
                who = rng.choice(sorted(pools))
                procs[who].kill()
                finished.append((who, procs.pop(who)))
                n += 1
                start(who, n, hostname=pools[who], segment=segment)  # same name as the dead one
            elif kind == "pause":
                w = procs[rng.choice(("worker0", "worker1"))]
                w.pause()
                time.sleep(rng.uniform(0.3, 4.0))  # past client_ttl at times: expired, remounted
                w.resume()
            else:
                master.kill()
                time.sleep(rng.uniform(0.2, 1.0))
                master = MasterProcess(*_MASTER_FLAGS, f"--port={port}")
        for who, w in procs.items():
            if not w.ready.get("ready"):
                continue
            try:
                res = w.result(max(5.0, end - time.monotonic() + 60))
            except (TimeoutError, RuntimeError):
                crash(who, w, w.proc.wait(10))
                continue
            out["bad"] += res["bad"]
            out["summaries"] += 1
            rc = w.proc.wait(30)
            if rc != 0:
                crash(who, w, rc)
        for who, w in finished:
            if w.returncode not in (None, -9):  # it had died before the schedule killed it
                crash(who, w, w.returncode)
        return out
    finally:
        for w in list(procs.values()) + [w for _, w in finished]:
            w.stop()
        master.stop()
        meta.stop()


def test_chaos_restarted_clients_never_crash_or_read_wrong_bytes():
    out = run_chaos(seconds=40, seed=5)
    assert out["crashes"] == [], out
    assert out["setup_failures"] == [], out
    assert out["bad"] == 0, out
    assert out["events"].count("pool") >= 3, out  # the seeded schedule restarts pool clients
    assert out["summaries"] == 4, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--segment", default="128MB")
    args = p.parse_args(argv)
    print(json.dumps(run_chaos(args.seconds, args.seed, args.segment), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
