"""Several "hosts" on one machine: network namespaces joined by veth pairs, optionally rate-limited with
`tc tbf`, with links that can be taken down and up. Needs root (CAP_NET_ADMIN).

Every name carries this process's pid, every address is in 10.<net>.<link>.0/24 inside namespaces the
topology created, and close() deletes the namespaces (their veth ends go with them).

    with Topology() as net:
        a, b = net.host("a"), net.host("b")
        l1 = net.link(a, b, rate_mbit=200)          # a.ips[0] <-> b.ips[0], one subnet per link
        net.set_link(l1, up=False)
        subprocess.run(a.prefix + ["python3", ...])   # run a process on host a
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

_SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_TC = shutil.which("tc", path=_SBIN) or "tc"  # iproute2's tc lives in sbin, often off a test's PATH


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"mc-probe-{os.getpid()}"
    out = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if out.returncode != 0:
        return f"ip netns add failed: {out.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


@dataclass
class Host:
    name: str  # the namespace
    ips: list[str] = field(default_factory=list)
    nics: list[str] = field(default_factory=list)

    @property
    def prefix(self) -> list[str]:
        """Command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.name]


@dataclass
class Link:
    a: Host
    b: Host
    a_nic: str
    b_nic: str
    a_ip: str
    b_ip: str


class Topology:
    def __init__(self, net: int = 77):
        self._net = net  # second octet of every address
        self._tag = f"mc{os.getpid() % 100000}"
        self.hosts: list[Host] = []
        self.links: list[Link] = []

    def host(self, label: str) -> Host:
        h = Host(f"{self._tag}-{label}")
        _ip("netns", "add", h.name)
        self.hosts.append(h)
        _ip("-n", h.name, "link", "set", "lo", "up")
        return h

    def link(self, a: Host, b: Host, rate_mbit: float | None = None) -> Link:
        """A veth pair between a and b on its own /24; `rate_mbit` limits both directions (tc tbf)."""
        n = len(self.links) + 1
        a_nic, b_nic = f"e{n}a", f"e{n}b"
        tmp_a, tmp_b = f"{self._tag}x{n}a", f"{self._tag}x{n}b"
        _ip("link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
        _ip("link", "set", tmp_a, "netns", a.name, "name", a_nic)
        _ip("link", "set", tmp_b, "netns", b.name, "name", b_nic)
        a_ip, b_ip = f"10.{self._net}.{n}.1", f"10.{self._net}.{n}.2"
        for host, nic, ip in ((a, a_nic, a_ip), (b, b_nic, b_ip)):
            _ip("-n", host.name, "addr", "add", f"{ip}/24", "dev", nic)
            _ip("-n", host.name, "link", "set", nic, "up")
            if rate_mbit:
                # burst: enough for 1 ms at the rate (and at least 32 KiB); latency bounds the queue.
                burst = max(32 * 1024, int(rate_mbit * 1e6 / 8 / 1000))
                subprocess.run([_TC, "-n", host.name, "qdisc", "add", "dev", nic, "root", "tbf", "rate",
                                f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"], check=True)
            host.ips.append(ip)
            host.nics.append(nic)
        link = Link(a, b, a_nic, b_nic, a_ip, b_ip)
        self.links.append(link)
        return link

    def set_link(self, link: Link, up: bool) -> None:
        """Takes both ends of a link down (or up again)."""
        state = "up" if up else "down"
        _ip("-n", link.a.name, "link", "set", link.a_nic, state)
        _ip("-n", link.b.name, "link", "set", link.b_nic, state)

    def close(self) -> None:
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h.name], capture_output=True)
        self.hosts.clear()
        self.links.clear()

    def __enter__(self) -> "Topology":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
