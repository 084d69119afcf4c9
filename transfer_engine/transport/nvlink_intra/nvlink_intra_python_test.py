"""nvlink_intra loaded from its .so (MC_PLUGIN_DIR) by two engine processes on the host emulation
(MC_PLATFORM_EMULATION=1: memfd "cuda" memory, real cross-process IPC, not a GPU): device-to-device writes and
reads across the processes through one cached mapping of the peer's buffer, none of it over tcp; a buffer the peer
unregistered is refused (its epoch moved on), never written."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["MC_PLUGIN_DIR"] = HERE  # before the engine loads plugins; the child inherits it
SIZE = 8 << 20

CHILD = r"""
import hashlib, json, sys
import numpy as np
from mooncake._native import platform
from mooncake.engine import TransferEngine
emu = platform.get("host_emulation")
engine = TransferEngine()
assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
size = int(sys.argv[1])
dev = emu.allocate(size, "device", 0)
assert engine.register_memory(dev, size) == 0
print(json.dumps({"segment": engine.get_local_segment_name(), "device": dev}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    out = {}
    if req["cmd"] == "fill":
        data = np.random.default_rng(req["seed"]).integers(0, 256, req["length"], dtype=np.uint8)
        emu.copy(dev + req["offset"], data.ctypes.data, req["length"])
    elif req["cmd"] == "digest":
        buf = np.empty(req["length"], dtype=np.uint8)
        emu.copy(buf.ctypes.data, dev + req["offset"], req["length"])
        out["sha256"] = hashlib.sha256(buf).hexdigest()
    elif req["cmd"] == "register_extra":
        extra = emu.allocate(req["length"], "device", 0)
        out["rc"], out["addr"] = engine.register_memory(extra, req["length"]), extra
    elif req["cmd"] == "unregister_extra":
        out["rc"] = engine.unregister_memory(extra)
        zero = np.zeros(req["length"], dtype=np.uint8)
        emu.copy(extra, zero.ctypes.data, req["length"])
    elif req["cmd"] == "peek_extra":
        buf = np.empty(req["length"], dtype=np.uint8)
        emu.copy(buf.ctypes.data, extra, req["length"])
        out["nonzero"] = int(np.count_nonzero(buf))
    elif req["cmd"] == "exit":
        break
    print(json.dumps(out), flush=True)
engine.close()
"""


def pattern(length, seed):
    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8)


class Child:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(SIZE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        line = self.proc.stdout.readline()
        assert line, f"child failed ({self.proc.wait(timeout=10)})"
        self.info = json.loads(line)

    def call(self, cmd, **kw):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        try:
            self.proc.stdin.write('{"cmd": "exit"}\n')
            self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()


@pytest.fixture(scope="module")
def pair():
    from mooncake._native import platform
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    emu = platform.get("host_emulation")
    dev = emu.allocate(SIZE, "device", 0)
    assert engine.register_memory(dev, SIZE) == 0
    child = Child()
    yield engine, emu, dev, child
    child.close()
    engine.close()
    emu.free(dev, SIZE, "device")


def test_the_plugin_is_loaded_from_its_so(pair):
    from mooncake.engine import TransferEngine

    found = [p for p in TransferEngine.plugins() if p["name"] == "nvlink_intra"]
    assert found and found[0]["state"] == "loaded", found
    assert found[0]["origin"].endswith("libmc_transport_nvlink_intra.so"), found


@pytest.mark.parametrize("offset,length", [(0, SIZE), (4097, (3 << 20) + 5)])
def test_device_to_device_across_processes(pair, offset, length):
    engine, emu, dev, child = pair
    data = pattern(length, length)
    emu.copy(dev + offset, data.ctypes.data, length)
    remote = child.info["device"] + offset
    assert engine.transfer_sync_write(child.info["segment"], dev + offset, remote, length) == 0
    assert child.call("digest", offset=offset, length=length)["sha256"] == hashlib.sha256(data).hexdigest()
    child.call("fill", offset=offset, length=length, seed=99)
    assert engine.transfer_sync_read(child.info["segment"], dev + offset, remote, length) == 0
    back = np.empty(length, dtype=np.uint8)
    emu.copy(back.ctypes.data, dev + offset, length)
    assert hashlib.sha256(back).hexdigest() == hashlib.sha256(pattern(length, 99)).hexdigest()


def test_nvlink_intra_carried_everything_through_one_mapping(pair):
    engine, emu, dev, child = pair
    stats = json.loads(engine.get_stats())
    mine = stats["nvlink_intra"][child.info["segment"]]
    assert mine["bytes"] >= 2 * (SIZE + (3 << 20) + 5) and mine["errors"] == 0, mine
    assert mine["imports"] == 1 and mine["mapped"] == 1, mine
    assert sum(p["bytes"] for p in stats.get("tcp", {}).values()) == 0, stats["tcp"]


def test_without_a_device_platform_the_plugin_says_why():
    code = ("import json; from mooncake.engine import TransferEngine; "
            "print(json.dumps([p for p in TransferEngine.plugins() if p['name'] == 'nvlink_intra']))")
    env = {k: v for k, v in os.environ.items() if k != "MC_PLATFORM_EMULATION"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    (p,) = json.loads(out.stdout)
    assert p["state"] == "unusable" and "libcuda.so.1" in p["reason"], p  # no GPU driver on this machine


def test_memory_the_peer_unregistered_is_never_written(pair):  # last: it leaves a refused slice in the counters
    engine, emu, dev, child = pair
    n = 1 << 20
    reply = child.call("register_extra", length=n)
    assert reply["rc"] == 0
    data = pattern(n, 3)
    emu.copy(dev, data.ctypes.data, n)
    # The cached descriptor predates the registration: the engine refreshes it on the miss. Then the buffer is
    # mapped here and listed in the cached descriptor.
    assert engine.transfer_sync_write(child.info["segment"], dev, reply["addr"], n) == 0
    assert child.call("peek_extra", length=n)["nonzero"] > 0
    assert child.call("unregister_extra", length=n)["rc"] == 0  # zeroed after unregistering
    rc = engine.transfer_sync_write(child.info["segment"], dev, reply["addr"], n)
    assert rc == -3, rc  # the epoch moved on: refreshed, and the range is gone
    assert child.call("peek_extra", length=n)["nonzero"] == 0, "a write landed in memory the peer unregistered"
