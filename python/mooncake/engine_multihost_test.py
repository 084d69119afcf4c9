"""Multi-NIC striping, failover and path choice between "hosts" made of network namespaces joined by veth
links (rate-limited with tc). Real engine processes on each host, real sockets, P2P handshake metadata."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

from mooncake.testing import multihost, netns
from mooncake.testing.multihost import bytes_by_nic as paths_by_nic
from mooncake.testing.multihost import start

reason = netns.available()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

MiB = 1 << 20
RATE = 200  # Mbit/s per link


def run(peer, **kw):
    r = peer.call("transfer", **kw)
    assert r["rc"] == 0, r
    return r["seconds"]


@pytest.fixture
def two_hosts():
    with netns.Topology() as net:
        a, b = net.host("a"), net.host("b")
        yield net, a, b


def test_two_links_add_up():
    r = multihost.striping([RATE, RATE], 96 * MiB)
    print(f"one link {r.single_link_mbps:.1f} MB/s, two links {r.all_links_mbps:.1f} MB/s: "
          f"{r.all_links_mbps / r.single_link_mbps:.2f}x; bytes by NIC {r.by_nic}")
    assert r.verified
    assert r.all_links_mbps >= 1.8 * r.single_link_mbps
    assert min(r.by_nic.values()) > 96 * MiB / 4  # both NICs carried a fair share


def test_unequal_links_reach_the_sum():
    r = multihost.striping([RATE, RATE / 2], 128 * MiB, measure_single=False)
    print(f"unequal links: {r.all_links_mbps:.1f} of {r.limit_mbps:.1f} MB/s: {r.all_links_mbps / r.limit_mbps:.2f}x;"
          f" bytes by NIC {r.by_nic}")
    assert r.verified
    assert r.all_links_mbps >= 0.9 * r.limit_mbps
    nics = sorted(r.by_nic)
    assert r.by_nic[nics[0]] > 1.5 * r.by_nic[nics[1]]  # the faster link carried more


def test_link_down_mid_transfer_completes_and_recovers():
    r = multihost.failover(RATE, 256 * MiB, cut_after_s=2)
    print(f"256 MiB with a link lost after 2 s: {r.seconds:.1f} s, {r.failed_over_slices} slices failed over")
    assert r.verified and r.path_down_seen and r.failed_over_slices > 0
    assert r.recovered  # traffic returned to the repaired link


def test_allow_list_and_custom_topology_are_honoured(two_hosts):
    net, a, b = two_hosts
    net.link(a, b)
    net.link(a, b)
    target = start(b, 8 * MiB)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"cpu:0": [[a.nics[0]], []]}, f)
    peers = []
    try:
        for env, nic in (({"MC_TE_FILTERS": a.nics[1]}, a.nics[1]), ({"MC_CUSTOM_TOPO_JSON": f.name}, a.nics[0])):
            p = start(a, 8 * MiB, env)
            peers.append(p)
            run(p, op="write", segment=target.segment, remote=target.buffer, length=8 * MiB)
            by_nic, stats = paths_by_nic(p)
            assert set(by_nic) == {nic} and by_nic[nic] == 8 * MiB, stats
    finally:
        for p in peers + [target]:
            p.close()
        os.unlink(f.name)


def test_same_host_and_cross_host_selection(two_hosts):
    net, a, b = two_hosts
    net.link(a, b)
    local_target, remote_target = start(a, 4 * MiB), start(b, 4 * MiB)
    src = start(a, 4 * MiB)
    try:
        run(src, op="write", segment=local_target.segment, remote=local_target.buffer, length=4 * MiB)
        run(src, op="write", segment=remote_target.segment, remote=remote_target.buffer, length=4 * MiB)
        stats = src.call("stats")["stats"]
        shm = {k: v["bytes"] for k, v in stats.get("shm", {}).items()}
        tcp = {v["peer"]: v["bytes"] for v in stats["tcp"].values()}
        assert shm.get(local_target.segment) == 4 * MiB and local_target.segment not in tcp
        assert tcp.get(remote_target.segment) == 4 * MiB and remote_target.segment not in shm
    finally:
        for p in (src, local_target, remote_target):
            p.close()


def test_topology_dump_lists_the_hosts_nics(two_hosts):
    net, a, b = two_hosts
    net.link(a, b)
    net.link(a, b)
    dump = [sys.executable, "-m", "mooncake.transfer_engine_topology_dump"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(a.prefix + dump, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    matrix = json.loads(out.stdout)
    assert sorted(sum(matrix["cpu:0"], [])) == sorted(a.nics)
    out = subprocess.run(a.prefix + dump + ["--device_name", a.nics[1]], capture_output=True, text=True, env=env,
                         timeout=60)
    assert sum(json.loads(out.stdout)["cpu:0"], []) == [a.nics[1]]
    out = subprocess.run(a.prefix + dump + ["--verbose"], capture_output=True, text=True, env=env, timeout=60)
    assert f"nic {a.nics[0]}: {a.ips[0]}/24, NUMA node 0" in out.stderr and "CPUs" in out.stderr
