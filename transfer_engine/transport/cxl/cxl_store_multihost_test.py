"""Store clients with protocol "cxl" on two network-namespace "hosts" that share one file on /tmp standing in for a
CXL device: each client's segment is carved from the device (allocate_managed_buffer), so an object one host puts
is read by the other through the device, with no network hop for the bytes (the master's RPCs do cross the
veth). A real master on host a, one client process per host, P2P handshake metadata."""

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

from mooncake.testing import netns

reason = netns.available()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

MiB = 1 << 20
DEVICE = 64 * MiB


def child(ip, master):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    code = s.setup(ip, "P2PHANDSHAKE", "8MB", "4MB", "cxl", "", master)
    print(json.dumps({"code": code}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        if c["op"] == "put":
            out = {"rc": s.put(c["key"], bytes.fromhex(c["value"]))}
        elif c["op"] == "get":
            out = {"value": s.get(c["key"]).hex()}
        elif c["op"] == "stats":
            out = {"stats": json.loads(s._engine.get_stats())}
        else:
            break
        print(json.dumps(out), flush=True)
    s.close()


def _env(dev):
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MC_CXL_DEV_PATH": dev,
            "MC_CXL_DEV_SIZE": str(DEVICE)}


class Client:
    def __init__(self, host, master, dev):
        self.p = subprocess.Popen(host.prefix + [sys.executable, __file__, "child", host.ips[0], master],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(dev))
        hello = json.loads(self.p.stdout.readline() or '{"code": "no answer"}')
        assert hello["code"] == 0, hello

    def call(self, **kw):
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.write('{"op": "exit"}\n')
            self.p.stdin.flush()
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def _bytes(stats, transport):
    return sum(p.get("bytes", 0) for p in stats.get(transport, {}).values() if isinstance(p, dict))


@pytest.fixture
def cluster():
    fd, dev = tempfile.mkstemp(prefix="mc-cxl-store-hosts-", dir="/tmp")
    os.ftruncate(fd, DEVICE)
    os.close(fd)
    procs = []
    with netns.Topology(net=79) as net:
        a, b = net.host("a"), net.host("b")
        net.link(a, b)
        try:
            master = subprocess.Popen(a.prefix + [sys.executable, "-m", "mooncake.store.master.cli", "--port=0",
                                                  "--metrics_port=0", f"--rpc_address={a.ips[0]}",
                                                  f"--metrics_host={a.ips[0]}", "--log_level=WARNING"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(dev))
            procs.append(master)
            m = re.search(r"listening on \S+:(\d+)", master.stdout.readline())
            assert m, "the master did not start"
            address = f"{a.ips[0]}:{m.group(1)}"
            ca = Client(a, address, dev)
            procs.append(ca)
            cb = Client(b, address, dev)
            procs.append(cb)
            yield ca, cb, dev
        finally:
            for p in reversed(procs):
                if isinstance(p, Client):
                    p.close()
                else:
                    p.kill()
                    p.wait()
            os.unlink(dev)


def test_objects_cross_hosts_through_the_device(cluster):
    a, b, dev = cluster
    value = os.urandom(MiB + 321)
    assert b.call(op="put", key="from-b", value=value.hex())["rc"] == 0
    assert bytes.fromhex(a.call(op="get", key="from-b")["value"]) == value
    # Wherever the master placed it (a's segment or b's), one of the two moved it through the device: the put
    # (b into a's segment) or the get (a from b's segment); neither sent a byte over the network.
    sa, sb = a.call(op="stats")["stats"], b.call(op="stats")["stats"]
    assert _bytes(sa, "cxl") + _bytes(sb, "cxl") >= len(value), (sa, sb)
    assert "tcp" in sa and "tcp" in sb, (sa, sb)  # installed (it reaches the other host), yet unused
    assert _bytes(sa, "tcp") == _bytes(sb, "tcp") == 0, (sa, sb)
    with open(dev, "rb") as f:
        at = f.read().find(value)
    assert at >= 2 * MiB, "the object is not on the device"  # above the device's table, in a client's segment
    other = os.urandom(3 * MiB)
    assert a.call(op="put", key="from-a", value=other.hex())["rc"] == 0
    assert bytes.fromhex(b.call(op="get", key="from-a")["value"]) == other


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "child":
    child(sys.argv[2], sys.argv[3])
