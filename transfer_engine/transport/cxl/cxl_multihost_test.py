"""The cxl transport between "hosts" made of network namespaces that share one file on /tmp standing in for a
CXL device: the bytes move through the file (no network hop), a killed host's transfers fail, and the other
hosts' ranges stay intact. Every engine is its own process on its own host; P2P handshake metadata over veth.
"""

import hashlib
import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from mooncake.testing import netns

reason = netns.available()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

MiB = 1 << 20
DEVICE = 64 * MiB


def pattern(length, seed):
    out = bytearray(length)
    x = seed * 2654435761 + 1
    for i in range(0, length, 8):
        x = (x * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        out[i:i + 8] = x.to_bytes(8, "little")[: min(8, length - i)]
    return bytes(out)


def child(ip, dev, offset, length):
    """One engine: maps [offset, offset+length) of the device file and registers it (offset -1: takes `length`
    bytes from allocate_managed_buffer instead, which carves them from the device); answers commands."""
    import ctypes

    import numpy as np

    from mooncake.engine import TransferEngine

    e = TransferEngine()
    rc = e.initialize(ip, "P2PHANDSHAKE", "cxl", "")
    if rc != 0:
        print(json.dumps({"error": f"initialize: {rc}"}), flush=True)
        return
    if offset < 0:
        addr = e.allocate_managed_buffer(length)
        assert addr, "allocate_managed_buffer failed"
        m = memoryview((ctypes.c_char * length).from_address(addr)).cast("B")
    else:
        fd = os.open(dev, os.O_RDWR)
        m = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        os.close(fd)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        assert e.register_memory(addr, length) == 0
    local = np.zeros(4 * MiB, dtype=np.uint8)
    assert e.register_memory(local.ctypes.data, local.nbytes) == 0
    print(json.dumps({"segment": e.get_local_segment_name(), "buffer": addr}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        out = {}
        if c["cmd"] == "fill":
            m[c["off"]:c["off"] + c["len"]] = pattern(c["len"], c["seed"])
        elif c["cmd"] == "digest":
            out["digest"] = hashlib.sha1(m[c["off"]:c["off"] + c["len"]]).hexdigest()
        elif c["cmd"] in ("write", "read"):
            n = c["len"]
            if c["cmd"] == "write":
                local[:n] = np.frombuffer(pattern(n, c["seed"]), dtype=np.uint8)
                f = e.transfer_sync_write
            else:
                local[:n] = 0
                f = e.transfer_sync_read
            t = time.monotonic()
            out["rc"] = f(c["segment"], local.ctypes.data, c["remote"], n)
            out["seconds"] = time.monotonic() - t
            out["digest"] = hashlib.sha1(local[:n].tobytes()).hexdigest()
        elif c["cmd"] == "stats":
            out["stats"] = json.loads(e.get_stats())
        elif c["cmd"] == "exit":
            e.close()
            print(json.dumps({}), flush=True)
            return
        print(json.dumps(out), flush=True)


class Peer:
    def __init__(self, host, dev, offset, length):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MC_CXL_DEV_PATH": dev,
               "MC_CXL_DEV_SIZE": str(DEVICE)}
        self.p = subprocess.Popen(host.prefix + [sys.executable, __file__, "child", host.ips[0], dev, str(offset),
                                                 str(length)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)
        ready = json.loads(self.p.stdout.readline() or '{"error": "no answer"}')
        assert "error" not in ready, ready
        self.segment, self.buffer = ready["segment"], ready["buffer"]

    def call(self, cmd, **kw):
        self.p.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@pytest.fixture
def hosts():
    fd, dev = tempfile.mkstemp(prefix="mc-cxl-multihost-", dir="/tmp")
    os.ftruncate(fd, DEVICE)
    os.close(fd)
    peers = []
    with netns.Topology(net=78) as net:
        a, b, c = net.host("a"), net.host("b"), net.host("c")
        net.link(a, b)
        net.link(a, c)
        try:
            # Each host maps its own 8 MiB range of the one file (device offsets 8, 16 and 24 MiB).
            for i, h in enumerate((a, b, c)):
                peers.append(Peer(h, dev, (i + 1) * 8 * MiB, 8 * MiB))
            yield peers, dev, a
        finally:
            for p in peers:
                p.close()
            os.unlink(dev)


def sha(data):
    return hashlib.sha1(data).hexdigest()


def test_bytes_move_through_the_shared_file(hosts):
    (a, b, c), _, _ = hosts
    r = a.call("write", segment=b.segment, remote=b.buffer + 4096, len=MiB, seed=3)
    assert r["rc"] == 0, r
    assert b.call("digest", off=4096, len=MiB)["digest"] == sha(pattern(MiB, 3))
    c.call("fill", off=0, len=2 * MiB, seed=9)
    r = a.call("read", segment=c.segment, remote=c.buffer, len=2 * MiB)
    assert r["rc"] == 0 and r["digest"] == sha(pattern(2 * MiB, 9)), r
    stats = a.call("stats")["stats"]
    assert sum(p["bytes"] for p in stats["cxl"].values()) >= 3 * MiB, stats
    assert sum(p.get("bytes", 0) for p in stats.get("tcp", {}).values()) == 0, stats  # no network hop


def test_a_killed_host_fails_and_the_others_stay_intact(hosts):
    (a, b, c), _, _ = hosts
    assert a.call("write", segment=b.segment, remote=b.buffer, len=MiB, seed=1)["rc"] == 0
    c.call("fill", off=0, len=MiB, seed=5)
    before = c.call("digest", off=0, len=8 * MiB)["digest"]
    b.p.send_signal(signal.SIGKILL)
    b.p.wait()
    r = a.call("write", segment=b.segment, remote=b.buffer, len=MiB, seed=2)
    assert r["rc"] != 0 and r["seconds"] < 15, r
    assert a.call("read", segment=b.segment, remote=b.buffer, len=MiB)["rc"] != 0
    assert c.call("digest", off=0, len=8 * MiB)["digest"] == before  # the killed host touched nothing of c's
    r = a.call("read", segment=c.segment, remote=c.buffer, len=MiB)
    assert r["rc"] == 0 and r["digest"] == sha(pattern(MiB, 5)), r


def test_a_host_that_leaves_is_refused(hosts):
    (a, b, c), _, _ = hosts
    assert a.call("write", segment=c.segment, remote=c.buffer, len=4096, seed=4)["rc"] == 0
    c.call("exit")  # closes its engine: its slot on the device closes, its mapping goes
    c.p.wait()
    r = a.call("write", segment=c.segment, remote=c.buffer, len=4096, seed=6)
    assert r["rc"] != 0, r
    assert a.call("write", segment=b.segment, remote=b.buffer, len=4096, seed=6)["rc"] == 0


def test_managed_buffers_are_carved_from_the_device(hosts):
    (a, b, c), dev, host_a = hosts
    d = Peer(host_a, dev, -1, 2 * MiB)  # a second engine on host a, its buffer from allocate_managed_buffer
    hosts[0].append(d)
    r = b.call("write", segment=d.segment, remote=d.buffer, len=MiB, seed=8)
    assert r["rc"] == 0, r
    assert d.call("digest", off=0, len=MiB)["digest"] == sha(pattern(MiB, 8))
    with open(dev, "rb") as f:  # first fit above the device's table: offset 2 MiB of the file
        f.seek(2 * MiB)
        assert f.read(MiB) == pattern(MiB, 8)
    c.call("fill", off=0, len=MiB, seed=10)
    r = d.call("read", segment=c.segment, remote=c.buffer, len=MiB)
    assert r["rc"] == 0 and r["digest"] == sha(pattern(MiB, 10)), r


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "child":
    child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
