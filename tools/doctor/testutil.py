"""Fake /sys and /proc trees for the doctor's tests: write files under a temporary root."""

from __future__ import annotations

import os
import pathlib


class FakeTree:
    """A root folder; ``write("/sys/class/x", "text")`` creates /root/sys/class/x (parents included)."""

    def __init__(self, root) -> None:
        self.root = str(root)

    def write(self, path: str, text: str = "") -> "FakeTree":
        p = pathlib.Path(self.root, path.lstrip("/"))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")
        return self

    def mkdir(self, path: str) -> "FakeTree":
        pathlib.Path(self.root, path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        return self

    def symlink(self, path: str, target: str) -> "FakeTree":
        p = pathlib.Path(self.root, path.lstrip("/"))
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)
        return self

    def hca(self, name: str, ports: dict) -> "FakeTree":
        """An HCA with ports {n: dict(state=, link_layer=, gids=[(index, gid, type, netdev)])}."""
        base = f"/sys/class/infiniband/{name}"
        self.write(f"{base}/fw_ver", "28.39.1002").write(f"{base}/hca_type", "MT4129")
        for n, p in ports.items():
            pb = f"{base}/ports/{n}"
            self.write(f"{pb}/state", p.get("state", "4: ACTIVE"))
            self.write(f"{pb}/link_layer", p.get("link_layer", "Ethernet"))
            self.write(f"{pb}/rate", "400 Gb/sec (4X NDR)")
            for index, gid, typ, netdev in p.get("gids", []):
                self.write(f"{pb}/gids/{index}", gid)
                self.write(f"{pb}/gid_attrs/types/{index}", typ)
                self.write(f"{pb}/gid_attrs/ndevs/{index}", netdev)
        self.write(f"/dev/infiniband/uverbs{len(os.listdir(os.path.join(self.root, 'sys/class/infiniband'))) - 1}")
        return self

    def limits(self, memlock: str) -> "FakeTree":
        return self.write("/proc/self/limits", "Limit                     Soft Limit           Hard Limit           "
                          f"Units\nMax locked memory         {memlock}              {memlock}              bytes")
