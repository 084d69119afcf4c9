"""Seeded fuzzing of every listener of a real master process: gRPC, fast RPC, admin HTTP and the embedded HTTP
metadata server (the same server as the standalone one). Each listener gets batches of random, mutated and
truncated requests while other connections keep announcing the largest requests and never finishing them;
after each batch it must still answer a legitimate request and the master's memory must stay bounded."""

import random
import re
import socket
import struct
import time

import grpc
import pytest

from mooncake.store.common.fast_rpc import MAX_FRAME, FastRpcClient
from mooncake.store.common.master_client import MasterClient
from mooncake.store.master.testing import MasterProcess
from mooncake.store.proto import mooncake_master_pb2 as pb
from mooncake.testing.listener_fuzz import (Stalled, StalledGrpcCalls, exchange, fuzz_batches, grpc_call_bytes,
                                            h2_frame, mutate)

SEEDS = (1, 2)
MAX_GROWTH_KIB = 96 << 10
METHODS = list(pb.DESCRIPTOR.services_by_name["MasterService"].methods)
PATTERNS = ["(a+)+$", "(a|aa)+$", "(.*a){12}", "^k", "", "(", "(a)\\1", "(?=x)", "x{1001}", "é+", "[", "\\"]


class Cluster:
    def __init__(self):
        self.master = MasterProcess("--max_threads=4", "--enable_http_metadata_server=true",
                                    "--http_metadata_server_host=127.0.0.1", "--http_metadata_server_port=0")
        self.pid = self.master.proc.pid
        self.metadata = ("127.0.0.1", int(re.search(r"metadata \S+:(\d+)", self.master.banner).group(1)))
        self.admin = ("127.0.0.1", self.master.metrics_port)
        self.grpc = ("127.0.0.1", self.master.port)
        self.client = MasterClient(self.master.address)
        self.client.wait_ready()
        self.fast = ("127.0.0.1", self.client.stub.GetServiceInfo(pb.ServiceInfoRequest()).fast_rpc_port)
        self.n = 0

    def still_serves(self):
        self.n += 1
        # wait_for_ready: the gRPC door may be restarting (rpc_server._GrpcDoor: grpcio's aio server closes its
        # port on a :path that is not UTF-8, and the master serves again at once)
        assert self.client.stub.ExistKey(pb.KeyRequest(key="k"), timeout=10, wait_for_ready=True).code == 0
        fc = FastRpcClient(*self.fast, timeout=10)
        try:
            assert fc.call("ExistKey", pb.KeyRequest(key="k")).code == 0
        finally:
            fc.close()
        assert exchange(self.admin, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", 10).startswith(
            b"HTTP/1.1 200")
        body = b'{"n": %d}' % self.n
        put = b"PUT /metadata?key=legit HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        assert exchange(self.metadata, put + body, 10).startswith(b"HTTP/1.1 200")
        got = exchange(self.metadata, b"GET /metadata?key=legit HTTP/1.1\r\nConnection: close\r\n\r\n", 10)
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(body)

    def close(self):
        self.client.close()
        self.master.stop()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    # Pending on every listener during the whole module: requests announced at their largest, never finished.
    stalls = [
        Stalled(c.fast, struct.pack("<IH", MAX_FRAME, 0) + b"\x0a" * 1000, 8),
        Stalled(c.metadata, b"PUT /metadata?key=s HTTP/1.1\r\nContent-Length: %d\r\n\r\nxx" % (64 << 20), 8),
        Stalled(c.admin, b"GET /health HTTP/1.1\r\nHost: ", 8),
        StalledGrpcCalls(c.grpc, "/mooncake.store.master.MasterService/PutStart", connections=2, streams=8,
                         announce=64 << 20),
    ]
    yield c
    for s in stalls:
        s.close()
    c.close()


