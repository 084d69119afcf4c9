"""GPUs: devices on the PCI bus, the NVIDIA driver, and GPUDirect RDMA (nvidia_peermem or dma-buf).

Reads /sys/bus/pci/devices (vendor, class), /proc/driver/nvidia and the loaded modules. Nothing here opens a
device or loads a vendor library. No GPU is not an error: the host-memory paths need none.
"""

from __future__ import annotations

import re

from .report import INFO, OK, WARN, Config, Finding, Host

_VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD", "0x1e3e": "Moore Threads", "0x19e5": "Huawei"}
_DISPLAY_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")  # VGA, 3D, other display, processing accelerator


def pci_gpus(host: Host) -> list[dict]:
    out = []
    for addr in host.listdir("/sys/bus/pci/devices"):
        base = f"/sys/bus/pci/devices/{addr}"
        vendor = (host.read(f"{base}/vendor") or "").lower()
        cls = (host.read(f"{base}/class") or "").lower()
        if vendor in _VENDORS and cls[:6] in _DISPLAY_CLASSES:
            out.append({"pci": addr, "vendor": _VENDORS[vendor], "device": host.read(f"{base}/device") or "?",
                        "numa_node": host.read(f"{base}/numa_node") or "?"})
    return out


def loaded_modules(host: Host) -> set[str]:
    mods = {line.split()[0] for line in (host.read("/proc/modules") or "").splitlines() if line.strip()}
    return mods | set(host.listdir("/sys/module"))


def check(host: Host, cfg: Config) -> list[Finding]:
    gpus = pci_gpus(host)
    nv_version = host.read("/proc/driver/nvidia/version")
    if not gpus and not nv_version:
        return [Finding("gpu", "devices", INFO, "no GPU (host memory only)")]
    findings = [Finding("gpu", g["pci"], INFO, f"{g['vendor']} device {g['device']}, NUMA node {g['numa_node']}",
                        data=g) for g in gpus]
    nvidia = [g for g in gpus if g["vendor"] == "NVIDIA"]
    if nvidia or nv_version:
        if not nv_version:
            findings.append(Finding("gpu", "nvidia driver", WARN, "NVIDIA GPU without a loaded driver "
                                    "(/proc/driver/nvidia/version absent)", "install/load the NVIDIA driver"))
            return findings
        m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+)\.(\d+)", nv_version)
        major = int(m.group(1)) if m else 0
        open_modules = "Open Kernel Module" in nv_version
        findings.append(Finding("gpu", "nvidia driver", OK, nv_version.splitlines()[0].strip(),
                                data={"major": major, "open": open_modules}))
        mods = loaded_modules(host)
        peermem = "nvidia_peermem" in mods or "nv_peer_mem" in mods
        dmabuf = open_modules and major >= 515
        if peermem or dmabuf:
            how = [w for w, on in (("nvidia_peermem loaded", peermem), ("dma-buf (open kernel modules, "
                                                                         f"driver {major})", dmabuf)) if on]
            findings.append(Finding("gpu", "GPUDirect RDMA", OK, " and ".join(how),
                                    data={"peermem": peermem, "dmabuf": dmabuf}))
        else:
            findings.append(Finding("gpu", "GPUDirect RDMA", WARN,
                                    "neither nvidia_peermem nor dma-buf: RDMA cannot read GPU memory directly",
                                    "`modprobe nvidia_peermem`, or use the open kernel modules (driver >= 515)",
                                    data={"peermem": False, "dmabuf": False}))
    if any(g["vendor"] == "AMD" for g in gpus):
        findings.append(Finding("gpu", "amd driver", OK if host.exists("/dev/kfd") else WARN,
                                "/dev/kfd present" if host.exists("/dev/kfd") else "AMD GPU without /dev/kfd",
                                "" if host.exists("/dev/kfd") else "load amdgpu; in a container pass /dev/kfd"))
    return findings
