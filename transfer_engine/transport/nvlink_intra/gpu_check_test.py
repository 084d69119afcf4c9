"""gpu_check.py on this machine (no GPU): it finds the extension and both plugins in the runfiles, parses, and exits
2 with the reason (the cuda platform cannot load its driver)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_exits_2_saying_why_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k not in ("MC_PLATFORM_EMULATION", "MC_PLUGIN_DIR")}
    p = subprocess.run([sys.executable, os.path.join(HERE, "gpu_check.py")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "no usable GPU" in p.stdout and "libcuda" in p.stdout, p.stdout


def test_help_parses():
    p = subprocess.run([sys.executable, os.path.join(HERE, "gpu_check.py"), "--help"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "ipc_posix_fd" in p.stdout, p.stdout + p.stderr
