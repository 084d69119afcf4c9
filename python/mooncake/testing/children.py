"""Child processes of tests and benchmarks that die with their parent.

A test killed from outside (a bazel timeout, Ctrl-C, kill -9) runs no cleanup, and the masters, etcd and
Redis servers and workers it started would live on as orphans, holding ports, /dev/shm segments and CPU that
later tests then lack. ``popen`` starts a child with PR_SET_PDEATHSIG = SIGKILL (Linux), so the kernel
kills it when its parent goes.

Contract: the death signal follows the *thread* that started the child. ``popen`` therefore asks for it only
when called from the main thread (a helper thread may end long before the test does); children started from
other threads are left to their owner's cleanup, as before.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading

_PR_SET_PDEATHSIG = 1
_prctl = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


def _die_with(parent: int):
    def arm() -> None:  # runs in the child between fork and exec: no locks, no allocation beyond this
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
    return arm


def popen(cmd, **kwargs) -> subprocess.Popen:
    """subprocess.Popen(cmd, **kwargs), with the child killed when this process ends (module docstring). A
    caller's own preexec_fn is kept (and the death signal not armed)."""
    if _prctl is not None and "preexec_fn" not in kwargs and threading.current_thread() is threading.main_thread():
        kwargs["preexec_fn"] = _die_with(os.getpid())
    return subprocess.Popen(cmd, **kwargs)
