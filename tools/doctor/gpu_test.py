"""GPU and kernel checks against fake /sys and /proc trees (no GPU on the CI machine)."""

from mooncake.tools.doctor import gpu, kernel, services
from mooncake.tools.doctor.report import Config, Host
from mooncake.tools.doctor.testutil import FakeTree

PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023"
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Tue Mar  5 22:23:56 UTC 2024"


def nvidia_host(tmp_path, version, modules=""):
    tree = FakeTree(tmp_path)
    for addr in ("0000:17:00.0", "0000:3d:00.0"):
        base = f"/sys/bus/pci/devices/{addr}"
        tree.write(f"{base}/vendor", "0x10de").write(f"{base}/class", "0x030200").write(
            f"{base}/device", "0x2330").write(f"{base}/numa_node", "0")
    tree.write("/sys/bus/pci/devices/0000:00:1f.0/vendor", "0x8086").write(
        "/sys/bus/pci/devices/0000:00:1f.0/class", "0x060100")
    tree.write("/proc/driver/nvidia/version", version + "\nGCC version:  gcc version 12.2.0")
    tree.write("/proc/modules", modules)
    return Host(tree.root)


def by_item(findings):
    return {f.item: f for f in findings}


def test_two_gpus_with_peermem(tmp_path):
    f = by_item(gpu.check(nvidia_host(tmp_path, PROPRIETARY, "nvidia_peermem 16384 0 - Live 0x0\n"
                                      "nvidia 56000000 1 nvidia_peermem, Live 0x0"), Config()))
    assert {"0000:17:00.0", "0000:3d:00.0"} <= set(f) and "0000:00:1f.0" not in f
    assert f["nvidia driver"].data == {"major": 535, "open": False}
    assert f["GPUDirect RDMA"].state == "ok" and "nvidia_peermem" in f["GPUDirect RDMA"].detail


def test_open_modules_give_dma_buf(tmp_path):
    f = by_item(gpu.check(nvidia_host(tmp_path, OPEN), Config()))
    assert f["GPUDirect RDMA"].state == "ok" and f["GPUDirect RDMA"].data == {"peermem": False, "dmabuf": True}


def test_no_gpudirect_says_what_to_do(tmp_path):
    f = by_item(gpu.check(nvidia_host(tmp_path, PROPRIETARY), Config()))
    assert f["GPUDirect RDMA"].state == "warn" and "nvidia_peermem" in f["GPUDirect RDMA"].fix


def test_gpu_without_driver(tmp_path):
    tree = FakeTree(tmp_path).write("/sys/bus/pci/devices/0000:17:00.0/vendor", "0x10de").write(
        "/sys/bus/pci/devices/0000:17:00.0/class", "0x030200")
    assert by_item(gpu.check(Host(tree.root), Config()))["nvidia driver"].state == "warn"


def test_no_gpu(tmp_path):
    assert [f.item for f in gpu.check(Host(str(tmp_path)), Config())] == ["devices"]


def test_ptrace_scope_and_iommu(tmp_path):
    tree = FakeTree(tmp_path).write("/proc/sys/kernel/yama/ptrace_scope", "1").mkdir(
        "/sys/class/iommu/dmar0").mkdir("/sys/kernel/iommu_groups/0").write("/proc/cmdline", "quiet")
    f = by_item(kernel.check(Host(tree.root), Config()))
    assert f["ptrace scope"].state == "warn" and "fall back to TCP" in f["ptrace scope"].detail
    assert f["iommu"].state == "warn" and "iommu=pt" in f["iommu"].fix
    tree.write("/proc/sys/kernel/yama/ptrace_scope", "0").write("/proc/cmdline", "quiet iommu=pt")
    f = by_item(kernel.check(Host(tree.root), Config()))
    assert f["ptrace scope"].state == "ok" and f["iommu"].state == "ok"


def test_loopback_only_namespace(tmp_path):
    tree = FakeTree(tmp_path).write("/sys/class/net/lo/operstate", "unknown").symlink(
        "/proc/self/ns/net", "net:[1]").symlink("/proc/1/ns/net", "net:[2]")
    f = kernel.namespace(Host(tree.root))
    assert f.state == "warn" and f.data["netns"] == "net:[1]" and not f.data["initial"]


def test_rpc_ports_from_proc_net_tcp(tmp_path):
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    rows = ["   0: 0100007F:3A98 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1",  # 15000
            "   1: 0100007F:3A99 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2"]  # est.
    tree = FakeTree(tmp_path).write("/proc/net/tcp", header + "\n".join(rows))
    f = services.rpc_ports(Host(tree.root), Config(rpc_port_range=(15000, 15001)))
    assert f.state == "warn" and f.data["free"] == 1 and f.data["listening"] == [15000]
    f = services.rpc_ports(Host(tree.root), Config(rpc_port_range=(15000, 15000)))
    assert f.state == "fail"
