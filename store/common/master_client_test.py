"""MasterClient's retry rule (master_client.py): calls wait for a master that is away and are resent where
that is safe; a call the master may have run is not resent to the same master; close does not wait."""

import socket
import threading
import time

import grpc
import pytest

from mooncake.store.master.config import MasterConfig
from mooncake.store.common.fast_rpc import FastRpcClient
from mooncake.store.common.master_client import MasterClient, replicate_config, segment
from mooncake.store.master.rpc_server import MasterServer
from mooncake.store.master.segments import REMOUNT_HOLD_SEC
from mooncake.store.master.testing import MasterProcess

MiB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_calls_made_while_the_master_restarts_wait_and_succeed():
    port = _free_port()
    m = MasterProcess(f"--port={port}")
    c = MasterClient(m.address, timeout=20)
    try:
        c.wait_ready()
        assert c.mount(segment("s1", "pool:1", 0x7f0000000000, 64 * MiB)) == 0
        c.view_version = c.call("GetServiceInfo").view_version
        c.use_fast_path()
        c.start_heartbeat(0.2)
        m.kill()
        results = {}

        def run(name, method, **fields):
            t0 = time.monotonic()
            try:
                results[name] = (c.call(method, **fields), time.monotonic() - t0)
            except grpc.RpcError as e:
                results[name] = (e, time.monotonic() - t0)

        calls = [threading.Thread(target=run, args=("put", "BatchPutStart"),
                                  kwargs={"keys": ["a", "b"], "sizes": [4096, 4096], "config": replicate_config()}),
                 threading.Thread(target=run, args=("exist", "ExistKey"), kwargs={"key": "a"})]
        for t in calls:
            t.start()
        time.sleep(1.0)
        m = MasterProcess(f"--port={port}")  # same port, empty state, a new view
        for t in calls:
            t.join(30)
        put, waited = results["put"]
        assert not isinstance(put, grpc.RpcError), put
        # The restarted master learnt this client's segment (re-mounted on the way) and placed both keys in it
        # once its hold on remounted memory ended.
        assert [r.code for r in put.results] == [0, 0]
        assert all(r.replicas[0].segment_id == "s1" for r in put.results)
        assert waited >= 1.0 + REMOUNT_HOLD_SEC * 0.9
        exist, _ = results["exist"]
        assert not isinstance(exist, grpc.RpcError) and exist.code == 0 and not exist.exists
        assert c.call("BatchPutEnd", keys=["a", "b"]).codes == [0, 0]
    finally:
        c.close()
        m.stop()


class _CuttingDoor:
    """A fast-RPC door that reads each request and closes the connection unanswered (a request that may
    have run)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if conn.recv(65536):
                    self.requests += 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server():
    cfg = MasterConfig(rpc_address="127.0.0.1", port=0, metrics_host="127.0.0.1", metrics_port=0,
                       fast_rpc_port=-1, enable_metric_reporting=False)
    srv = MasterServer(cfg).start()
    yield srv
    srv.stop()


def test_a_call_the_same_master_may_have_run_is_not_resent(server):
    door = _CuttingDoor()
    c = MasterClient(server.address, timeout=5)
    try:
        c.wait_ready()
        c.view_version = c.call("GetServiceInfo").view_version
        assert c.mount(segment("s1", "pool:1", 0x7f0000000000, 64 * MiB)) == 0
        c._fast = FastRpcClient("127.0.0.1", door.port, 5)
        with pytest.raises(grpc.RpcError) as err:
            c.call("PutStart", key="k", size=4096, config=replicate_config())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and door.requests == 1
        assert "k" not in server.service.table.pending  # not resent over gRPC either
        c._fast = FastRpcClient("127.0.0.1", door.port, 5)
        assert c.call("ExistKey", key="k").code == 0  # a read is resent (over gRPC: the door was dropped)
        assert door.requests == 2 and c._fast is None
    finally:
        c.close()
        door.close()


def test_limit_timeout_bounds_the_wait_for_a_master_that_is_away():
    port = _free_port()
    m = MasterProcess(f"--port={port}")
    c = MasterClient(m.address, timeout=30)
    try:
        c.wait_ready()
        m.kill()
        c.limit_timeout(0.5)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            c.call("UnmountSegment", segment_id="s1")
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - t0 < 3
    finally:
        c.close()
    c.close()
    with pytest.raises(grpc.RpcError):  # a closed client fails at once
        c.call("ExistKey", key="k")
