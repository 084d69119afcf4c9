"""The leader cut off from etcd (network namespaces: its link goes down): it stops serving, the standby is
elected; when the link comes back the old leader is a standby that catches up, and clients never get its stale
view. Needs root (skipped otherwise)."""

import json
import subprocess
import sys
import time

import pytest

from mooncake.store.master.testing import child_env
from mooncake.testing import netns

TTL = 2
_PROBE = """
import json, sys, urllib.request, grpc
from mooncake.store.common.master_client import MasterClient
out = {}
try:
    with urllib.request.urlopen("http://127.0.0.1:%s/health", timeout=2) as r:
        out["health"] = json.loads(r.read())
except OSError as e:
    out["health"] = {"error": str(e)}
c = MasterClient("127.0.0.1:%s", timeout=1)
try:
    out["view"] = c.call("GetServiceInfo", timeout=1).view_version
except grpc.RpcError as e:
    out["view"] = str(e.code())
c.close()
print(json.dumps(out))
"""


def _probe(host, port, metrics):
    """/health and a GetServiceInfo of the master on `host`, asked from inside its namespace."""
    out = subprocess.run(host.prefix + [sys.executable, "-c", _PROBE % (metrics, port)], capture_output=True,
                         text=True, env=child_env(), timeout=30)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def net():
    why = netns.available()
    if why:
        pytest.skip(why)
    with netns.Topology(net=91) as t:
        yield t


def test_partitioned_leader_steps_down_and_returns_as_standby(net, tmp_path):
    e, a, b = net.host("etcd"), net.host("ma"), net.host("mb")
    l_ae, l_be = net.link(a, e), net.link(b, e)
    procs = []
    try:
        procs.append(subprocess.Popen(
            e.prefix + ["etcd", "--name", "e", "--data-dir", str(tmp_path / "etcd"),
                        "--listen-client-urls", "http://0.0.0.0:2379",
                        "--advertise-client-urls", f"http://{l_ae.b_ip}:2379",
                        "--listen-peer-urls", "http://127.0.0.1:2380",
                        "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                        "--initial-cluster", "e=http://127.0.0.1:2380", "--log-level", "error", "--logger", "zap"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.5)

        def master(host, etcd_ip):
            return subprocess.Popen(host.prefix + [
                sys.executable, "-m", "mooncake.store.master.cli", "--enable_ha", f"--ha_lease_ttl={TTL}",
                f"--ha_backend_connstring={etcd_ip}:2379", "--oplog_poll_interval_ms=50", "--port=50051",
                "--metrics_port=9003", "--rpc_address=0.0.0.0", "--log_level=WARNING"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())

        procs.append(master(a, l_ae.b_ip))
        procs[-1].stdout.readline()
        deadline = time.monotonic() + 20
        while _probe(a, 50051, 9003)["health"].get("role") != "leader":
            assert time.monotonic() < deadline, "a never became the leader"
            time.sleep(0.2)
        procs.append(master(b, l_be.b_ip))
        procs[-1].stdout.readline()
        old_view = _probe(a, 50051, 9003)["view"]
        assert isinstance(old_view, int) and _probe(b, 50051, 9003)["health"]["role"] == "standby"

        net.set_link(l_ae, up=False)
        cut = time.monotonic()
        while _probe(b, 50051, 9003)["health"].get("role") != "leader":
            assert time.monotonic() - cut < 10 * TTL, "b was not elected"
            time.sleep(0.1)
        new = _probe(b, 50051, 9003)
        assert new["view"] > old_view
        stale = _probe(a, 50051, 9003)  # cut off: it no longer serves (it stopped before b was elected)
        assert stale["view"] == "StatusCode.UNAVAILABLE" and stale["health"]["role"] == "standby", stale

        net.set_link(l_ae, up=True)
        deadline = time.monotonic() + 20
        while True:
            back = _probe(a, 50051, 9003)
            if back["health"].get("ha", {}).get("leader_view") == new["view"]:
                break
            assert time.monotonic() < deadline, back
            time.sleep(0.2)
        assert back["health"]["role"] == "standby" and back["view"] == "StatusCode.UNAVAILABLE"
        assert _probe(b, 50051, 9003)["health"]["role"] == "leader"
    finally:
        for p in reversed(procs):
            p.kill()
            p.wait()
