"""``mooncake_client`` (store/client/service.py) as a real process: pure clients (no segment) put into its
pool, and the data outlives the client process that wrote it."""

import subprocess
import sys

from mooncake.store import MooncakeDistributedStore
from mooncake.store.master.testing import MasterProcess, child_env, read_line, stop_process


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
