"""The rdma transport between two "hosts" (network namespaces joined by two veth links) on the FAKE verbs
provider: each host has two fake HCAs, each bound to one of its veth interfaces (the port is ACTIVE only while
the interface has carrier, the RoCEv2 GID is its IPv4 address) and emulating a 40 MB/s link so a transfer takes
long enough to cut. Real engine processes on each host, the plugin .so from MC_PLUGIN_DIR, P2P handshake
metadata. Striping over both NICs, and a link cut mid-transfer whose work moves to the other NIC pair.
Needs root (the namespaces); skipped otherwise."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from mooncake.testing import netns

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "testing", "libfake_ibverbs.so")
MiB = 1 << 20

reason = netns.available()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

STATE = tempfile.mkdtemp(prefix="rdma_fake_", dir=os.environ.get("TEST_TMPDIR"))


class Peer:
    def __init__(self, host, size, rates=(40, 40)):
        drop = ("MC_PLUGIN_DIR", "MC_RDMA_FAKE_LIBRARY", "MC_RDMA_FAKE_STATE", "MC_RDMA_FAKE_HOST")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        devices = ",".join(f"mlx5_{i}:netdev={nic}:mbps={rate}" for i, (nic, rate) in enumerate(zip(host.nics, rates)))
        env.update(PYTHONPATH=os.pathsep.join(sys.path), MC_PLUGIN_DIR=HERE, MC_RDMA_FAKE_LIBRARY=FAKE,
                   MC_RDMA_FAKE_STATE=STATE, MC_RDMA_FAKE_HOST=host.name, MC_RDMA_FAKE_DEVICES=devices,
                   MC_RDMA_FAKE_RETRY_MS="300", MC_RDMA_BACKOFF_MS="200")
        self.p = subprocess.Popen(host.prefix + [sys.executable, "-m", "mooncake.testing.netns_peer", host.ips[0], str(size), "rdma"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = json.loads(self.p.stdout.readline() or '{"rc": "died"}')
        assert self.info["rc"] == 0, self.info
        self.lock = threading.Lock()

    def call(self, cmd, **kw):
        with self.lock:
            self.p.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
            self.p.stdin.flush()
            return json.loads(self.p.stdout.readline())

    def paths(self):
        """{path label: {state, failures, bytes}} over every rdma peer."""
        stats = self.call("stats")["stats"]
        out = {}
        for peer in stats.get("rdma", {}).values():
            if isinstance(peer, dict):
                out.update(peer.get("paths", {}))
        return out

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()


def local_bytes(paths, nic):
    return sum(p["bytes"] for label, p in paths.items() if label.startswith(nic + "->"))


@pytest.fixture
def net():
    with netns.Topology(net=81) as t:
        yield t


def test_two_nics_are_striped_and_a_cut_link_hands_its_work_to_the_other(net):
    a, b = net.host("a"), net.host("b")
    net.link(a, b)
    second = net.link(a, b)
    size = 128 * MiB
    target, initiator = Peer(b, size), Peer(a, size)
    try:
        seg, addr = target.info["segment"], target.info["addr"]
        initiator.call("fill", seed=5)
        r = initiator.call("transfer", op="write", segment=seg, remote=addr, length=16 * MiB)
        assert r["rc"] == 0, r
        assert target.call("digest", length=16 * MiB) == initiator.call("digest", length=16 * MiB)
        striped = initiator.paths()
        print(f"16 MiB over two fake NICs in {r['seconds']:.2f} s: "
              f"{ {k: v['bytes'] for k, v in striped.items()} }")
        assert local_bytes(striped, "mlx5_0") >= 4 * MiB and local_bytes(striped, "mlx5_1") >= 4 * MiB, striped

        initiator.call("fill", seed=6)
        result = {}

        def move():
            result.update(initiator.call("transfer", op="write", segment=seg, remote=addr, length=size))

        t = threading.Thread(target=move)
        t.start()
        time.sleep(0.5)
        net.set_link(second, up=False)
        cut = time.monotonic()
        t.join(timeout=90)
        assert not t.is_alive(), "the transfer did not end within 90 s of the cut"
        took = time.monotonic() - cut
        after = initiator.paths()
        print(f"128 MiB write, second link cut after 0.5 s: rc {result.get('rc')} in {result.get('seconds', 0):.2f} s, "
              f"ended {took:.1f} s after the cut; paths {json.dumps(after)}")
        assert result["rc"] == 0, result
        assert target.call("digest", length=size) == initiator.call("digest", length=size)
        moved_on_first = local_bytes(after, "mlx5_0") - local_bytes(striped, "mlx5_0")
        assert moved_on_first > size // 2, "the first NIC took over the rest"
        assert sum(p["failures"] for label, p in after.items() if label.startswith("mlx5_1->")) >= 1, after

        # The surviving NIC pair serves reads too, verified.
        target.call("fill", seed=7)
        r = initiator.call("transfer", op="read", segment=seg, remote=addr, length=8 * MiB)
        assert r["rc"] == 0, r
        assert target.call("digest", length=8 * MiB) == initiator.call("digest", length=8 * MiB)

        # The link comes back: after the backoff the second NIC carries traffic again.
        net.set_link(second, up=True)
        time.sleep(2)
        before = local_bytes(initiator.paths(), "mlx5_1")
        deadline = time.monotonic() + 30
        while local_bytes(initiator.paths(), "mlx5_1") == before and time.monotonic() < deadline:
            r = initiator.call("transfer", op="write", segment=seg, remote=addr, length=8 * MiB)
            assert r["rc"] == 0, r
        assert local_bytes(initiator.paths(), "mlx5_1") > before, initiator.paths()
    finally:
        initiator.close()
        target.close()


def test_striping_follows_the_measured_throughput(net):
    # mlx5_0 moves 40 MB/s, mlx5_1 10 MB/s (the fake's emulated rates, on both hosts): after a first transfer
    # has measured both, a transfer is split by the measured rates (about 4:1) instead of 1:1.
    a, b = net.host("a"), net.host("b")
    net.link(a, b)
    net.link(a, b)
    size = 32 * MiB
    target, initiator = Peer(b, size, rates=(40, 10)), Peer(a, size, rates=(40, 10))
    try:
        seg, addr = target.info["segment"], target.info["addr"]
        initiator.call("fill", seed=8)
        assert initiator.call("transfer", op="write", segment=seg, remote=addr, length=8 * MiB)["rc"] == 0
        first = initiator.paths()
        r = initiator.call("transfer", op="write", segment=seg, remote=addr, length=size)
        assert r["rc"] == 0, r
        assert target.call("digest", length=size) == initiator.call("digest", length=size)
        after = initiator.paths()
        fast = local_bytes(after, "mlx5_0") - local_bytes(first, "mlx5_0")
        slow = local_bytes(after, "mlx5_1") - local_bytes(first, "mlx5_1")
        print(f"32 MiB over 40 + 10 MB/s NICs in {r['seconds']:.2f} s: {fast / MiB:.1f} MiB on mlx5_0, "
              f"{slow / MiB:.1f} MiB on mlx5_1; measured {json.dumps({k: v['mbps'] for k, v in after.items()})}")
        # Byte counts, not times: both NICs carried part of it, every byte is accounted for, and the split
        # follows the throughput measured before this transfer (on a loaded machine the measured ratio may
        # be below the emulated 4:1, so it is compared with what was measured; a 1:1 split fails both).
        assert fast > 0 and slow > 0, (fast, slow)
        assert fast + slow >= size, (fast, slow)
        m_fast = sum(p.get("mbps", 0) for label, p in first.items() if label.startswith("mlx5_0->"))
        m_slow = sum(p.get("mbps", 0) for label, p in first.items() if label.startswith("mlx5_1->"))
        assert m_fast > m_slow > 0, first
        assert fast > 1.5 * slow, (fast, slow, m_fast, m_slow)
        assert abs(fast / size - m_fast / (m_fast + m_slow)) < 0.2, (fast, slow, m_fast, m_slow)
    finally:
        initiator.close()
        target.close()
