"""RDMA and memlock checks against fake /sys and /proc trees (no HCA on the CI machine)."""

import pytest

from mooncake.tools.doctor import memory, rdma
from mooncake.tools.doctor.report import Config, Host
from mooncake.tools.doctor.testutil import FakeTree

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
LINK_LOCAL = "fe80:0000:0000:0000:0ac0:ebff:fe12:3456"
V4_MAPPED = "0000:0000:0000:0000:0000:ffff:0a00:0001"  # ::ffff:10.0.0.1


def by_item(findings):
    return {f.item: f for f in findings}


@pytest.fixture
def roce(tmp_path):
    return FakeTree(tmp_path).hca("mlx5_0", {"1": {"gids": [
        (0, LINK_LOCAL, "IB/RoCE v1", "eth2"), (1, LINK_LOCAL, "RoCE v2", "eth2"),
        (2, V4_MAPPED, "IB/RoCE v1", "eth2"), (3, V4_MAPPED, "RoCE v2", "eth2"), (4, ZERO, "", "")]}})


def test_roce_port_picks_the_v2_gid_with_an_ipv4_address(roce, monkeypatch):
    monkeypatch.delenv("MC_GID_INDEX", raising=False)
    f = by_item(rdma.check(Host(roce.root), Config(protocol="rdma")))
    port = f["mlx5_0 port 1"]
    assert port.state == "ok" and port.data["chosen_gid"] == 3
    assert "RoCE v2 on eth2" in port.detail and "IPv4" in port.detail
    assert [g["index"] for g in port.data["gids"]] == [0, 1, 2, 3]  # the zero GID is not listed
    assert "usable ports" not in f or f["usable ports"].state != "fail"


def test_gid_index_from_the_environment(roce, monkeypatch):
    monkeypatch.setenv("MC_GID_INDEX", "1")
    assert by_item(rdma.check(Host(roce.root), Config(protocol="rdma")))["mlx5_0 port 1"].data["chosen_gid"] == 1
    monkeypatch.setenv("MC_GID_INDEX", "9")
    f = by_item(rdma.check(Host(roce.root), Config(protocol="rdma")))
    assert f["mlx5_0 port 1"].state == "warn" and "MC_GID_INDEX=9" in f["mlx5_0 port 1"].detail
    assert f["usable ports"].state == "fail"


def test_choose_gid_rules():
    v1 = {"index": 0, "gid": LINK_LOCAL, "type": "IB/RoCE v1", "netdev": "", "ipv4": ""}
    v2 = {"index": 1, "gid": LINK_LOCAL, "type": "RoCE v2", "netdev": "", "ipv4": ""}
    assert rdma.choose_gid([v1, v2], "Ethernet", None)[0] is v2
    assert rdma.choose_gid([v1], "Ethernet", None)[0] is v1
    assert rdma.choose_gid([v1, v2], "InfiniBand", None)[0] is v1
    assert rdma.choose_gid([], "Ethernet", None) == (None, rdma.choose_gid([], "Ethernet", None)[1])
    assert rdma.choose_gid([v1], "Ethernet", "x")[0] is None


def test_down_port_and_unknown_device(tmp_path, monkeypatch):
    monkeypatch.delenv("MC_GID_INDEX", raising=False)
    tree = FakeTree(tmp_path).hca("mlx5_1", {"1": {"state": "1: DOWN", "link_layer": "InfiniBand",
                                                    "gids": [(0, LINK_LOCAL, "", "")]}})
    f = by_item(rdma.check(Host(tree.root), Config(protocol="rdma", device_names=("mlx5_1", "mlx5_9"))))
    assert f["mlx5_1 port 1"].state == "warn" and "DOWN" in f["mlx5_1 port 1"].detail
    assert f["device_name"].state == "fail" and "mlx5_9" in f["device_name"].detail
    assert f["usable ports"].state == "fail"
    # The same host with --protocol tcp: nothing fails.
    assert all(x.state != "fail" for x in rdma.check(Host(tree.root), Config(protocol="tcp")))


def test_no_uverbs_device_files(tmp_path):
    tree = FakeTree(tmp_path).hca("mlx5_0", {"1": {"gids": [(3, V4_MAPPED, "RoCE v2", "eth2")]}})
    (tmp_path / "dev/infiniband/uverbs0").unlink()
    f = by_item(rdma.check(Host(tree.root), Config(protocol="rdma")))
    assert f["/dev/infiniband"].state == "fail" and "container" in f["/dev/infiniband"].fix


def test_no_device_fails_only_for_rdma(tmp_path):
    assert rdma.check(Host(str(tmp_path)), Config(protocol="rdma"))[0].state == "fail"
    assert rdma.check(Host(str(tmp_path)), Config(protocol="tcp"))[0].state == "info"


@pytest.mark.parametrize("memlock, protocol, size, state", [
    ("8388608", "rdma", 16 << 20, "fail"),    # 8 MiB < 16 MiB: registration fails
    ("8388608", "tcp", 16 << 20, "info"),     # tcp pins nothing
    ("unlimited", "rdma", 1 << 40, "ok"),
    ("1073741824", "efa", 1 << 30, "ok"),
])
def test_memlock_against_segment_size(tmp_path, memlock, protocol, size, state):
    tree = FakeTree(tmp_path).limits(memlock)
    f = by_item(memory.check(Host(tree.root), Config(protocol=protocol, segment_size=size)))
    assert f["memlock"].state == state
    if state == "fail":
        assert "ulimit -l" in f["memlock"].fix


def test_huge_pages(tmp_path):
    tree = FakeTree(tmp_path).write("/proc/sys/vm/nr_hugepages", "512").write(
        "/proc/meminfo", "HugePages_Total:     512\nHugePages_Free:      500\nHugepagesize:       2048 kB").write(
        "/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
    f = by_item(memory.check(Host(tree.root), Config()))["huge pages"]
    assert f.data == {"nr_hugepages": 512, "size": "2048 kB", "free": "500", "thp": "madvise"}
