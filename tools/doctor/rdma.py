"""RDMA: HCAs, ports, link layers and GIDs from /sys/class/infiniband, and the GID an engine would use.

GID choice (per port): ``MC_GID_INDEX`` when set; on InfiniBand index 0; on Ethernet (RoCE) the first RoCE v2
GID holding an IPv4-mapped address (``::ffff:a.b.c.d``), else the first RoCE v2 GID, else the first non-zero
one. A port without a usable GID cannot carry RDMA traffic.
"""

from __future__ import annotations

import ipaddress
import os

from .report import FAIL, INFO, OK, SKIP, WARN, Config, Finding, Host

SYS_IB = "/sys/class/infiniband"
RDMA_PROTOCOLS = ("rdma",)
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _port_state(text: str | None) -> str:
    """'4: ACTIVE' -> 'ACTIVE'."""
    return (text or "?").split(":")[-1].strip()


def read_gids(host: Host, dev: str, port: str) -> list[dict]:
    """The non-zero GIDs of one port: index, gid, type ("RoCE v2", "IB/RoCE v1", "" unknown), netdev, ipv4."""
    base = f"{SYS_IB}/{dev}/ports/{port}"
    out = []
    for name in host.listdir(f"{base}/gids"):
        if not name.isdigit():
            continue
        gid = host.read(f"{base}/gids/{name}")
        if not gid or gid == _ZERO_GID:
            continue
        try:
            addr = ipaddress.IPv6Address(gid)
        except ValueError:
            continue
        mapped = addr.ipv4_mapped
        out.append({"index": int(name), "gid": gid, "type": host.read(f"{base}/gid_attrs/types/{name}") or "",
                    "netdev": host.read(f"{base}/gid_attrs/ndevs/{name}") or "",
                    "ipv4": str(mapped) if mapped else ""})
    return sorted(out, key=lambda g: g["index"])


def choose_gid(gids: list[dict], link_layer: str, env_index: str | None) -> tuple[dict | None, str]:
    """The GID an engine would use on a port and why; (None, reason) when none fits."""
    if env_index not in (None, ""):
        try:
            want = int(env_index)
        except ValueError:
            return None, f"MC_GID_INDEX={env_index!r} is not an integer"
        for g in gids:
            if g["index"] == want:
                return g, f"MC_GID_INDEX={want}"
        return None, f"MC_GID_INDEX={want} is not a non-zero GID of this port"
    if not gids:
        return None, "the port has no non-zero GID (no IP address on its netdev?)"
    if link_layer.lower() == "infiniband":
        return gids[0], "InfiniBand: first GID"
    v2 = [g for g in gids if g["type"].lower() == "roce v2"]
    for g in v2:
        if g["ipv4"]:
            return g, "first RoCE v2 GID with an IPv4 address"
    if v2:
        return v2[0], "first RoCE v2 GID (none has an IPv4 address)"
    return gids[0], "no RoCE v2 GID: first GID (RoCE v1 does not route across subnets)"


def check(host: Host, cfg: Config) -> list[Finding]:
    wanted = cfg.protocol in RDMA_PROTOCOLS
    devices = host.listdir(SYS_IB)
    if not devices:
        if wanted:
            return [Finding("rdma", "devices", FAIL, f"no RDMA device ({SYS_IB} is empty or absent)",
                            "install the HCA driver (rdma-core, mlx5_ib/irdma/efa ...) or use --protocol tcp")]
        return [Finding("rdma", "devices", INFO, "no RDMA device (not needed for --protocol " + cfg.protocol + ")")]
    findings = []
    unknown = [d for d in cfg.device_names if d not in devices]
    if unknown:
        findings.append(Finding("rdma", "device_name", FAIL if wanted else WARN,
                                f"not on this host: {', '.join(unknown)} (found: {', '.join(devices)})",
                                "pass --device-name with names from `ls /sys/class/infiniband`"))
    selected = [d for d in devices if not cfg.device_names or d in cfg.device_names]
    if not host.listdir("/dev/infiniband"):
        findings.append(Finding("rdma", "/dev/infiniband", FAIL if wanted else WARN,
                                "no uverbs device files: user space cannot open the HCAs",
                                "load ib_uverbs; in a container pass --device=/dev/infiniband"))
    usable_ports = 0
    env_gid = os.environ.get("MC_GID_INDEX")
    for dev in selected:
        base = f"{SYS_IB}/{dev}"
        ports = [p for p in host.listdir(f"{base}/ports") if p.isdigit()]
        fw = host.read(f"{base}/fw_ver") or "?"
        findings.append(Finding("rdma", dev, INFO, f"{host.read(f'{base}/hca_type') or 'HCA'}, firmware {fw}, "
                                f"{len(ports)} port(s)", data={"fw_ver": fw, "ports": ports}))
        for port in ports:
            pbase = f"{base}/ports/{port}"
            state = _port_state(host.read(f"{pbase}/state"))
            link = host.read(f"{pbase}/link_layer") or "?"
            rate = host.read(f"{pbase}/rate") or "?"
            gids = read_gids(host, dev, port)
            gid, why = choose_gid(gids, link, env_gid)
            item = f"{dev} port {port}"
            data = {"state": state, "link_layer": link, "rate": rate, "gids": gids,
                    "chosen_gid": gid["index"] if gid else None}
            if state != "ACTIVE":
                findings.append(Finding("rdma", item, WARN, f"{link}, state {state}", "check the cable/switch "
                                        "port (`ibstat`); a port that is not ACTIVE carries nothing", data))
            elif gid is None:
                findings.append(Finding("rdma", item, WARN, f"{link} {rate}, ACTIVE, no usable GID: {why}",
                                        "give the port's netdev an IP address, or set MC_GID_INDEX", data))
            else:
                usable_ports += 1
                where = f" on {gid['netdev']}" if gid["netdev"] else ""
                findings.append(Finding("rdma", item, OK, f"{link} {rate}, ACTIVE, GID {gid['index']} {gid['gid']}"
                                        f" ({gid['type'] or 'type ?'}{where}; {why})", data=data))
    if wanted and not usable_ports:
        findings.append(Finding("rdma", "usable ports", FAIL, "no ACTIVE port with a usable GID",
                                "fix the ports above, or use --protocol tcp"))
    elif not wanted:
        findings.append(Finding("rdma", "usable ports", SKIP if not usable_ports else INFO,
                                f"{usable_ports} usable port(s); not used with --protocol {cfg.protocol}"))
    return findings
