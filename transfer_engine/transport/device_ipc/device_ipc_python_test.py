"""A device-IPC transport (DEVICE_IPC_TRANSPORT: nvlink_intra, hip or nvlink) loaded from its .so (MC_PLUGIN_DIR:
its folder) by two engine processes on the host emulation (MC_PLATFORM_EMULATION=1; MC_PLATFORM_EMULATION_DEVICE=rocm
for hip: memfd "device" memory, or fabric files for nvlink; real cross-process handles, not a GPU): device-to-device
writes and reads across the processes through one cached mapping of the peer's buffer, none of it over tcp; a
buffer the peer unregistered is refused (its epoch moved on), never written; without the emulation the plugin is
unusable and says why (DEVICE_IPC_MISSING: a text its reason contains). The BUILD targets set these variables.
DEVICE_IPC_PROTOCOL is the engines' protocol (tcp: the transport serves as a same-host one; nvlink: preferred);
DEVICE_IPC_ALLOC says where the buffers come from (device: the platform's device memory; managed:
allocate_managed_buffer, the transport's own kind)."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TRANSPORT = os.environ["DEVICE_IPC_TRANSPORT"]
PROTOCOL = os.environ.get("DEVICE_IPC_PROTOCOL", "tcp")
ALLOC = os.environ.get("DEVICE_IPC_ALLOC", "device")
MISSING = os.environ["DEVICE_IPC_MISSING"]
# The plugin's folder next to this one; before the engine loads plugins (the child inherits it).
os.environ["MC_PLUGIN_DIR"] = os.path.join(os.path.dirname(HERE), TRANSPORT)
SIZE = 8 << 20

CHILD = r"""
import hashlib, json, sys
import numpy as np
from mooncake._native import platform
from mooncake.engine import TransferEngine
emu = platform.get("host_emulation")
engine = TransferEngine()
size, protocol, alloc, name = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
assert engine.initialize(name, "P2PHANDSHAKE", protocol, "") == 0
def allocate(n):  # registered (a managed buffer is registered by the engine)
    if alloc == "managed":
        return 0, engine.allocate_managed_buffer(n)
    p = emu.allocate(n, "device", 0)
    return engine.register_memory(p, n), p
rc, dev = allocate(size)
assert rc == 0 and dev
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
        out["rc"], extra = allocate(req["length"])
        out["addr"] = extra
    elif req["cmd"] == "unregister_extra":
        out["rc"] = engine.unregister_memory(extra)
        zero = np.zeros(req["length"], dtype=np.uint8)
        emu.copy(extra, zero.ctypes.data, req["length"])
    elif req["cmd"] == "peek_extra":
        buf = np.empty(req["length"], dtype=np.uint8)
        emu.copy(buf.ctypes.data, extra, req["length"])
        out["nonzero"] = int(np.count_nonzero(buf))
    elif req["cmd"] == "write":  # pattern(seed) from this buffer into the peer's
        data = np.random.default_rng(req["seed"]).integers(0, 256, req["length"], dtype=np.uint8)
        emu.copy(dev, data.ctypes.data, req["length"])
        out["rc"] = engine.transfer_sync_write(req["segment"], dev, req["remote"], req["length"])
        out["stats"] = json.loads(engine.get_stats())
    elif req["cmd"] == "exit":
        break
    print(json.dumps(out), flush=True)
