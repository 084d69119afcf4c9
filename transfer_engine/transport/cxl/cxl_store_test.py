"""Store clients with protocol "cxl": each client's segment (and local buffer) comes from allocate_managed_buffer,
which carves it from the shared device, so an object put by one client lies on the device and another client
reads it from there. A real master and two client processes on one host sharing a file on /dev/shm."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

from mooncake.store.master.testing import MasterProcess, child_env, read_line

MiB = 1 << 20
DEVICE = 64 * MiB


def child(master):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    code = s.setup("127.0.0.1", "P2PHANDSHAKE", "8MB", "4MB", "cxl", "", master)
    print(json.dumps({"code": code, "hostname": s.get_hostname() if code == 0 else ""}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        if c["op"] == "put":
            out = {"rc": s.put(c["key"], bytes.fromhex(c["value"]))}
        elif c["op"] == "get":
            out = {"value": s.get(c["key"]).hex()}
        else:
            break
        print(json.dumps(out), flush=True)
    s.close()


class Client:
    def __init__(self, master, dev):
        env = {**child_env(), "MC_CXL_DEV_PATH": dev, "MC_CXL_DEV_SIZE": str(DEVICE)}
        self.p = subprocess.Popen([sys.executable, __file__, "child", master], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        hello = json.loads(read_line(self.p, 60))
        assert hello["code"] == 0, hello
        self.hostname = hello["hostname"]

    def call(self, **kw):
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        return json.loads(read_line(self.p, 60))

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.write('{"op": "exit"}\n')
            self.p.stdin.flush()
            self.p.wait(20)


@pytest.fixture
def device():
    fd, dev = tempfile.mkstemp(prefix="mc-cxl-store-", dir="/dev/shm")
    os.ftruncate(fd, DEVICE)
    os.close(fd)
    yield dev
    os.unlink(dev)


def test_objects_live_on_the_device(device):
    master = MasterProcess()
    a = b = None
    try:
        a, b = Client(master.address, device), Client(master.address, device)
        value = os.urandom(1 * MiB + 123)
        assert a.call(op="put", key="k", value=value.hex())["rc"] == 0
        assert bytes.fromhex(b.call(op="get", key="k")["value"]) == value
        with open(device, "rb") as f:
            data = f.read()
        at = data.find(value)
        assert at >= 2 * MiB, "the object is not on the device"  # above the device's table, in a segment
    finally:
        for c in (a, b):
            if c:
                c.close()
        master.stop()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "child":
    child(sys.argv[2])
