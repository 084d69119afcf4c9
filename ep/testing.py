"""Test helpers: run the ranks of ep/testing_worker.py as real processes and collect their reports."""

import json
import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, scenario: str, timeout: float = 180, backend: str = "gloo",
              module: str = "mooncake.ep.testing_worker") -> list[tuple[int, str, str]]:
    """Starts `world` processes of the worker `module` (argv: rank world port scenario; environment inherited,
    plus the backend) and returns each one's (exit status, stdout, stderr); all are killed if one outlives
    `timeout` seconds."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MC_LOG_LEVEL": "ERROR",
           "MC_EP_TEST_BACKEND": backend}
    procs = [subprocess.Popen([sys.executable, "-m", module, str(r), str(world), str(port),
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


class Ranks:
    """Worker processes of a `world`-rank group, started one by one, with their output in files in `folder`,
    which is also their signal folder (MC_EP_TEST_DIR); `env` adds to their environment. kill_all() kills every
    process still running (call it in a finally)."""

    def __init__(self, folder, port: int, world: int, env: dict | None = None):
        self.folder, self.port, self.world = folder, port, world
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MC_LOG_LEVEL": "ERROR",
                    "MC_EP_TEST_DIR": str(folder), **(env or {})}
        self.procs = {}

    def start(self, name: str, rank: int, scenario: str) -> None:
        out = open(self.folder / f"{name}.out", "w")
        err = open(self.folder / f"{name}.err", "w")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "mooncake.ep.testing_worker", str(rank), str(self.world), str(self.port),
             scenario], stdout=out, stderr=err, env=self.env)
        out.close()
        err.close()

    def stderr(self, name: str) -> str:
        lines = (self.folder / f"{name}.err").read_text().splitlines()
        return "\n".join(line for line in lines if "nanobind" not in line and "leaked" not in line)[-3000:]

    def all_stderr(self) -> str:
        return "\n".join(f"--- {name} (rc {p.poll()}):\n{self.stderr(name)}" for name, p in self.procs.items())

    def _wait(self, done, deadline: float, what: str) -> None:
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

    def wait_for(self, files: list[str], deadline: float) -> None:
        self._wait(lambda: all((self.folder / f).exists() for f in files), deadline, f"files {files}")

    def wait_exit(self, names: list[str], deadline: float) -> None:
        """Waits until the workers `names` exited (with status 0, or killed by the test)."""
        self._wait(lambda: all(self.procs[n].poll() is not None for n in names), deadline, f"the end of {names}")

    def finish(self, names: list[str], deadline: float) -> dict:
        """Waits until the workers `names` exited; returns their reports (the JSON line each printed)."""
        self.wait_exit(names, deadline)
        return {n: json.loads((self.folder / f"{n}.out").read_text()) for n in names}

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
