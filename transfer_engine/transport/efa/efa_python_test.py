"""The efa plugin through Python: `TransferEngine.initialize(..., "efa", device_name)` with the plugin .so
loaded from MC_PLUGIN_DIR, over libfabric's tcp;ofi_rxm provider, between two processes. Each case runs in fresh
interpreters (plugins and libfabric's provider list load once per process).

The target runs in its own PID namespace, so the engines count as different hosts: between engines of one host
the engine prefers its same-host transport (shm) to any network transport, efa included. The shm provider is
covered by efa_conformance_shm_test, whose engines install only efa."""

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(HERE, "libmc_transport_efa.so")

# The target: registers 4 MiB, prints its segment name and buffer address, then answers "digest" requests for
# the bytes at an offset until stdin closes.
TARGET = r"""
import json, sys, zlib
import numpy as np
from mooncake.engine import TransferEngine
e = TransferEngine()
rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "efa", sys.argv[1])
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

# The initiator: writes 1 MiB (and a 16 x 64 KiB batch) into the target, reads 1 MiB back, and reports.
INITIATOR = r"""
import json, sys, zlib
import numpy as np
from mooncake.engine import TransferEngine
segment, addr = sys.argv[1], int(sys.argv[2])
e = TransferEngine()
out = {"init": e.initialize("127.0.0.1", "P2PHANDSHAKE", "efa", sys.argv[3])}
src = (np.arange(2 << 20, dtype=np.uint64) * 7).astype(np.uint8)
out["register"] = e.register_memory(src.ctypes.data, src.nbytes)
out["write"] = e.transfer_sync_write(segment, src.ctypes.data, addr + (1 << 20), 1 << 20)
out["src_crc"] = zlib.crc32(src[:1 << 20].tobytes())
bid = e.batch_transfer_async_write(segment, [src.ctypes.data + i * 65536 for i in range(16)],
                                   [addr + (2 << 20) + i * 65536 for i in range(16)], [65536] * 16)
out["batch"] = e.get_batch_transfer_status([bid]) if bid else -999
out["batch_crc"] = zlib.crc32(src[:1 << 20].tobytes())
out["read"] = e.transfer_sync_read(segment, src[1 << 20:], addr, 1 << 20)
expect = np.arange(1 << 20, dtype=np.uint64).astype(np.uint8) ^ 0x5A
out["read_ok"] = bool((src[1 << 20:] == expect).all())
stats = json.loads(e.get_stats())  # before the refused write below: the engine then forgets the peer
out["outside"] = e.transfer_sync_write(segment, src.ctypes.data, addr + (4 << 20) - 4096, 8192)
out["efa_bytes"] = sum(v.get("bytes", 0) for v in stats.get("transports", stats).get("efa", {}).values()
                       if isinstance(v, dict))
out["stats"] = stats
out["plugin"] = [p for p in TransferEngine.plugins() if p["name"] == "efa"]
e.close()
print(json.dumps(out))
"""


def _env(provider):
    env = {k: v for k, v in os.environ.items() if k not in ("FI_PROVIDER", "MC_PLUGIN_DIR")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["MC_PLUGIN_DIR"] = HERE
    if provider:
        env["FI_PROVIDER"] = provider
    return env


UNSHARE = shutil.which("unshare")


def _other_host_reason():
    if os.geteuid() != 0 or not UNSHARE:
        return "a PID namespace for the target needs root and unshare(1)"
    r = subprocess.run([UNSHARE, "--pid", "--fork", "true"], capture_output=True, text=True)
    return None if r.returncode == 0 else "unshare --pid failed: " + r.stderr.strip()


def _start_target(provider, device=""):
    p = subprocess.Popen([UNSHARE, "--pid", "--fork", sys.executable, "-c", TARGET, device], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=_env(provider))
    line = p.stdout.readline()
    assert line, "the target process died before it was ready"
    return p, json.loads(line)


def _digest(target, off, n):
    target.stdin.write(f"{off} {n}\n")
    target.stdin.flush()
    return int(target.stdout.readline())


def test_plugin_file_is_there():
    assert os.path.exists(PLUGIN), PLUGIN


other_host = pytest.mark.skipif(_other_host_reason() is not None, reason=str(_other_host_reason()))


@other_host
def test_two_processes_move_bytes_over_efa():
    provider = "tcp;ofi_rxm"
    target, info = _start_target(provider)
    try:
        assert info["rc"] == 0, info
        out = subprocess.run([sys.executable, "-c", INITIATOR, info["segment"], str(info["addr"]), ""],
                             capture_output=True, text=True, env=_env(provider), timeout=120)
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
        assert r["init"] == 0 and r["register"] == 0, r
        assert r["write"] == 0 and r["batch"] == 0 and r["read"] == 0, r
        assert r["read_ok"], "the bytes read back differ from the target's"
        assert _digest(target, 1 << 20, 1 << 20) == r["src_crc"], "the written bytes did not arrive intact"
        assert _digest(target, 2 << 20, 1 << 20) == r["batch_crc"], "the batch did not arrive intact"
        assert r["outside"] == -3, "a range past the target's buffer must be refused (-3), got %r" % r["outside"]
        assert r["plugin"] and r["plugin"][0]["state"] == "loaded", r["plugin"]
        assert r["plugin"][0]["origin"].endswith("libmc_transport_efa.so"), r["plugin"]
        assert r["efa_bytes"] >= 3 << 20, json.dumps(r["stats"])
    finally:
        target.stdin.close()
        target.wait(timeout=30)


@other_host
def test_device_name_selects_the_domain():
    # tcp;ofi_rxm's domains are the host's interfaces; "lo" exists in every namespace, "nope0" nowhere.
    target, info = _start_target("tcp;ofi_rxm", "lo")
    try:
        assert info["rc"] == 0, info
    finally:
        target.stdin.close()
        target.wait(timeout=30)
    target, info = _start_target("tcp;ofi_rxm", "nope0")
    target.wait(timeout=30)
    assert info["rc"] < 0, info


def test_without_a_provider_efa_is_unusable_with_its_reason():
    # No FI_PROVIDER and no EFA/verbs device here: the plugin loads but says why it cannot run, and asking
    # for "efa" fails instead of silently using tcp.
    code = r"""
import json
from mooncake.engine import TransferEngine
e = TransferEngine()
rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "efa", "")
print(json.dumps({"rc": rc, "plugin": [p for p in TransferEngine.plugins() if p["name"] == "efa"],
                  "protocols": TransferEngine.get_supported_protocols()}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(""), timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["rc"] < 0, r
    assert r["plugin"][0]["state"] == "unusable", r
    assert "FI_PROVIDER" in r["plugin"][0]["reason"], r
    assert "efa" not in r["protocols"], r