def _random_request(rng):
    m = rng.choice(METHODS)
    msg = getattr(pb, m.input_type.name)()
    for f in msg.DESCRIPTOR.fields:
        if f.is_repeated or f.message_type is not None:
            continue
        if f.type == f.TYPE_STRING:
            setattr(msg, f.name, rng.choice(PATTERNS + ["k", "x" * rng.randint(0, 300)]))
        elif f.type == f.TYPE_BOOL:
            setattr(msg, f.name, rng.random() < 0.5)
        elif f.cpp_type in (f.CPPTYPE_INT32, f.CPPTYPE_INT64):
            setattr(msg, f.name, rng.randint(-5, 1 << 20))
        elif f.cpp_type in (f.CPPTYPE_UINT32, f.CPPTYPE_UINT64):
            setattr(msg, f.name, rng.randint(0, 1 << 20))
    return METHODS.index(m), m.name, msg.SerializeToString()


def test_fast_rpc_port(cluster):
    def case(rng):
        index, _, payload = _random_request(rng)
        kind = rng.randrange(4)
        if kind == 0:
            data = rng.randbytes(rng.randint(1, 64))
        elif kind == 1:  # a well-formed request, then edits of it
            frame = struct.pack("<IH", len(payload), index) + payload
            data = frame if rng.random() < 0.3 else mutate(rng, frame)
        elif kind == 2:  # any method index, garbage payload
            junk = rng.randbytes(rng.randint(0, 200))
            data = struct.pack("<IH", len(junk), rng.randrange(len(METHODS) + 8)) + junk
        else:  # a length up to and past the limit, the rest never sent
            data = struct.pack("<IH", rng.choice((MAX_FRAME, MAX_FRAME + 1, 1 << 31, rng.randrange(1 << 30))),
                               index) + payload[:10]
        exchange(cluster.fast, data, timeout=0.5)

    for seed in SEEDS:
        assert fuzz_batches(seed, 8, 40, case, cluster.still_serves, cluster.pid, MAX_GROWTH_KIB, 15) >= 40


