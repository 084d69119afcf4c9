"""``mooncake_client`` (store/client/service.py) as a real process: pure clients (no segment) put into its
pool, and the data outlives the client process that wrote it; with an SSD tier the service persists what
others wrote into its pool."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.client.store_worker import pattern
from mooncake.store.client.testing import StoreWorker
from mooncake.store.master.testing import MasterProcess, child_env, process_starter, read_line, stop_process

KiB = 1 << 10


@pytest.fixture
def cluster():
    yield from process_starter()


def _pure_client(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, "4MB", "tcp", "", master.address) == 0
    return s


def test_service_pool_survives_client_restart():
    master = MasterProcess()
    svc = subprocess.Popen([sys.executable, "-m", "mooncake.store.client.service", "--master_server_address",
                            master.address, "--global_segment_size", "32MB", "--log_level", "WARNING"],
                           stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        banner = read_line(svc, 30)
        assert banner.startswith("mooncake_client ready: segment 127.0.0.1:") and "size 33554432" in banner
        segment = banner.split()[3]
        s = _pure_client(master)
        assert s.put("kv", b"cached" * 1000) == 0
        assert s.get_replica_desc("kv")[0].segment_name == segment
        s.close()
        s = _pure_client(master)  # the "inference process" restarted
        assert s.get("kv") == b"cached" * 1000
        s.close()
        svc.terminate()
        assert svc.wait(15) == 0
    finally:
        stop_process(svc, 5)
        master.stop()


def test_service_setup_failure_exits_1():
    out = subprocess.run([sys.executable, "-m", "mooncake.store.client.service", "--protocol", "bogus",
                          "--log_level", "ERROR"], capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 1 and "setup failed" in out.stderr
    env = {k: v for k, v in child_env().items() if k != "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"}
    out = subprocess.run([sys.executable, "-m", "mooncake.store.client.service", "--enable_offload=true",
                          "--log_level", "ERROR"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1 and "ssd_offload_path" in out.stderr  # an SSD tier needs a directory


# -- the pool's SSD tier -------------------------------------------------------------------------------------------
FAST = ("--client_ttl=2", "--monitor_interval_ms=50", "--default_kv_lease_ttl=200",
        "--eviction_high_watermark_ratio=0.9")
N, SIZE = 10, 512 * KiB


class _Service:
    """A `mooncake_client` process with an 8 MiB pool and an SSD tier at `ssd` (pings every 0.2 s)."""

    def __init__(self, master, ssd):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mooncake.store.client.service", "--master_server_address", master.address,
             "--global_segment_size", "8MB", "--enable_offload", "--ssd_offload_path", str(ssd),
             "--log_level", "WARNING"],
            stdout=subprocess.PIPE, text=True, env={**child_env(), "MC_STORE_HEARTBEAT_INTERVAL": "0.2"})
        try:
            self.banner = read_line(self.proc, 30)
        except (TimeoutError, RuntimeError):
            stop_process(self.proc, 2)
            raise
        assert self.banner.startswith("mooncake_client ready:") and self.banner.split()[-2:] == ["ssd", str(ssd)]

    def stop(self):
        return stop_process(self.proc, 15)


def _query(master, key):
    """The master's view of `key` (admin /query_key: no lease, no LRU touch), or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{master.metrics_port}/query_key?key={key}", timeout=5) as r:
            return json.load(r)["data"]
    except urllib.error.HTTPError:
        return None


def _wait(fn, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not fn() and time.monotonic() < deadline:
        time.sleep(0.05)
    return fn()


def _descs(w, key):
    return [(d["memory"], d["local_disk"], d["size"]) for d in w.request({"op": "descs", "key": key})["descs"]]


def test_service_ssd_tier_persists_other_clients_objects(cluster, tmp_path):
    """Pure clients write into the pool of a `mooncake_client` with an SSD tier: the service persists their
    objects, which stay readable (get, get_into) once evicted from memory, from any client and across a
    restart of the service; removing them deletes the files."""
    m = cluster(MasterProcess, *FAST)
    ssd = tmp_path / "pool"
    svc = cluster(_Service, m, ssd)
    writer = cluster(StoreWorker, m.address, "0", "8MB")  # global_segment_size=0: everything in the pool
    reader = cluster(StoreWorker, m.address, "0", "8MB")
    for i in range(N):
        assert writer.call("put", f"e{i}", pattern(SIZE, i)) == 0
    t0 = time.monotonic()
    assert _wait(lambda: all((_query(m, f"e{i}") or {}).get("disk_replica") for i in range(N)))
    assert time.monotonic() - t0 < 5                          # about one ping of the owner (0.2 s here)
    assert len([n for n in os.listdir(ssd) if not n.startswith(".")]) == N
    for i in range(30):                                       # 15 MiB more through the 8 MiB pool
        assert writer.call("put", f"f{i}", pattern(SIZE, 100 + i)) == 0
    assert all(_query(m, f"e{i}")["replicas"] == [] for i in range(N))  # evicted first: they are on disk
    assert _descs(reader, "e0") == [(False, True, SIZE)]
    assert reader.call("get", "e0") == pattern(SIZE, 0)       # served by the service from its file
    got = reader.request({"op": "get_into", "key": "e1", "size": SIZE})
    assert got["n"] == SIZE and got["data"] == {"b64": base64.b64encode(pattern(SIZE, 1)).decode()}
    assert writer.call("get_batch", ["e2", "e3", "nope"]) == [pattern(SIZE, 2), pattern(SIZE, 3), b""]


    svc.stop()                                                # SIGTERM: close withdraws its disk replicas ...
    assert _descs(reader, "e4") == [] and reader.call("get", "e4") == b""
    cluster(_Service, m, ssd)                                 # ... and a restart reports its files again
    assert reader.call("get", "e4") == pattern(SIZE, 4) and _descs(reader, "e5") == [(False, True, SIZE)]

    time.sleep(0.3)                                           # the reads' leases (200 ms)
    assert writer.call("remove", "e5") == 0                   # by a client that is not the owner
    assert reader.call("get", "e5") == b""
    assert _wait(lambda: not (ssd / hashlib.sha1(b"e5").hexdigest()).exists())  # at the service's next ping
    assert writer.call("remove_all") >= N - 2
    assert _wait(lambda: [n for n in os.listdir(ssd) if not n.startswith(".")] == [])
