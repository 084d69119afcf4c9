"""Multi-host scenarios on one machine (network namespaces, see netns.py) shared by the multi-host tests and
the multi-NIC benchmark: each builds two hosts, runs engine processes on them and reports what it measured."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mooncake.testing import netns
from mooncake.testing.engine_peer import EnginePeer

MiB = 1 << 20
# Fail over after 1 s without progress, probe down paths every 200 ms: scenarios finish quickly.
FAST_FAILOVER = {"MC_TCP_STALL_TIMEOUT_MS": "1000", "MC_TCP_PROBE_INTERVAL_MS": "200"}


def start(host: netns.Host, size: int, env: dict | None = None) -> EnginePeer:
    """An engine process on `host`, named after its first address (P2P handshake)."""
    return EnginePeer("P2PHANDSHAKE", host.ips[0], size, env={**FAST_FAILOVER, **(env or {})}, prefix=host.prefix)


def bytes_by_nic(peer: EnginePeer) -> tuple[dict, dict]:
    stats = peer.call("stats")["stats"]
    out: dict = {}
    for p in stats.get("tcp", {}).values():
        out[p["local_nic"]] = out.get(p["local_nic"], 0) + p["bytes"]
    return out, stats


def write(src: EnginePeer, dst: EnginePeer, length: int) -> float:
    """Seconds for one synchronous write of `length` bytes from src's buffer into dst's."""
    r = src.call("transfer", op="write", segment=dst.segment, remote=dst.buffer, length=length)
    if r["rc"] != 0:
        raise RuntimeError(f"transfer failed: {r}")
    return r["seconds"]


@dataclass
class Striping:
    rates_mbit: list[float]
    single_link_mbps: float  # MB/s through the first link alone (NIC allow-list)
    all_links_mbps: float    # MB/s through all links
    by_nic: dict = field(default_factory=dict)
    verified: bool = False

    @property
    def limit_mbps(self) -> float:
        return sum(self.rates_mbit) * 1e6 / 8 / 1e6


def striping(rates_mbit: list[float], size: int, measure_single: bool = True) -> Striping:
    """Two hosts joined by one link per rate; throughput over the first link alone and over all of them."""
    with netns.Topology() as net:
        a, b = net.host("a"), net.host("b")
        for r in rates_mbit:
            net.link(a, b, r)
        target = start(b, size)
        peers = [target]
        try:
            single = 0.0
            if measure_single:
                one = start(a, size, {"MC_TE_FILTERS": a.nics[0]})
                peers.append(one)
                single = (size // 2) / write(one, target, size // 2) / 1e6
            src = start(a, size)
            peers.append(src)
            src.call("fill", offset=0, length=size, seed=1)
            rate = size / write(src, target, size) / 1e6
            by_nic, _ = bytes_by_nic(src)
            return Striping(rates_mbit, single, rate, by_nic, target.digest(0, size) == src.digest(0, size))
        finally:
            for p in peers:
                p.close()


@dataclass
class Failover:
    seconds: float          # the whole transfer, link loss included
    failed_over_slices: int
    verified: bool
    path_down_seen: bool
    recovered: bool         # the repaired link carried traffic again


def failover(rate_mbit: float, size: int, cut_after_s: float) -> Failover:
    """Two hosts, two links; the second link goes down `cut_after_s` into a `size` write, then comes back."""
    with netns.Topology() as net:
        a, b = net.host("a"), net.host("b")
        net.link(a, b, rate_mbit)
        second = net.link(a, b, rate_mbit)
        target, src = start(b, size), start(a, size)
        try:
            src.call("fill", offset=0, length=size, seed=3)
            src.send("transfer", op="write", segment=target.segment, remote=target.buffer, length=size)
            time.sleep(cut_after_s)
            net.set_link(second, up=False)
            result = src.reply()
            if result["rc"] != 0:
                raise RuntimeError(f"transfer failed: {result}")
            verified = target.digest(0, size) == src.digest(0, size)
            by_nic, stats = bytes_by_nic(src)
            moved = sum(p["failovers"] for p in stats["tcp"].values())
            down_seen = any(p["state"] == "down" for p in stats["tcp"].values())
            net.set_link(second, up=True)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:  # the prober puts the path back into service
                if all(p["state"] == "up" for p in src.call("stats")["stats"]["tcp"].values()):
                    break
                time.sleep(0.2)
            before = bytes_by_nic(src)[0].get(a.nics[1], 0)
            write(src, target, 32 * MiB)
            recovered = bytes_by_nic(src)[0].get(a.nics[1], 0) > before
            return Failover(result["seconds"], moved, verified, down_seen, recovered)
        finally:
            src.close()
            target.close()
