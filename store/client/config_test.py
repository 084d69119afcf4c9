"""SetupConfig's dict form with the clients' key names: master_server_address / master_server_addr and
device_name / rdma_devices are one option each; both spellings in one dict are accepted when they agree
(LMCache's form) and refused, naming both keys, when they do not (reference §2.2)."""

import logging

import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.client.config import SetupConfig
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess


def lmcache_dict(**extra):
    """The dict LMCache hands setup(): every value a string."""
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "16777216",
           "local_buffer_size": "16777216", "protocol": "tcp", "device_name": ""}
    cfg.update(extra)
    return cfg


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=300")
    yield m
    m.stop()


def test_aliases_name_one_option():
    for keys in ({"master_server_address": "h:1"}, {"master_server_addr": "h:1"},
                 {"master_server_address": "h:1", "master_server_addr": "h:1"}):
        cfg = SetupConfig.from_args((lmcache_dict(**keys),), {})
        assert cfg.master_server_addr == "h:1", keys
    cfg = SetupConfig.from_args((lmcache_dict(device_name="mlx5_0", rdma_devices="mlx5_0"),), {})
    assert cfg.rdma_devices == "mlx5_0"
    assert SetupConfig.from_args((lmcache_dict(device_name="mlx5_1"),), {}).rdma_devices == "mlx5_1"


def test_disagreeing_aliases_are_refused_naming_both():
    for a, b in (("master_server_address", "master_server_addr"), ("device_name", "rdma_devices")):
        with pytest.raises(ValueError) as err:
            SetupConfig.from_args((lmcache_dict(**{a: "x:1", b: "y:2"}),), {})
        msg = str(err.value)
        assert f"'{a}'" in msg and f"'{b}'" in msg and "x:1" in msg and "y:2" in msg, msg
    with pytest.raises(ValueError, match="unknown option"):
        SetupConfig.from_args((lmcache_dict(master_server_adress="h:1"),), {})  # a typo is still refused


def test_lmcache_dict_with_both_keys_sets_up(master, caplog):
    s = MooncakeDistributedStore()
    bad = lmcache_dict(master_server_address=master.address, master_server_addr="127.0.0.1:1")
    with caplog.at_level(logging.ERROR):
        assert s.setup(bad) == E.INVALID_PARAMS
    assert "'master_server_address'" in caplog.text and "'master_server_addr'" in caplog.text, caplog.text
    assert master.address in caplog.text and "127.0.0.1:1" in caplog.text, caplog.text
    assert s.put("k", b"v") < 0  # not set up: nothing half-done
    good = lmcache_dict(master_server_address=master.address, master_server_addr=master.address)
    assert s.setup(good) == 0
    try:
        assert s.put("lmcache/both-keys", b"value") == 0
        assert s.get("lmcache/both-keys") == b"value" and s.is_exist("lmcache/both-keys") == 1
    finally:
        s.remove_all(force=True)
        s.close()
