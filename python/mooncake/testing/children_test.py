"""A child started with children.popen dies when its parent is killed with SIGKILL (no cleanup ran)."""

import os
import signal
import subprocess
import sys
import threading
import time

from mooncake.testing import children

_PARENT = r"""
import sys, time
from mooncake.testing import children
child = children.popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _run_parent() -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return parent, int(parent.stdout.readline())


def test_child_dies_with_a_killed_parent():
    parent, child = _run_parent()
    try:
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(child), "the child outlived its killed parent"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_child_of_a_helper_thread_is_not_armed():
    """A child started from a thread that then ends must not be killed with that thread."""
    out = {}

    def start():
        out["p"] = children.popen([sys.executable, "-c", "import time; time.sleep(30)"])

    t = threading.Thread(target=start)
    t.start()
    t.join()
    p = out["p"]
    try:
        time.sleep(0.3)
        assert p.poll() is None, "killed when the thread that started it ended"
    finally:
        p.kill()
        p.wait(10)


def test_the_child_is_the_command_itself():
    """No launcher process stays between: the pid is the command's (its exit code and signals are its own)."""
    p = children.popen([sys.executable, "-c", "import os, sys; print(os.getpid()); sys.exit(3)"],
                       stdout=subprocess.PIPE, text=True)
    assert int(p.stdout.readline()) == p.pid
    assert p.wait(10) == 3