engine.close()
"""


def pattern(length, seed):
    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8)


class Child:
    def __init__(self, prefix=(), name="127.0.0.1", **env):
        self.proc = subprocess.Popen([*prefix, sys.executable, "-c", CHILD, str(SIZE), PROTOCOL, ALLOC, name],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env})
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
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", PROTOCOL, "") == 0
    emu = platform.get("host_emulation")
    if ALLOC == "managed":  # registered by the engine
        dev = engine.allocate_managed_buffer(SIZE)
        assert dev, "no managed buffer"
    else:
        dev = emu.allocate(SIZE, "device", 0)
        assert engine.register_memory(dev, SIZE) == 0
    child = Child()
    yield engine, emu, dev, child
    child.close()
    if ALLOC == "managed":
        assert engine.free_managed_buffer(dev, SIZE) == 0
    engine.close()
    if ALLOC != "managed":
        emu.free(dev, SIZE, "device")


def test_the_plugin_is_loaded_from_its_so(pair):
    from mooncake.engine import TransferEngine

    found = [p for p in TransferEngine.plugins() if p["name"] == TRANSPORT]
    assert found and found[0]["state"] == "loaded", found
    assert found[0]["origin"].endswith(f"libmc_transport_{TRANSPORT}.so"), found


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


def test_the_transport_carried_everything_through_one_mapping(pair):
    engine, emu, dev, child = pair
    stats = json.loads(engine.get_stats())
    mine = stats[TRANSPORT][child.info["segment"]]
    assert mine["bytes"] >= 2 * (SIZE + (3 << 20) + 5) and mine["errors"] == 0, mine
    assert mine["imports"] == 1 and mine["mapped"] == 1, mine
    assert sum(p["bytes"] for p in stats.get("tcp", {}).values()) == 0, stats["tcp"]


def test_without_a_device_platform_the_plugin_says_why():
    code = ("import json; from mooncake.engine import TransferEngine; "
            f"print(json.dumps([p for p in TransferEngine.plugins() if p['name'] == '{TRANSPORT}']))")
    env = {k: v for k, v in os.environ.items() if k != "MC_PLATFORM_EMULATION"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    (p,) = json.loads(out.stdout)
    assert p["state"] == "unusable" and MISSING in p["reason"], p  # no GPU runtime on this machine


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


@pytest.mark.skipif(TRANSPORT != "nvlink", reason="NVLink domains are nvlink's")
def test_a_peer_of_another_nvlink_domain_goes_over_tcp(pair):
    engine, emu, dev, _ = pair
    other = Child(MC_NVLINK_DOMAIN="another-domain")
    try:
        length = 1 << 20
        data = pattern(length, 5)
        emu.copy(dev, data.ctypes.data, length)
        assert engine.transfer_sync_write(other.info["segment"], dev, other.info["device"], length) == 0
        assert other.call("digest", offset=0, length=length)["sha256"] == hashlib.sha256(data).hexdigest()
        stats = json.loads(engine.get_stats())
        assert other.info["segment"] not in stats.get(TRANSPORT, {}), stats.get(TRANSPORT)
        assert sum(p["bytes"] for p in stats.get("tcp", {}).values()) >= length, stats.get("tcp")
    finally:
        other.close()


def _netns_unavailable():
    from mooncake.testing import netns
    return netns.available()


@pytest.mark.skipif(TRANSPORT != "nvlink", reason="only nvlink reaches other hosts")
def test_nvlink_moves_device_bytes_between_two_network_namespace_hosts():
    why = _netns_unavailable()
    if why:
        pytest.skip(why)
    from mooncake.testing import netns
    with netns.Topology() as net:
        a, b = net.host("a"), net.host("b")
        net.link(a, b)
        target = Child(prefix=b.prefix, name=b.ips[0])
        initiator = Child(prefix=a.prefix, name=a.ips[0])
        try:
            length = 3 << 20
            reply = initiator.call("write", segment=target.info["segment"], remote=target.info["device"],
                                   length=length, seed=11)
            assert reply["rc"] == 0, reply
            want = hashlib.sha256(pattern(length, 11)).hexdigest()
            assert target.call("digest", offset=0, length=length)["sha256"] == want
            mine = reply["stats"].get(TRANSPORT, {}).get(target.info["segment"], {})
            assert mine.get("bytes", 0) >= length, reply["stats"]  # through the fabric handle, another host
            assert sum(p["bytes"] for p in reply["stats"].get("tcp", {}).values()) == 0, reply["stats"]
        finally:
            initiator.close()
            target.close()


def test_managed_buffers_take_a_device(pair):
    """allocate_managed_buffer(length, device): device memory of that device where the transport allocates
    (ALLOC managed), refused (0) where managed buffers are host memory; wrong types raise TypeError."""
    from mooncake._native import platform

    engine, _, _, _ = pair
    with pytest.raises(TypeError):
        engine.allocate_managed_buffer(4096, "1")
    with pytest.raises(TypeError):
        engine.allocate_managed_buffer("4096")
    if ALLOC != "managed":
        assert engine.allocate_managed_buffer(1 << 20, 0) == 0  # tcp's managed buffers are host memory
        return
    on1 = engine.allocate_managed_buffer(1 << 20, device=1)
    assert on1, "no managed buffer on device 1"
    assert platform.classify(on1).endswith(":1"), platform.classify(on1)
    assert engine.allocate_managed_buffer(1 << 20, 7) == 0  # the emulation has 2 devices
    assert engine.free_managed_buffer(on1, 1 << 20) == 0
