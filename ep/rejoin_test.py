"""A rank SIGKILLed mid-run: the survivors' dispatch/combine finish within the timeout without it (its tokens
not received, its experts contributing nothing); a replacement process then takes its rank in the process
group and the Buffer, and after update_ep_member() every rank matches the full reference again.

The ranks run ep/testing_worker.py ("rejoin" / "replacement" scenarios); this test kills the victim and starts
its replacement, talking to them through files in a temporary folder.
"""

import json
import os
import signal
import subprocess
import sys
import time

from mooncake.ep.testing import free_port
from mooncake.ep.testing_worker import KILLED_ROUND_TIMEOUT_US
from mooncake.ep.testing_worker import REJOIN_VICTIM as VICTIM

WORLD = 3
DEADLINE_S = 50  # under Bazel's 60 s for a small test, so that a failure is reported with the workers' stderr


class Ranks:
    """Worker processes with their output in files; every process still running at the end is killed."""

    def __init__(self, folder, port):
        self.folder, self.port = folder, port
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MC_LOG_LEVEL": "ERROR",
                    "MC_EP_TEST_DIR": str(folder)}
        self.procs = {}

    def start(self, name, rank, scenario):
        out = open(self.folder / f"{name}.out", "w")
        err = open(self.folder / f"{name}.err", "w")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "mooncake.ep.testing_worker", str(rank), str(WORLD), str(self.port), scenario],
            stdout=out, stderr=err, env=self.env)
        out.close()
        err.close()

    def stderr(self, name):
        lines = (self.folder / f"{name}.err").read_text().splitlines()
        return "\n".join(line for line in lines if "nanobind" not in line and "leaked" not in line)[-3000:]

    def all_stderr(self):
        return "\n".join(f"--- {name} (rc {p.poll()}):\n{self.stderr(name)}" for name, p in self.procs.items())

    def _wait(self, done, deadline, what):
        """Polls until done(); fails at once, with every worker's stderr, if a worker fails or time is up."""
        while True:
            for name, p in self.procs.items():
                if p.poll() not in (None, 0, -signal.SIGKILL):
                    raise AssertionError(f"{name} failed (rc {p.returncode}):\n{self.all_stderr()}")
            if done():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not happen in time:\n{self.all_stderr()}")
            time.sleep(0.05)

    def wait_for(self, files, deadline):
        self._wait(lambda: all((self.folder / f).exists() for f in files), deadline, f"files {files}")

    def finish(self, names, deadline):
        """Waits until the workers `names` exited (successfully); returns their reports."""
        self._wait(lambda: all(self.procs[n].poll() is not None for n in names), deadline, f"the end of {names}")
        return {n: json.loads((self.folder / f"{n}.out").read_text()) for n in names}

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_killed_rank_is_replaced_and_rejoins(tmp_path):
    deadline = time.monotonic() + DEADLINE_S
    ranks = Ranks(tmp_path, free_port())
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
