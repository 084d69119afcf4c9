"""The rdma plugin through Python: `TransferEngine.initialize(..., "rdma", device_name)` with the plugin .so
loaded from MC_PLUGIN_DIR, on the FAKE verbs provider (testing/libfake_ibverbs.so, selected by
MC_RDMA_FAKE_LIBRARY), between two processes; and on this host's real libibverbs, where it is unusable with
its reason. Each case runs in fresh interpreters (plugins load once per process).

The target runs in its own PID namespace, so the engines count as different hosts: between engines of one host
the engine prefers its same-host transport (shm) to any network transport."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(HERE, "libmc_transport_rdma.so")
FAKE = os.path.join(HERE, "testing", "libfake_ibverbs.so")

TARGET = r"""
import json, sys, zlib
import numpy as np
from mooncake.engine import TransferEngine
e = TransferEngine()
rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", sys.argv[1])
if rc != 0:
    print(json.dumps({"rc": rc}), flush=True)
    sys.exit(0)
buf = np.zeros(4 << 20, dtype=np.uint8)
buf[:1 << 20] = np.arange(1 << 20, dtype=np.uint64).astype(np.uint8) ^ 0x5A
assert e.register_memory(buf.ctypes.data, buf.nbytes) == 0
print(json.dumps({"rc": 0, "segment": e.get_local_segment_name(), "addr": buf.ctypes.data}), flush=True)
for line in sys.stdin:
    off, n = map(int, line.split())
    print(zlib.crc32(buf[off:off + n].tobytes()), flush=True)
"""

INITIATOR = r"""
import json, sys, zlib
import numpy as np
from mooncake.engine import TransferEngine
segment, addr = sys.argv[1], int(sys.argv[2])
e = TransferEngine()
out = {"init": e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", sys.argv[3])}
src = (np.arange(2 << 20, dtype=np.uint64) * 7).astype(np.uint8)
out["register"] = e.register_memory(src.ctypes.data, src.nbytes)
out["write"] = e.transfer_sync_write(segment, src.ctypes.data, addr + (1 << 20), 1 << 20)
out["src_crc"] = zlib.crc32(src[:1 << 20].tobytes())
bid = e.batch_transfer_async_write(segment, [src.ctypes.data + i * 65536 for i in range(16)],
                                   [addr + (2 << 20) + i * 65536 for i in range(16)], [65536] * 16)
out["batch"] = e.get_batch_transfer_status([bid]) if bid else -999
out["read"] = e.transfer_sync_read(segment, src[1 << 20:], addr, 1 << 20)
expect = np.arange(1 << 20, dtype=np.uint64).astype(np.uint8) ^ 0x5A
out["read_ok"] = bool((src[1 << 20:] == expect).all())
stats = json.loads(e.get_stats())
out["outside"] = e.transfer_sync_write(segment, src.ctypes.data, addr + (4 << 20) - 4096, 8192)
out["rdma_bytes"] = sum(v.get("bytes", 0) for v in stats.get("rdma", {}).values() if isinstance(v, dict))
out["paths"] = sorted(p for v in stats.get("rdma", {}).values() if isinstance(v, dict) for p in v.get("paths", {}))
out["stats"] = stats
out["plugin"] = [p for p in TransferEngine.plugins() if p["name"] == "rdma"]
e.close()
print(json.dumps(out))
"""

STATE = tempfile.mkdtemp(prefix="rdma_fake_", dir=os.environ.get("TEST_TMPDIR"))


def _env(fake=True, host="hostA"):
    drop = ("MC_PLUGIN_DIR", "MC_RDMA_FAKE_LIBRARY", "MC_RDMA_FAKE_STATE", "MC_RDMA_FAKE_HOST")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["MC_PLUGIN_DIR"] = HERE
    if fake:
        env.update(MC_RDMA_FAKE_LIBRARY=FAKE, MC_RDMA_FAKE_STATE=STATE, MC_RDMA_FAKE_HOST=host,
                   MC_RDMA_FAKE_DEVICES="fake_mlx5_0,fake_mlx5_1", MC_RDMA_FAKE_RETRY_MS="300")
    return env


UNSHARE = shutil.which("unshare")


def _other_host_reason():
    if os.geteuid() != 0 or not UNSHARE:
        return "a PID namespace for the target needs root and unshare(1)"
    r = subprocess.run([UNSHARE, "--pid", "--fork", "true"], capture_output=True, text=True)
    return None if r.returncode == 0 else "unshare --pid failed: " + r.stderr.strip()


other_host = pytest.mark.skipif(_other_host_reason() is not None, reason=str(_other_host_reason()))


def _start_target(device=""):
    p = subprocess.Popen([UNSHARE, "--pid", "--fork", sys.executable, "-c", TARGET, device], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=_env(host="hostB"))
    line = p.stdout.readline()
    assert line, "the target process died before it was ready"
    return p, json.loads(line)


def _digest(target, off, n):
    target.stdin.write(f"{off} {n}\n")
    target.stdin.flush()
    return int(target.stdout.readline())


def test_plugin_files_are_there():
    assert os.path.exists(PLUGIN), PLUGIN
    assert os.path.exists(FAKE), FAKE


@other_host
@pytest.mark.parametrize("device", ["", "fake_mlx5_1"])
def test_two_processes_move_bytes_over_rdma(device):
    target, info = _start_target(device)
    try:
        assert info["rc"] == 0, info
        out = subprocess.run([sys.executable, "-c", INITIATOR, info["segment"], str(info["addr"]), device],
                             capture_output=True, text=True, env=_env(), timeout=120)
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
        assert r["init"] == 0 and r["register"] == 0, r
        assert r["write"] == 0 and r["batch"] == 0 and r["read"] == 0, r
        assert r["read_ok"], "the bytes read back differ from the target's"
        assert _digest(target, 1 << 20, 1 << 20) == r["src_crc"], "the written bytes did not arrive intact"
        assert r["outside"] == -3, "a range past the target's buffer must be refused (-3), got %r" % r["outside"]
        assert r["plugin"] and r["plugin"][0]["state"] == "loaded", r["plugin"]
        assert r["plugin"][0]["origin"].endswith("libmc_transport_rdma.so"), r["plugin"]
        assert r["rdma_bytes"] >= 3 << 20, json.dumps(r["stats"])
        if device:  # both ends use only the allowed HCA
            assert r["paths"] and all(p.startswith(device) and p.endswith("@" + device) for p in r["paths"]), r["paths"]
        else:
            assert {p.split("->")[0] for p in r["paths"]} == {"fake_mlx5_0", "fake_mlx5_1"}, r["paths"]
    finally:
        target.stdin.close()
        target.wait(timeout=30)


def test_device_name_naming_no_hca_fails():
    code = r"""
import json
from mooncake.engine import TransferEngine
e = TransferEngine()
print(json.dumps({"rc": e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_nope")}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rc"] < 0
    assert "mlx5_nope" in out.stderr, out.stderr


def test_without_rdma_devices_rdma_is_unusable_with_its_reason():
    # This host's real libibverbs has no device: the plugin loads, says so, and asking for "rdma" fails instead
    # of silently using tcp.
    code = r"""
import json
from mooncake.engine import TransferEngine
e = TransferEngine()
rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "")
print(json.dumps({"rc": rc, "plugin": [p for p in TransferEngine.plugins() if p["name"] == "rdma"]}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(fake=False),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["rc"] < 0, r
    assert r["plugin"][0]["state"] == "unusable", r
    assert "RDMA device" in r["plugin"][0]["reason"] or "libibverbs" in r["plugin"][0]["reason"], r
    print("probe without a NIC:", r["plugin"][0]["reason"])
