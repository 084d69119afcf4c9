"""Kernel settings: IOMMU, ptrace scope (cross-memory attach on the same-host path), network namespace."""

from __future__ import annotations

from .report import INFO, OK, WARN, Config, Finding, Host


def iommu(host: Host) -> Finding:
    units = host.listdir("/sys/class/iommu")
    groups = host.listdir("/sys/kernel/iommu_groups")
    cmdline = host.read("/proc/cmdline") or ""
    passthrough = any(w in cmdline.split() for w in ("iommu=pt", "iommu.passthrough=1"))
    if not units and not groups:
        return Finding("kernel", "iommu", INFO, "no IOMMU active", data={"units": 0, "groups": 0})
    detail = f"{len(units)} unit(s), {len(groups)} group(s), " + ("passthrough" if passthrough else "translating")
    data = {"units": len(units), "groups": len(groups), "passthrough": passthrough}
    if passthrough:
        return Finding("kernel", "iommu", OK, detail, data=data)
    return Finding("kernel", "iommu", WARN, detail + ": peer-to-peer DMA (GPUDirect) goes through the IOMMU",
                   "boot with iommu=pt (or disable ACS on the PCIe switches) for full GPUDirect bandwidth", data)


def ptrace_scope(host: Host) -> Finding:
    text = host.read("/proc/sys/kernel/yama/ptrace_scope")
    if text is None:
        return Finding("kernel", "ptrace scope", OK, "no Yama LSM: same-host processes of one user may attach",
                       data={"scope": None})
    scope = int(text) if text.isdigit() else -1
    data = {"scope": scope}
    if scope == 0:
        return Finding("kernel", "ptrace scope", OK, "0: same-host copies by cross-memory attach allowed", data=data)
    what = {1: "1 (restricted to descendants)", 2: "2 (CAP_SYS_PTRACE only)", 3: "3 (no attach)"}.get(scope, text)
    return Finding("kernel", "ptrace scope", WARN, f"{what}: same-host copies of memory not from "
                   "allocate_managed_buffer fall back to TCP",
                   "`sysctl kernel.yama.ptrace_scope=0`, or allocate buffers with allocate_managed_buffer", data)


def namespace(host: Host) -> Finding:
    mine = host.readlink("/proc/self/ns/net")
    init = host.readlink("/proc/1/ns/net")
    netdevs = [d for d in host.listdir("/sys/class/net")]
    up = [d for d in netdevs if (host.read(f"/sys/class/net/{d}/operstate") or "") in ("up", "unknown")]
    where = ("the host's network namespace" if mine and mine == init else
             f"network namespace {mine}" if mine else "network namespace unknown")
    detail = f"{where}; interfaces up: {', '.join(up) or 'none'}"
    data = {"netns": mine, "initial": bool(mine and mine == init), "up": up}
    if up and all(d == "lo" for d in up):
        return Finding("kernel", "network", WARN, detail + ": only loopback, peers on other hosts are unreachable",
                       "run in a namespace with a NIC (docker --network host)", data)
    return Finding("kernel", "network", INFO, detail, data=data)


def check(host: Host, cfg: Config) -> list[Finding]:
    return [iommu(host), ptrace_scope(host), namespace(host)]
