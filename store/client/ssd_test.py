"""SSD tier against a real master: objects evicted from memory stay readable from disk, hot ones return to
memory, the tier has a capacity limit, survives a client restart, and removal reaches it."""

import os

import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.client.ssd import DiskTier
from mooncake.store.client.store_worker import pattern
from mooncake.store.master.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--eviction_high_watermark_ratio=0.9", "--default_kv_lease_ttl=100")
    yield m
    m.stop()


def _client(master, path, **kw):
    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "8MB",
           "local_buffer_size": "8MB", "master_server_addr": master.address, "enable_ssd_offload": True,
           "ssd_offload_path": str(path), **kw}
    assert s.setup(cfg) == 0
    return s


def test_evicted_objects_read_from_disk_and_promoted(master, tmp_path):
    s = _client(master, tmp_path)
    try:
        for i in range(40):  # 20 MiB into an 8 MiB segment: the early objects are evicted from memory
            assert s.put(f"e{i}", pattern(512 * KiB, i)) == 0
        s._disk.flush()
        assert len(os.listdir(tmp_path)) == 40
        assert s.get_replica_desc("e0") == []           # no memory replica any more
        assert s.is_exist("e0") == 1 and s.get_size("e0") == 512 * KiB
        assert s.get("e0") == pattern(512 * KiB, 0)     # first disk hit
        assert s.get("e0") == pattern(512 * KiB, 0)     # second: promoted back to memory
        assert len(s.get_replica_desc("e0")) == 1
        assert s.get_batch(["e1", "e39", "none"]) == [pattern(512 * KiB, 1), pattern(512 * KiB, 39), b""]
        assert s.remove("e2") == 0 and s.get("e2") == b"" and s.remove("e2") == E.OBJECT_NOT_FOUND
        assert s.remove_by_regex("^e3") >= 0 and s.get("e30") == b""
    finally:
        s.remove_all(force=True)
        s.close()
    assert os.listdir(tmp_path) == []


def test_disk_tier_survives_restart_and_capacity(master, tmp_path):
    s = _client(master, tmp_path)
    try:
        assert s.put("keep", b"k" * 3000) == 0
        s._disk.flush()
    finally:
        s.remove("keep", force=True)  # gone from memory and disk ...
        s.close()
    s = _client(master, tmp_path)
    try:
        assert s.get("keep") == b""
        assert s.put("persist", b"p" * 3000) == 0
        s._disk.flush()
    finally:
        s.close()                        # ... while this one only leaves memory with the client's segment
    s = _client(master, tmp_path)
    try:
        assert s.get("persist") == b"p" * 3000  # index rebuilt from the files
    finally:
        s.remove_all(force=True)
        s.close()


def test_disk_capacity_and_torn_files(tmp_path):
    (tmp_path / "junk").write_bytes(b"not a tier file")
    (tmp_path / "x.tmp").write_bytes(b"interrupted")
    d = DiskTier(str(tmp_path), capacity=10 * KiB)
    try:
        for i in range(5):
            d.submit(f"k{i}", bytes([i]) * (3 * KiB))
        d.flush()
        assert [d.size(f"k{i}") for i in range(5)] == [None, None, 3 * KiB, 3 * KiB, 3 * KiB]
        assert d.used == 9 * KiB and not (tmp_path / "x.tmp").exists()
        assert d.read("k4") == (bytes([4]) * (3 * KiB), False)
    finally:
        d.close()


def test_ssd_setup_errors(master, tmp_path):
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "master_server_addr": master.address, "enable_ssd_offload": True}) == E.INVALID_PARAMS
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "master_server_addr": master.address, "enable_ssd_offload": True,
                    "ssd_offload_path": str(blocker / "sub")}) == E.INVALID_PARAMS
    assert s.health_check() == 1
