"""Test helpers: run the ranks of ep/testing_worker.py as real processes and collect their reports."""

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, scenario: str, timeout: float = 180, backend: str = "gloo") -> list[tuple[int, str, str]]:
    """Starts `world` worker processes (environment inherited, plus the backend) and returns each one's
    (exit status, stdout, stderr); all are killed if one outlives `timeout` seconds."""
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
