"""Store clients with protocol "efa" over libfabric's tcp;ofi_rxm provider (the efa plugin from MC_PLUGIN_DIR):
a real master and two client processes, each in its own PID namespace so they count as different hosts (on one
host the same-host transport would carry the bytes). An object put by one client is read by the other, and
the efa transport carried the bytes."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from mooncake.store.master.testing import MasterProcess, child_env, read_line

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
UNSHARE = shutil.which("unshare")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not UNSHARE,
                                reason="the clients' PID namespaces need root and unshare(1)")


def child(master):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    code = s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "8MB", "efa", "lo", master)
    print(json.dumps({"code": code}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        if c["op"] == "put":
            out = {"rc": s.put(c["key"], bytes.fromhex(c["value"]))}
        elif c["op"] == "get":
            out = {"value": s.get(c["key"]).hex()}
        elif c["op"] == "efa_bytes":
            stats = json.loads(s._engine.get_stats())
            out = {"efa": sum(v.get("bytes", 0) for v in stats.get("efa", {}).values()), "stats": stats}
        else:
            break
        print(json.dumps(out), flush=True)
    s.close()


class Client:
    def __init__(self, master):
        env = {**child_env(), "FI_PROVIDER": "tcp;ofi_rxm", "MC_PLUGIN_DIR": HERE}
        self.p = subprocess.Popen([UNSHARE, "--pid", "--fork", sys.executable, __file__, "child", master],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = json.loads(read_line(self.p, 60))
        assert hello["code"] == 0, hello

    def call(self, **kw):
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        return json.loads(read_line(self.p, 60))

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.write('{"op": "exit"}\n')
            self.p.stdin.flush()
            self.p.wait(20)


def test_put_and_get_between_clients_over_efa():
    master = MasterProcess()
    a = b = None
    try:
        a, b = Client(master.address), Client(master.address)
        values = {f"k{i}": os.urandom(size) for i, size in enumerate([1, 4096, MiB + 123, 3 * MiB])}
        for key, value in values.items():
            assert a.call(op="put", key=key, value=value.hex())["rc"] == 0
        for key, value in values.items():
            assert bytes.fromhex(b.call(op="get", key=key)["value"]) == value, key
            assert bytes.fromhex(a.call(op="get", key=key)["value"]) == value, key
        moved = a.call(op="efa_bytes")["efa"] + b.call(op="efa_bytes")["efa"]
        print(f"efa carried {moved} bytes between the two store clients")
        # Every object lies in one client's segment; the other moved it over efa (put or get).
        assert moved >= sum(len(v) for v in values.values()), (a.call(op="efa_bytes"), b.call(op="efa_bytes"))
    finally:
        for c in (a, b):
            if c:
                c.close()
        master.stop()


def test_store_workers_take_the_protocol_from_their_flags():
    """store_worker.py (what multi-process store tests and the benches run) with --protocol efa --device lo:
    two workers, each in its own PID namespace, put and get through efa, and efa carried the bytes."""
    from mooncake.store.client.testing import StoreWorker

    master = MasterProcess()
    env = {"FI_PROVIDER": "tcp;ofi_rxm", "MC_PLUGIN_DIR": HERE}
    prefix = [UNSHARE, "--pid", "--fork", "--kill-child"]
    workers = []
    try:
        for _ in range(2):
            workers.append(StoreWorker(master.address, segment="16MB", buffer="8MB", env=env, protocol="efa",
                                       device="lo", prefix=prefix))
        a, b = workers
        values = {f"w{i}": os.urandom(size) for i, size in enumerate([7, 65536, 2 * MiB + 5])}
        for key, value in values.items():
            assert a.call("put", key, value) == 0, key
        for key, value in values.items():
            assert b.call("get", key) == value, key
        stats = [w.request({"op": "engine_stats"})["stats"] for w in workers]
        moved = sum(v.get("bytes", 0) for st in stats for v in st.get("efa", {}).values())
        # With the protocol hard-coded to tcp, efa (a software provider: used only where asked for) moves none.
        assert moved >= sum(len(v) for v in values.values()), stats
    finally:
        for w in workers:
            w.stop()
        master.stop()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "child":
    child(sys.argv[2])
