"""Child processes of tests and benchmarks that die with their parent.

A test killed from outside (a bazel timeout, Ctrl-C, kill -9) runs no cleanup, and the masters, etcd and
Redis servers and workers it started would live on as orphans, holding ports, /dev/shm segments and CPU that
later tests then lack. ``popen`` starts a child through util-linux ``setpriv --pdeathsig KILL`` (it sets
PR_SET_PDEATHSIG and execs the command: the same process, no extra one), so the kernel kills the child when
its parent goes. No ``preexec_fn``: that would make Python fork a process full of gRPC and engine threads
instead of spawning it.

Contract: the death signal follows the *thread* that started the child. ``popen`` therefore asks for it only
when called from the main thread (a helper thread may end long before the test does); children started from
other threads, or where setpriv is missing, are left to their owner's cleanup, as before.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

_SETPRIV = shutil.which("setpriv")


def popen(cmd, **kwargs) -> subprocess.Popen:
    """subprocess.Popen(cmd, **kwargs) (cmd: a list), with the child killed when this process ends (module
    docstring)."""
    if _SETPRIV and threading.current_thread() is threading.main_thread():
        cmd = [_SETPRIV, "--pdeathsig", "KILL", "--", *cmd]
    return subprocess.Popen(cmd, **kwargs)
