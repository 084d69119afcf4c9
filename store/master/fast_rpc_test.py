"""The framed-protobuf door (fast_rpc.py) of a real master process: same answers as gRPC, errors mapped to
grpc.RpcError codes, gRPC fallback when the door cannot be reached, rediscovery after a master restart."""

import socket
import struct

import grpc
import pytest

from mooncake.store.master.errors import ErrorCode as E
from mooncake.store.master.fast_rpc import FastRpcClient, FastRpcError
from mooncake.store.master.master_client import MasterClient, segment
from mooncake.store.master.testing import MasterProcess
from mooncake.store.proto import mooncake_master_pb2 as pb


@pytest.fixture
def master():
    m = MasterProcess("--client_ttl=1", "--monitor_interval_ms=50")
    yield m
    m.stop()


def test_fast_path_matches_grpc(master):
    c = MasterClient(master.address)
    c.wait_ready()
    try:
        assert c.use_fast_path() is True and c._fast is not None
        assert c.mount(segment("s1", "127.0.0.1:1", 1 << 30, 1 << 20)) == 0
        r = c.call("PutStart", key="k", size=4096)
        assert r.code == 0 and r.replicas[0].segment_name == "127.0.0.1:1"
        assert c.call("PutEnd", key="k").code == 0
        assert c.call("GetReplicaList", key="k").size == 4096
        assert c.call("GetReplicaList", key="nope").code == E.OBJECT_NOT_FOUND
        assert c.stub.ExistKey(pb.KeyRequest(key="k")).exists  # the same state through gRPC
    finally:
        c.close()


def test_bad_frames_and_errors(master):
    with MasterClient(master.address) as c:
        port = c.stub.GetServiceInfo(pb.ServiceInfoRequest()).fast_rpc_port
    assert port > 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack("<IH", 3, 9999) + b"abc")  # unknown method: the server closes
        try:
            assert s.recv(16) == b""
        except ConnectionResetError:
            pass
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack("<IH", 2, 0) + b"\xff\xff")  # undecodable request: an error reply
        length, status = struct.unpack("<IB", s.recv(5))
        assert status == 1 and length > 0
    fc = FastRpcClient("127.0.0.1", 1)  # nothing listens there
    with pytest.raises(FastRpcError) as err:
        fc.call("Ping", pb.PingRequest())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and not err.value.sent
    assert isinstance(err.value, grpc.RpcError)


def test_fallback_and_rediscovery_after_restart():
    from mooncake.testing.services import free_port
    port = free_port()
    m = MasterProcess(f"--port={port}")
    c = MasterClient(m.address, timeout=5)
    try:
        c.wait_ready()
        assert c.use_fast_path()
        old = c._fast.address
        m.stop()
        m = MasterProcess(f"--port={port}")
        c.wait_ready()
        # The old door is gone: the first call fails or falls back; then pings rediscover the new door.
        for _ in range(3):
            try:
                c.ping_once()
            except grpc.RpcError:
                pass
        assert c._fast is not None and c._fast.address != old
        assert c.call("Ping").code == 0
    finally:
        c.close()
        m.stop()


def test_fast_rpc_can_be_disabled():
    m = MasterProcess("--fast_rpc_port=-1")
    c = MasterClient(m.address)
    try:
        c.wait_ready()
        assert c.use_fast_path() is False and c.call("Ping").code == 0
    finally:
        c.close()
        m.stop()
