"""gpu_check.py on this machine (no GPU): it finds the extension and both plugins in the runfiles, parses, and exits
2 with the reason (the cuda platform cannot load its driver); with the host emulation as the device its checks run
(tools/gpu_check runs them the same way, as its module)."""

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


def test_runs_every_check_on_the_host_emulation():
    """MC_GPU_CHECK_PLATFORM=host_emulation (what tools/gpu_check --emulation sets): the same checks, the host
    emulation as the device (not a GPU); the plugin from these runfiles carries the pair (none of it over tcp)."""
    env = {k: v for k, v in os.environ.items() if k != "MC_PLUGIN_DIR"}
    env.update(MC_PLATFORM_EMULATION="1", MC_GPU_CHECK_PLATFORM="host_emulation")
    p = subprocess.run([sys.executable, os.path.join(HERE, "gpu_check.py"), "--mib", "8"], capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-3000:])
    lines = {line.split()[1]: line for line in p.stdout.splitlines() if line.startswith("CHECK ")}
    for name in ("ipc_legacy", "ipc_posix_fd", "nvlink_intra", "tcp_staging"):
        assert lines[name].split()[2] == "PASS", lines[name]
    assert "'tcp': 0" in lines["nvlink_intra"], lines["nvlink_intra"]  # PASS: nvlink_intra carried >= 2 x 8 MiB
    assert lines["dmabuf_export"].split()[2] == "SKIP" and "libcuda.so.1" in lines["dmabuf_export"]
    assert "host_emulation platform device-to-device copy" in lines["nvlink_intra"]
