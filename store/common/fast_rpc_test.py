"""The framed-protobuf door (fast_rpc.py) of a real master process: same answers as gRPC, errors mapped to
grpc.RpcError codes, gRPC fallback when the door cannot be reached, rediscovery after a master restart; its
bounds: frame size, memory of requests in progress, request deadline, connection count."""

import socket
import struct
import time

import grpc
import pytest

from mooncake.store.master.config import MasterConfig
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.common.fast_rpc import MAX_FRAME, FastRpcClient, FastRpcError, FastRpcServer
from mooncake.store.master.rpc_server import MasterServicer
from mooncake.store.master.service import MasterService
from mooncake.testing.listener_fuzz import Stalled, exchange, memory_kib
from mooncake.store.common.master_client import MasterClient, segment
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
        s.sendall(struct.pack("<IH", 3, 9999) + b"abc")  # unknown method: an error reply
        assert read_reply(s) == (1, b"unknown method index 9999")
        s.sendall(struct.pack("<IH", 0, GET_SERVICE_INFO))  # the connection still serves
        assert read_reply(s)[0] == 0
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


GET_SERVICE_INFO = [m.name for m in pb.DESCRIPTOR.services_by_name["MasterService"].methods].index("GetServiceInfo")


def read_reply(s):
    head = b""
    while len(head) < 5:
        chunk = s.recv(5 - len(head))
        assert chunk, "connection closed"
        head += chunk
    length, status = struct.unpack("<IB", head)
    body = b""
    while len(body) < length:
        body += s.recv(length - len(body))
    return status, body


def fast_port(master):
    with MasterClient(master.address) as c:
        return c.stub.GetServiceInfo(pb.ServiceInfoRequest()).fast_rpc_port


def test_announced_frames_take_no_memory(master):
    """Connections that announce the largest frame and send nothing more cost the master no memory (it used
    to allocate each frame's announced length at once: 4 x 256 MiB), and it keeps serving."""
    addr = ("127.0.0.1", fast_port(master))
    before = memory_kib(master.proc.pid)
    with Stalled(addr, struct.pack("<IH", MAX_FRAME, 5), 8) as stalled:
        time.sleep(1.0)
        grown = memory_kib(master.proc.pid) - before
        fc = FastRpcClient(*addr)
        assert fc.call("ExistKey", pb.KeyRequest(key="k")).code == 0
        fc.close()
        assert stalled.closed_by_peer == 0
    assert grown < 16 << 10, f"the master grew by {grown} KiB for 8 announced frames"
    # Over the limit (the frame: 0x10000000 bytes announced): an error reply, then the connection ends.
    reply = exchange(addr, bytes.fromhex("000000100000"))
    assert reply[4] == 1 and b"exceeds the limit" in reply[5:]


@pytest.fixture
def small_server():
    svc = MasterService(MasterConfig())
    server = FastRpcServer(MasterServicer(svc), "127.0.0.1", 0, max_frame=1 << 20, max_inflight=2 << 20,
                           max_connections=6, frame_timeout=1.0).start()
    yield server
    server.stop()


def test_requests_in_progress_share_a_bounded_budget(small_server):
    """Two stalled requests hold ~1.8 MiB of a 2 MiB budget: a third waits for room, gets it when their
    deadline (1 s) drops them, and is answered; the stalled ones are closed."""
    addr = ("127.0.0.1", small_server.port)
    partial = struct.pack("<IH", 1 << 20, 5) + b"\x0a" * (900 << 10)
    with Stalled(addr, partial, 2) as stalled:
        time.sleep(0.3)
        assert small_server._budget.used >= 1800 << 10
        fc = FastRpcClient(*addr, timeout=10)
        t0 = time.monotonic()
        keys = ["k%06d" % i for i in range(40_000)]  # ~360 KiB: does not fit before the stalled ones go
        reply = fc.call("BatchExistKey", pb.BatchKeysRequest(keys=keys))
        waited = time.monotonic() - t0
        fc.close()
        assert len(reply.results) == len(keys) and 0.3 < waited < 5
        deadline = time.monotonic() + 5
        while stalled.closed_by_peer < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stalled.closed_by_peer == 2
    assert small_server._budget.used == 0


