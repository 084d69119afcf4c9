"""A rank SIGKILLed mid-run: the survivors' dispatch/combine finish within the timeout without it (its tokens
not received, its experts contributing nothing); a replacement process then takes its rank in the process
group and the Buffer, and after update_ep_member() every rank matches the full reference again.

The ranks run ep/testing_worker.py ("rejoin" / "replacement" scenarios); this test kills the victim and starts
its replacement, talking to them through files in a temporary folder.
"""

import signal
import time

from mooncake.ep.testing import Ranks, free_port
from mooncake.ep.testing_worker import KILLED_ROUND_TIMEOUT_US
from mooncake.ep.testing_worker import REJOIN_VICTIM as VICTIM

WORLD = 3
DEADLINE_S = 50  # under Bazel's 60 s for a small test, so that a failure is reported with the workers' stderr


def test_killed_rank_is_replaced_and_rejoins(tmp_path):
    deadline = time.monotonic() + DEADLINE_S
    ranks = Ranks(tmp_path, free_port(), WORLD)
    try:
        for r in range(WORLD):
            ranks.start(f"rank{r}", r, "rejoin")
        ranks.wait_for(["ready"], deadline)  # the victim passed its rounds with everyone
        victim = ranks.procs[f"rank{VICTIM}"]
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        (tmp_path / "killed").touch()
        survivors = [r for r in range(WORLD) if r != VICTIM]
        ranks.wait_for([f"dropped.{r}" for r in survivors], deadline)
        ranks.start("replacement", VICTIM, "replacement")
        reports = ranks.finish([f"rank{r}" for r in survivors] + ["replacement"], deadline)
    finally:
        ranks.kill_all()
    expected_after_kill = [0 if r == VICTIM else 1 for r in range(WORLD)]
    for r in survivors:
        rep = reports[f"rank{r}"]
        assert rep["active_after_kill"] == expected_after_kill, rep
        # The call returns once the timeout passed (slack: the round's own work on a loaded machine).
        assert rep["dead_round_seconds"] < KILLED_ROUND_TIMEOUT_US / 1e6 + 3, rep
        assert rep["skip_round_seconds"] < 5, rep  # not the 10 s timeout: the inactive victim is not waited for
    assert reports["replacement"]["rank"] == VICTIM and reports["replacement"]["replacement"]
    for rep in reports.values():
        assert rep["active_after_rejoin"] == [1] * WORLD, rep
