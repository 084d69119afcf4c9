"""close() stops and joins everything the store started: after it, no thread of the store is left and the
interpreter exits without nanobind reporting a leaked engine (a thread still holding a native object)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from mooncake.store.master.testing import child_env

_CHILD = textwrap.dedent("""
    import os, sys, threading
    from mooncake.store import MooncakeDistributedStore
    from mooncake.store.master.testing import MasterProcess
    from mooncake.testing.services import free_port

    port = free_port()
    master = MasterProcess(f"--port={port}")
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "32MB", "8MB", "tcp", "", master.address, None, True,
                   sys.argv[1]) == 0
    for i in range(20):
        assert s.put(f"k{i}", os.urandom(4096)) == 0
    master.kill()
    master = MasterProcess(f"--port={port}")  # restarted: the client remounts and declares its tier again
    for i in range(5):
        s.put(f"j{i}", os.urandom(4096))  # may fail while the client reconnects: not the point here
    assert s.close() == 0
    master.stop()
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    print("threads left:", left)
    assert not left, left
""")


def test_close_joins_everything_and_exits_clean(tmp_path):
    p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120,
                       env={**child_env(), "MC_LOG_LEVEL": "ERROR"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "threads left: []" in p.stdout
    assert "leaked" not in p.stderr, p.stderr
