"""Multi-process dispatch/combine against a plain-torch reference: random and uneven routing, masked slots,
bf16 and fp8, bad inputs, a stalled rank (timed out, then recovered) and a killed rank."""

import json

import pytest

from mooncake.ep.testing import run_ranks


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
        assert r["round1_seconds"] < 8
    for _, out, _ in reports:
        assert json.loads(out)["active_after_recovery"] == [1, 1, 1]


def test_killed_rank_is_dropped_within_the_timeout():
    reports = run_ranks(3, "killed")
    for rc, out, err in reports[:2]:
        assert rc == 0, err[-3000:]
        r = json.loads(out)
        assert r["active"] == [1, 1, 0] and r["round1_seconds"] < 8  # the 4 s timeout plus bounded set-up
