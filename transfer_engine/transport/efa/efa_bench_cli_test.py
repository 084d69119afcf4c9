"""`python -m mooncake.transfer_engine_bench --mode target/initiator --protocol efa` (Mooncake's flags) over
libfabric's tcp;ofi_rxm provider with the efa plugin from MC_PLUGIN_DIR: a short run whose bytes the efa
transport carried; and protocols that cannot run here (rdma without a usable plugin, efa without a provider)
stop with a clear error instead of a traceback."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
UNSHARE = shutil.which("unshare")


def env(**extra):
    e = {k: v for k, v in os.environ.items() if k not in ("FI_PROVIDER", "MC_PLUGIN_DIR")}
    e.update(PYTHONPATH=os.pathsep.join(sys.path), MC_PLUGIN_DIR=HERE, **extra)
    return e


def bench(*args):
    return [sys.executable, "-m", "mooncake.transfer_engine_bench", *args]


@pytest.mark.skipif(os.geteuid() != 0 or not UNSHARE, reason="the target's PID namespace needs root and unshare(1)")
def test_target_and_initiator_over_efa():
    # The target runs in its own PID namespace, so the engines count as different hosts (on one host the
    # same-host shm transport would carry the bytes).
    common = ["--protocol", "efa", "--metadata_server", "P2PHANDSHAKE", "--device_name", "lo",
              "--buffer_size", "8MiB"]
    target = subprocess.Popen([UNSHARE, "--pid", "--fork"] + bench("--mode", "target", "--local_server_name", "127.0.0.1", *common),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env(FI_PROVIDER="tcp;ofi_rxm"))
    try:
        line = target.stdout.readline()
        assert line, target.stderr.read()
        info = json.loads(line)
        for op in ("write", "read"):
            out = subprocess.run(
                bench("--mode", "initiator", "--local_server_name", "127.0.0.1", "--segment_id", info["segment"],
                      "--operation", op, "--batch_size", "16", "--block_size", "64KiB", "--duration", "1",
                      "--threads", "2", *common),
                capture_output=True, text=True, timeout=120, env=env(FI_PROVIDER="tcp;ofi_rxm"))
            assert out.returncode == 0, out.stdout + out.stderr
            print(out.stdout)
            m = re.search(rf"{op}: ([0-9.]+) GiB/s", out.stdout)
            assert m and float(m.group(1)) > 0, out.stdout
            carried = re.search(r"carried by: (.*)", out.stdout).group(1)
            assert carried.startswith("efa "), f"the efa transport did not carry the run: {carried}"
    finally:
        target.stdin.close()
        target.wait(timeout=30)


def test_protocols_that_cannot_run_here_fail_clearly():
    # No rdma plugin is usable here: whether the plugin is missing from this installation or cannot find a NIC,
    # the tool says so and exits non-zero, without a traceback.
    out = subprocess.run(bench("--mode", "target", "--protocol", "rdma", "--buffer_size", "1MiB"),
                         capture_output=True, text=True, timeout=60, env=env(), stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    assert "protocol 'rdma'" in out.stderr and ("no transport plugin" in out.stderr or "cannot run here" in
                                                out.stderr), out.stderr
    # efa without FI_PROVIDER on a host with no EFA or verbs device: the plugin's own reason.
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        return  # an RDMA device: efa may run over verbs here
    out = subprocess.run(bench("--mode", "initiator", "--protocol", "efa", "--segment_id", "127.0.0.1:1"),
                         capture_output=True, text=True, timeout=60, env=env(), stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    assert "protocol 'efa' cannot run here" in out.stderr and "FI_PROVIDER" in out.stderr, out.stderr
