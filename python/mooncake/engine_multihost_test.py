"""Multi-NIC striping, failover and path choice between "hosts" made of network namespaces joined by veth
links (rate-limited with tc). Real engine processes on each host, real sockets, P2P handshake metadata."""

import hashlib
import json
import os
import tempfile
import time

import pytest

from mooncake.testing import netns
from mooncake.testing.engine_peer import EnginePeer, pattern

reason = netns.available()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

MiB = 1 << 20
RATE = 200  # Mbit/s per link
FAST_FAILOVER = {"MC_TCP_STALL_TIMEOUT_MS": "1000", "MC_TCP_PROBE_INTERVAL_MS": "200"}


def mb_per_s(mbit):
    return mbit * 1e6 / 8


def paths_by_nic(peer):
    stats = peer.call("stats")["stats"]
    out = {}
    for p in stats.get("tcp", {}).values():
        out[p["local_nic"]] = out.get(p["local_nic"], 0) + p["bytes"]
    return out, stats


def run(peer, **kw):
    r = peer.call("transfer", **kw)
    assert r["rc"] == 0, r
    return r["seconds"]


@pytest.fixture
def two_hosts():
    with netns.Topology() as net:
        a, b = net.host("a"), net.host("b")
        yield net, a, b


def start(host, size, env=None):
    return EnginePeer("P2PHANDSHAKE", host.ips[0], size, env={**FAST_FAILOVER, **(env or {})}, prefix=host.prefix)


def test_two_links_add_up(two_hosts):
    net, a, b = two_hosts
    net.link(a, b, RATE)
    net.link(a, b, RATE)
    size = 96 * MiB
    target = start(b, size)
    one = start(a, size, {"MC_TE_FILTERS": a.nics[0]})
    both = start(a, size)
    try:
        kw = dict(op="write", segment=target.segment, remote=target.buffer, length=size // 2)
        single = (size // 2) / run(one, **kw)
        both.call("fill", offset=0, length=size, seed=1)
        double = size / run(both, **{**kw, "length": size})
        assert target.digest(0, size) == both.digest(0, size)
        by_nic, stats = paths_by_nic(both)
        print(f"one link {single / 1e6:.1f} MB/s, two links {double / 1e6:.1f} MB/s: {double / single:.2f}x; {by_nic}")
        assert double >= 1.8 * single, (single, double, stats)
        assert min(by_nic.values()) > size / 4  # both NICs carried a fair share
    finally:
        for p in (one, both, target):
            p.close()


def test_unequal_links_reach_the_sum(two_hosts):
    net, a, b = two_hosts
    net.link(a, b, RATE)
    net.link(a, b, RATE / 2)
    size = 128 * MiB
    target = start(b, size)
    src = start(a, size)
    try:
        src.call("fill", offset=0, length=size, seed=2)
        rate = size / run(src, op="write", segment=target.segment, remote=target.buffer, length=size)
        by_nic, _ = paths_by_nic(src)
        limit = mb_per_s(RATE + RATE / 2)
        print(f"unequal links: {rate / 1e6:.1f} MB/s of {limit / 1e6:.1f} MB/s: {rate / limit:.2f}x; {by_nic}")
        assert rate >= 0.9 * limit
        assert by_nic[a.nics[0]] > 1.5 * by_nic[a.nics[1]]  # the faster link carried more
        assert target.digest(0, size) == src.digest(0, size)
    finally:
        src.close()
        target.close()


def test_link_down_mid_transfer_completes_and_recovers(two_hosts):
    net, a, b = two_hosts
    net.link(a, b, RATE)
    l2 = net.link(a, b, RATE)
    size = 256 * MiB
    target = start(b, size)
    src = start(a, size)
    try:
        src.call("fill", offset=0, length=size, seed=3)
        src.send("transfer", op="write", segment=target.segment, remote=target.buffer, length=size)
        time.sleep(2)
        net.set_link(l2, up=False)
        result = src.reply()
        assert result["rc"] == 0, result
        assert target.digest(0, size) == src.digest(0, size)
        by_nic, stats = paths_by_nic(src)
        failovers = sum(p["failovers"] for p in stats["tcp"].values())
        print(f"256 MiB with a link lost after 2 s: {result['seconds']:.1f} s, {failovers} slices failed over")
        assert failovers > 0
        assert any(p["state"] == "down" for p in stats["tcp"].values())
        net.set_link(l2, up=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the prober puts the path back into service
            if all(p["state"] == "up" for p in src.call("stats")["stats"]["tcp"].values()):
                break
            time.sleep(0.2)
        before = paths_by_nic(src)[0][a.nics[1]]
        run(src, op="write", segment=target.segment, remote=target.buffer, length=32 * MiB)
        assert paths_by_nic(src)[0][a.nics[1]] > before  # traffic returned to the repaired link
    finally:
        src.close()
        target.close()


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
