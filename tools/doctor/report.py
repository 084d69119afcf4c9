"""What every doctor check returns, and the host view the checks read from.

A check is a function ``check(host, cfg) -> list[Finding]``. It never raises for a broken or missing host
feature (that is a finding); it reads the machine only through ``Host`` so tests can point it at a fake tree.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

# Finding states, from best to worst. FAIL means the configuration will not work on this host.
OK, INFO, SKIP, WARN, FAIL = "ok", "info", "skip", "warn", "fail"
STATES = (OK, INFO, SKIP, WARN, FAIL)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One line of the report. `fix` says what to do (required for WARN and FAIL)."""
    family: str  # check family: "rdma", "memory", "gpu", ...
    item: str  # what was looked at: "mlx5_0 port 1", "memlock", ...
    state: str  # one of STATES
    detail: str
    fix: str = ""
    data: Optional[dict] = None  # machine-readable facts for --json

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown finding state {self.state!r}")
        if self.state in (WARN, FAIL) and not self.fix:
            raise ValueError(f"a {self.state} finding needs a fix: {self.family}/{self.item}")

    def as_dict(self) -> dict:
        d = {"family": self.family, "item": self.item, "state": self.state, "detail": self.detail,
             "fix": self.fix}
        if self.data is not None:
            d["data"] = self.data
        return d


@dataclasses.dataclass(frozen=True)
class Config:
    """The configuration being checked (parsed, validated command-line options)."""
    protocol: str = "tcp"
    device_names: tuple = ()  # HCA allow-list ("" = all)
    segment_size: int = 16 << 20  # global segment + local buffer bytes this process registers
    metadata_server: str = "P2PHANDSHAKE"
    master: str = ""  # "host:port" of the store master; "" = not checked
    rpc_port_range: tuple = (15000, 17000)
    timeout: float = 3.0  # seconds for each network probe


class Host:
    """Reads this host's /sys, /proc and /dev, or those of a fake tree under `root` (tests).

    Paths are absolute host paths ("/sys/class/infiniband"); they are resolved under `root`. Reads never
    raise: a missing or unreadable file is None (or an empty list)."""

    def __init__(self, root: str = "/") -> None:
        self.root = root

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    def read(self, p: str) -> Optional[str]:
        try:
            with open(self.path(p), errors="replace") as f:
                return f.read().strip()
        except OSError:
            return None

    def listdir(self, p: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(p)))
        except OSError:
            return []

    def exists(self, p: str) -> bool:
        return os.path.exists(self.path(p))

    def readlink(self, p: str) -> Optional[str]:
        try:
            return os.readlink(self.path(p))
        except OSError:
            return None

    @property
    def is_real(self) -> bool:
        """Whether this is the machine itself (network probes and commands only run then)."""
        return os.path.abspath(self.root) == "/"


def worst(findings) -> str:
    """The worst state among `findings` (OK for none)."""
    return max((f.state for f in findings), key=STATES.index, default=OK)