def grpc_port_back(cluster, timeout: float = 5.0) -> None:
    """Waits until the gRPC port accepts again (it is reopened after a frame grpcio's server cannot handle)."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(cluster.grpc) == 0:
                return
        assert time.monotonic() < deadline, "the gRPC port stayed closed"
        time.sleep(0.01)


def test_grpc_port(cluster):
    channel = grpc.insecure_channel(cluster.master.address)

    def case(rng):
        grpc_port_back(cluster)
        _, name, payload = _random_request(rng)
        path = f"/mooncake.store.master.MasterService/{name}"
        kind = rng.randrange(4)
        if kind == 0:  # a real client with mutated request bytes (decode errors, odd values)
            call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            try:
                call(mutate(rng, payload) if rng.random() < 0.5 else payload, timeout=5)
            except grpc.RpcError as e:
                assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, (name, e)
        elif kind == 1:  # hand-made HTTP/2, then edits of it
            exchange(cluster.grpc, mutate(rng, grpc_call_bytes(path, payload), 8192), timeout=0.5)
        elif kind == 2:  # a message that announces more than it sends, or more than the limit
            data = grpc_call_bytes(path, payload, announce=rng.choice((64 << 20, (64 << 20) + 1, 1 << 31)))
            exchange(cluster.grpc, data, timeout=0.5)
        else:  # random frames after the preface
            frames = b"".join(h2_frame(rng.randrange(12), rng.randrange(256), rng.randrange(8),
                                       rng.randbytes(rng.randint(0, 40))) for _ in range(rng.randint(1, 6)))
            exchange(cluster.grpc, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frames, timeout=0.5)

    try:
        for seed in SEEDS:
            assert fuzz_batches(seed, 8, 30, case, cluster.still_serves, cluster.pid, MAX_GROWTH_KIB, 20) >= 30
    finally:
        channel.close()


def _http_case(addr, paths, methods):
    def case(rng):
        method = rng.choice(methods)
        path = rng.choice(paths) + rng.choice(("", "?key=k", "?key=" + "%" * rng.randint(0, 3),
                                              "?key=" + "x" * rng.randint(0, 3000)))
        body = rng.randbytes(rng.randint(0, 300)) if rng.random() < 0.4 else b""
        headers = [f"Host: {'h' * rng.randint(0, 20)}"]
        length = rng.choice((len(body), len(body), len(body) + rng.randint(1, 1 << 20), -1, "x", 1 << 40))
        headers.append(f"Content-Length: {length}")
        if rng.random() < 0.1:
            headers.append("Transfer-Encoding: chunked")
        if rng.random() < 0.1:
            headers += [f"X-{i}: {'v' * rng.randint(0, 100)}" for i in range(rng.randint(1, 120))]
        req = f"{method} {path} HTTP/1.1\r\n" + "\r\n".join(headers) + "\r\n\r\n"
        data = req.encode() + body
        if rng.random() < 0.4:
            data = mutate(rng, data, 16384)
        exchange(addr, data, timeout=0.5)
    return case


def test_admin_http_port(cluster):
    case = _http_case(cluster.admin, ["/metrics", "/metrics/summary", "/health", "/status", "/get_all_segments",
                                      "/query_key", "/", "/nope", "//", "/" + "a" * 70000],
                      ["GET", "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "BREW", "G\x00T", ""])
    for seed in SEEDS:
        assert fuzz_batches(seed, 6, 40, case, cluster.still_serves, cluster.pid, MAX_GROWTH_KIB, 15) >= 40


def test_http_metadata_port(cluster):
    case = _http_case(cluster.metadata, ["/metadata", "/metadata", "/health", "/", "/metadata/x"],
                      ["GET", "PUT", "PUT", "DELETE", "POST", "HEAD", "PATCH", "OPTIONS", "\xff\xfe"])
    for seed in SEEDS:
        assert fuzz_batches(seed, 6, 40, case, cluster.still_serves, cluster.pid, MAX_GROWTH_KIB, 15) >= 40


def test_regex_requests_keep_the_master_serving(cluster):
    """Random and ReDoS patterns through both doors never stall the master (each call has 5 s)."""
    c = cluster.client
    rng = random.Random(7)
    atoms = ["a", "a+", "(a+)+", "(a|aa)*", ".*", "[a-z]", "\\w+", "(?i)A", "$", "^", "x{1000}", "(", ")"]
    fc = FastRpcClient(*cluster.fast, timeout=5)
    try:
        for _ in range(200):
            pattern = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 12)))
            reply = c.stub.GetReplicaListByRegex(pb.RegexRequest(pattern=pattern), timeout=5)
            assert reply.code in (0, -600), (pattern, reply.code)
            assert fc.call("RemoveByRegex", pb.RegexRequest(pattern=pattern)).code in (0, -600)
    finally:
        fc.close()
    cluster.still_serves()


def test_a_path_that_is_not_utf8_does_not_close_the_grpc_port(cluster):
    """grpcio's aio server ends its accept loop on a :path it cannot decode (UnicodeDecodeError); the master
    serves again on the same port at once, and the other doors never stopped."""
    path = "/mooncake.store.master.MasterService/ExistKey"
    bad = grpc_call_bytes(path, pb.KeyRequest(key="k").SerializeToString()).replace(b"/mooncake", b"/\xedooncake")
    def restarts() -> int:
        return cluster.master.stderr_tail().count("stopped accepting connections")

    for _ in range(3):  # again and again: each time it comes back
        grpc_port_back(cluster)
        before = restarts()
        exchange(cluster.grpc, bad, timeout=0.5)
        deadline = time.monotonic() + 10
        while restarts() == before:  # the door noticed (PROBE_SEC at most) and reopened the port
            assert time.monotonic() < deadline, "the closed gRPC port was not noticed"
            time.sleep(0.02)
        grpc_port_back(cluster)
        cluster.still_serves()