def test_connection_cap_and_oversized_requests(small_server):
    addr = ("127.0.0.1", small_server.port)
    with Stalled(addr, b"", 6) as idle:
        time.sleep(0.2)
        # the 7th is closed at once
        assert exchange(addr, struct.pack("<IH", 0, GET_SERVICE_INFO), timeout=2) == b""
        assert idle.closed_by_peer == 0
    time.sleep(0.2)
    assert exchange(addr, struct.pack("<IH", 0, GET_SERVICE_INFO))[4] == 0  # slots are given back
    reply = exchange(addr, struct.pack("<IH", (1 << 20) + 1, 0))
    assert reply[4] == 1 and b"exceeds the limit of 1048576" in reply
    fc = FastRpcClient(*addr)
    with pytest.raises(FastRpcError) as err:  # refused before sending (the master's limit, MAX_FRAME)
        fc.call("BatchExistKey", pb.BatchKeysRequest(keys=["k" * 65536] * (MAX_FRAME // 65536 + 1)))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not err.value.sent
    fc.close()


class _SlowServicer:
    """A MasterServicer whose ExistKey answers after `delay` seconds (the other methods as the real one)."""

    def __init__(self, inner: MasterServicer, delay: float) -> None:
        self._inner, self.delay = inner, delay

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def ExistKey(self, request, context):
        time.sleep(self.delay)
        return self._inner.ExistKey(request, context)


@pytest.fixture
def slow_server():
    servicer = _SlowServicer(MasterServicer(MasterService(MasterConfig())), 0.0)
    server = FastRpcServer(servicer, "127.0.0.1", 0).start()
    yield server, servicer
    server.stop()


def _cpu_per_call(client: FastRpcClient, calls: int) -> float:
    t = time.thread_time()
    for _ in range(calls):
        assert client.call("ExistKey", pb.KeyRequest(key="k")).exists is False
    return (time.thread_time() - t) / calls


def test_reply_polling_reads_fast_and_late_replies(slow_server):
    server, servicer = slow_server
    c = FastRpcClient("127.0.0.1", server.port, spin_us=2000)
    try:
        assert _cpu_per_call(c, 50) >= 0  # fast replies, read by polling
        servicer.delay = 0.02  # later than the budget: polling gives up, the blocking read gets it
        assert c.call("ExistKey", pb.KeyRequest(key="k")).exists is False
    finally:
        c.close()


def test_reply_polling_stops_while_replies_are_slow(slow_server):
    """A budget of 5 ms against replies of 20 ms: the first calls poll 5 ms each (thread CPU), then the
    connection's average says the master is slow and calls block at once."""
    server, servicer = slow_server
    servicer.delay = 0.02
    c = FastRpcClient("127.0.0.1", server.port, spin_us=5000)
    try:
        assert _cpu_per_call(c, 1) > 0.003  # polled (CPU spent while waiting)
        _cpu_per_call(c, 10)
        assert _cpu_per_call(c, 10) < 0.001  # adapted: no more polling
        servicer.delay = 0.0  # fast again: the average falls below the budget and polling resumes
        _cpu_per_call(c, 60)
        assert c._local.conn.wait < 0.005
    finally:
        c.close()
    off = FastRpcClient("127.0.0.1", server.port, spin_us=0)
    try:
        servicer.delay = 0.02
        assert _cpu_per_call(off, 3) < 0.001  # polling off: blocking reads from the first call
    finally:
        off.close()


def test_reply_polling_budget_from_environment(monkeypatch):
    from mooncake.store.common.fast_rpc import DEFAULT_SPIN_US, spin_budget_from_env

    monkeypatch.delenv("MC_STORE_RPC_SPIN_US", raising=False)
    assert spin_budget_from_env() == pytest.approx(DEFAULT_SPIN_US * 1e-6)
    monkeypatch.setenv("MC_STORE_RPC_SPIN_US", "0")
    assert spin_budget_from_env() == 0.0
    monkeypatch.setenv("MC_STORE_RPC_SPIN_US", "250")
    assert spin_budget_from_env() == pytest.approx(250e-6)
    for bad in ("fast", "-1", "1e9"):
        monkeypatch.setenv("MC_STORE_RPC_SPIN_US", bad)
        with pytest.raises(ValueError, match="MC_STORE_RPC_SPIN_US"):
            spin_budget_from_env()
    with pytest.raises(ValueError, match="spin_us"):
        FastRpcClient("127.0.0.1", 1, spin_us=-5)
