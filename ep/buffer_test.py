"""Multi-process dispatch/combine against a plain-torch reference: random and uneven routing, masked slots,
bf16 and fp8, bad inputs, a stalled rank (timed out, then recovered) and a killed rank."""

import json
import os
import socket
import subprocess
import sys

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, scenario, timeout=180, backend="gloo"):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MC_LOG_LEVEL": "ERROR",
           "MC_EP_TEST_BACKEND": backend}
    procs = [subprocess.Popen([sys.executable, "-m", "mooncake.ep.testing_worker", str(r), str(world), str(port),
                               scenario], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    reports = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        reports.append((p.returncode, out, err))
    return reports


@pytest.mark.parametrize("world,backend", [(2, "gloo"), (4, "gloo"), (2, "mooncake-cpu"), (4, "mooncake-cpu")])
def test_dispatch_combine_match_the_reference(world, backend):
    for rc, out, err in run_ranks(world, "basic", backend=backend):
        assert rc == 0, err[-3000:]
        assert json.loads(out)["active"] == [1] * world


def test_bad_inputs_are_refused_clearly():
    for rc, out, err in run_ranks(2, "errors"):
        assert rc == 0, err[-3000:]
        report = json.loads(out)
        for name in ("fp32", "hidden", "capacity", "experts", "active_shape", "noncontig"):
            assert report[name] != "accepted", name
        assert "bf16" in report["fp32"] and "128" in report["hidden"] and "exceed" in report["capacity"]


def test_stalled_rank_is_skipped_then_recovered():
    reports = run_ranks(3, "stall")
    for rc, out, err in reports:
        assert rc == 0, err[-3000:]
    survivors = [json.loads(out) for _, out, _ in reports[:2]]
    for r in survivors:
        assert r["active_after_stall"] == [1, 1, 0]
        assert r["round1_seconds"] < 6
    for _, out, _ in reports:
        assert json.loads(out)["active_after_recovery"] == [1, 1, 1]


def test_killed_rank_is_dropped_within_the_timeout():
    reports = run_ranks(3, "killed")
    for rc, out, err in reports[:2]:
        assert rc == 0, err[-3000:]
        r = json.loads(out)
        assert r["active"] == [1, 1, 0] and r["round1_seconds"] < 6
