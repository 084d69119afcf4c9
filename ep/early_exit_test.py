"""A rank that leaves early: after constructing its Buffer but before its first dispatch, or between a dispatch
and its combine; by os._exit or SIGKILL; a plain rank or rank 0, which hosts the process group's store. Every
survivor's dispatch and combine return within the timeout (plus a bounded set-up time for the first dispatch),
with the victim set to 0 in active_ranks, its tokens not received and its experts contributing nothing to the
combine; the next round skips it without waiting. Without the store, update_ep_member fails clearly and a
Buffer constructed after rank 0 left fails clearly at once (no peer can be learnt): neither hangs.

The ranks run ep/testing_worker.py (scenario "gone"); this test ends the victim (or waits for its os._exit;
a stalled victim stays alive), then tells the survivors through a file in a temporary folder.
"""

import signal
import time

import pytest

from mooncake.ep.testing import Ranks, free_port
from mooncake.ep.testing_worker import GONE_TIMEOUT_US

WORLD = 4
DEADLINE_S = 100  # per case; the target's Bazel timeout (medium) leaves room for all of them
SLACK_S = 8  # a call's own work on a loaded 2-core machine, and the first dispatch's set-up
TIMEOUT_S = GONE_TIMEOUT_US / 1e6  # the calls that lose the victim; the others' timeout is 30 s


@pytest.mark.parametrize("victim,when,how,backend,gpu", [
    (3, "dispatch", "exit", "mooncake-cpu", False),
    (3, "dispatch", "kill", "mooncake-cpu", False),
    (3, "combine", "kill", "mooncake-cpu", False),
    (2, "dispatch", "stall", "mooncake-cpu", False),  # alive but absent: its record is waited for until the timeout
    (0, "dispatch", "exit", "mooncake-cpu", False),  # rank 0 hosts the store: survivors never reach it again
    (0, "dispatch", "kill", "gloo", False),
    (0, "combine", "exit", "mooncake-cpu", False),
    (0, "dispatch", "kill", "gloo", True),  # the GPU path (host emulation) shares the set-up
    (0, "construct", "exit", "mooncake-cpu", False),  # nothing can be learnt: the constructors fail clearly
])
def test_survivors_return_without_the_rank_that_left(tmp_path, victim, when, how, backend, gpu):
    env = {"MC_EP_TEST_VICTIM": str(victim), "MC_EP_TEST_WHEN": when, "MC_EP_TEST_HOW": how,
           "MC_EP_TEST_BACKEND": backend}
    if gpu:
        env["MC_EP_EMULATE_GPU"] = "1"
    deadline = time.monotonic() + DEADLINE_S
    ranks = Ranks(tmp_path, free_port(), WORLD, env)
    survivors = [f"rank{r}" for r in range(WORLD) if r != victim]
    try:
        for r in range(WORLD):
            ranks.start(f"rank{r}", r, "gone")
        ranks.wait_for(["ready"], deadline)
        proc = ranks.procs[f"rank{victim}"]
        if how == "kill":
            proc.send_signal(signal.SIGKILL)
        if how != "stall":
            ranks.wait_exit([f"rank{victim}"], deadline)
            assert proc.returncode == (0 if how == "exit" else -signal.SIGKILL), ranks.all_stderr()
        (tmp_path / "gone").touch()
        reports = ranks.finish(survivors, deadline)
        ranks.wait_exit([f"rank{victim}"], deadline)
    finally:
        ranks.kill_all()
    if when == "construct":
        for name, rep in reports.items():
            assert "cannot introduce" in rep["construct"] and "store" in rep["construct"], (name, rep)
            assert rep["construct_seconds"] < SLACK_S, (name, rep)
        return
    waited = "dispatch" if when == "dispatch" else "combine"
    for name, rep in reports.items():
        assert rep["active"] == [0 if r == victim else 1 for r in range(WORLD)], (name, rep)
        first, following = rep["first"], rep["next"]
        assert first[waited] < TIMEOUT_S + SLACK_S, (name, rep)
        if how == "stall":  # alive: nothing but the timeout tells them it is not coming
            assert first[waited] >= TIMEOUT_S * 0.9, (name, rep)
        assert first["combine" if waited == "dispatch" else "dispatch"] < SLACK_S, (name, rep)
        # The next round's timeout is 30 s: the inactive victim is not waited for.
        assert following["dispatch"] < SLACK_S and following["combine"] < SLACK_S, (name, rep)
        if victim == 0:  # update_ep_member needs the store: a clear error, after which the calls go on as before
            assert "store does not answer" in rep["update"], (name, rep)
            assert rep["after_update"]["dispatch"] < SLACK_S and rep["after_update"]["combine"] < SLACK_S, rep
