"""The HA backends against real etcd and Redis servers: one winner per election, renewal, fenced log writes,
sync-set writes and compaction after the lease is gone, ordered log reads, bad endpoints."""

import time

import pytest

from mooncake.store.common.coordination import BackendError, EtcdBackend, RedisBackend, backend, parse_endpoints
from mooncake.testing.services import Etcd, Redis


@pytest.fixture(params=["etcd", "redis"])
def pair(request):
    server = Etcd() if request.param == "etcd" else Redis()
    cls = EtcdBackend if request.param == "etcd" else RedisBackend
    try:
        yield cls([server.endpoint], "t"), cls([server.endpoint], "t")
    finally:
        server.close()


def test_one_leader_then_the_next_after_expiry(pair):
    a, b = pair
    assert a.read_view() is None
    va = a.campaign("127.0.0.1:1", 1)
    assert va and b.campaign("127.0.0.1:2", 1) is None
    assert a.read_view() == ("127.0.0.1:1", va) == b.read_view()
    assert a.renew()
    assert a.append(1, [{"lsn": 1}]) and a.append(2, [{"lsn": 2}, {"lsn": 3}])
    deadline = time.monotonic() + 10
    while b.read_view() is not None and time.monotonic() < deadline:  # a stops renewing: its lease runs out
        time.sleep(0.1)
    vb = b.campaign("127.0.0.1:2", 1)
    assert vb and vb > va
    assert not a.renew() and not a.append(4, [{"lsn": 4}])  # a is fenced: its write is refused
    assert b.append(4, [{"lsn": 4}])
    assert [r["lsn"] for batch in b.read_log(0) for r in batch] == [1, 2, 3, 4]
    assert [batch[0]["lsn"] for batch in b.read_log(2)] == [2, 4]
    # The sync set and the compaction are fenced like the log; a's are refused.
    assert not a.write_sync_set(["x"]) and not a.compact_log(10)
    assert b.write_sync_set(["m1#1", "m2#2"]) and a.read_sync_set() == ["m1#1", "m2#2"]
    assert b.view_info()["address"] == "127.0.0.1:2"
    assert b.log_start() == 1
    assert b.compact_log(4)  # the batches starting before op 4 go; the one starting at 4 stays
    assert b.log_start() == 4 and [r["lsn"] for batch in b.read_log(0) for r in batch] == [4]
    b.resign()
    assert a.read_view() is None


def test_bad_endpoints():
    with pytest.raises(TypeError):
        parse_endpoints(None)
    with pytest.raises(ValueError):
        parse_endpoints(" ; ")
    assert parse_endpoints("etcd://h1:1;h2:2") == ["h1:1", "h2:2"]
    with pytest.raises(BackendError):
        EtcdBackend(["127.0.0.1:9"], "t", timeout=0.5).read_view()
    with pytest.raises(ValueError, match="exactly one endpoint"):
        backend("redis", "127.0.0.1:1;127.0.0.1:2", "t")
