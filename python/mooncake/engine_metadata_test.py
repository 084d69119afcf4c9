"""etcd and Redis metadata backends, against real etcd and redis-server processes."""

import json
import os
import time

import numpy as np
import pytest

from mooncake.engine import TransferEngine
from mooncake.testing.engine_peer import EnginePeer, pattern
from mooncake.testing.services import Etcd, Redis, free_port

TTL = 2  # seconds; MC_METADATA_LEASE_TTL for engines whose keys must expire quickly


@pytest.fixture(scope="module", params=["etcd", "redis"])
def service(request):
    svc = Etcd() if request.param == "etcd" else Redis()
    svc.scheme = request.param
    yield svc
    svc.close()


def url(svc):
    return f"{svc.scheme}://{svc.endpoint}"


def wait_until(cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_transfer_and_clean_exit_removes_keys(service):
    peer = EnginePeer(url(service), "127.0.0.1:32001", 1 << 20)
    engine = TransferEngine()
    try:
        assert engine.initialize("127.0.0.1:32002", url(service), "tcp", "") == 0
        keys = service.keys()
        assert "mooncake/ram/127.0.0.1:32001" in keys and "mooncake/rpc_meta/127.0.0.1:32001" in keys
        desc = json.loads(service.get("mooncake/ram/127.0.0.1:32001"))
        assert desc["name"] == "127.0.0.1:32001" and desc["buffers"][0]["addr"] == peer.buffer
        buf = np.zeros(1 << 20, dtype=np.uint8)
        assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
        buf[:] = pattern(1 << 20, 1)
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, buf.nbytes) == 0
        assert engine.send_probe(peer.segment) == 0
    finally:
        engine.close()
        peer.close()
    assert not [k for k in service.keys() if "3200" in k]  # both exited cleanly: nothing left behind


def test_crashed_engine_keys_expire(service):
    peer = EnginePeer(url(service), "127.0.0.1:32011", 4096, env={"MC_METADATA_LEASE_TTL": str(TTL)})
    assert service.get("mooncake/ram/127.0.0.1:32011") is not None
    time.sleep(TTL * 1.5)  # keep-alive must hold the keys past one TTL while the engine lives
    assert service.get("mooncake/ram/127.0.0.1:32011") is not None
    peer.kill()
    assert wait_until(lambda: service.get("mooncake/ram/127.0.0.1:32011") is None, TTL * 4 + 5)
    assert service.get("mooncake/rpc_meta/127.0.0.1:32011") is None


def test_cluster_id_namespaces_keys(service):
    os.environ["MC_METADATA_CLUSTER_ID"] = "tenant-a"
    try:
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1:32021", url(service), "tcp", "") == 0
    finally:
        del os.environ["MC_METADATA_CLUSTER_ID"]
    try:
        assert service.get("mooncake/tenant-a/rpc_meta/127.0.0.1:32021") is not None
        assert service.get("mooncake/rpc_meta/127.0.0.1:32021") is None
    finally:
        engine.close()


def test_unreachable_metadata_fails_initialize_quickly(service):
    engine = TransferEngine()
    t0 = time.monotonic()
    assert engine.initialize("127.0.0.1:32031", f"{service.scheme}://127.0.0.1:{free_port()}", "tcp", "") == -1
    assert time.monotonic() - t0 < 15


def test_etcd_endpoint_list_fails_over():
    with Etcd() as etcd:
        engine = TransferEngine()
        conn = f"etcd://127.0.0.1:{free_port()};{etcd.endpoint}"
        assert engine.initialize("127.0.0.1:32041", conn, "tcp", "") == 0
        assert etcd.get("mooncake/rpc_meta/127.0.0.1:32041") is not None
        engine.close()
        bare = TransferEngine()  # Mooncake: a connection string without a scheme means etcd
        assert bare.initialize("127.0.0.1:32042", etcd.endpoint, "tcp", "") == 0
        bare.close()


def test_restarted_http_metadata_server_is_repopulated():
    """The HTTP server keeps keys in memory only; engines write theirs back after it restarts."""
    from mooncake.http_metadata_server import HttpMetadataServer

    first = HttpMetadataServer("127.0.0.1", 0).start()
    port = first.port
    os.environ["MC_METADATA_LEASE_TTL"] = str(TTL)
    try:
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1:32051", first.url, "tcp", "") == 0
    finally:
        del os.environ["MC_METADATA_LEASE_TTL"]
    first.stop()
    second = HttpMetadataServer("127.0.0.1", port).start()
    try:
        assert wait_until(lambda: second.store.get("mooncake/ram/127.0.0.1:32051") is not None and
                          second.store.get("mooncake/rpc_meta/127.0.0.1:32051") is not None, TTL * 4 + 5)
        engine.close()
        assert second.store.keys() == []  # a clean exit still removes them
    finally:
        second.stop()
