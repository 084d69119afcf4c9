"""A target engine survives arbitrary bytes on its data port, rejects out-of-range requests, and keeps serving.

Talks to a live engine's TCP data listener with hand-made frames (layout in transfer_engine/transport/tcp/wire.h).
"""

import hashlib
import json
import os
import socket
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake.engine import TransferEngine
from mooncake.http_metadata_server import HttpMetadataServer
from mooncake.testing.engine_peer import EnginePeer

os.environ["MC_FORCE_TCP"] = "1"  # the final check must go through the fuzzed TCP listener

REQ_MAGIC, RESP_MAGIC, VERSION = b"MCTE", b"MCTR", 1
WRITE, READ = 1, 2


def request(op, seq, addr, length, magic=REQ_MAGIC, version=VERSION):
    return magic + struct.pack("<BBHQQQ", version, op, 0, seq, addr, length)


def read_response(sock):
    data = b""
    while len(data) < 24:
        chunk = sock.recv(24 - len(data))
        if not chunk:
            return None
        data += chunk
    assert data[:4] == RESP_MAGIC
    version, status, _, seq, length = struct.unpack("<BBHQQ", data[4:])
    return status, seq, length


@pytest.fixture(scope="module")
def target():
    with HttpMetadataServer("127.0.0.1", 0) as meta:
        peer = EnginePeer(meta.url, "127.0.0.1:31001", 1 << 20)
        desc = json.loads(meta.store.get(f"mooncake/ram/{peer.segment}"))
        yield meta, peer, (desc["tcp_data_ip"], desc["tcp_data_port"])
        peer.close()


def connect(addr):
    s = socket.create_connection(addr, timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def test_raw_frames_round_trip_and_out_of_range_is_rejected(target):
    _, peer, addr = target
    peer.call("fill", offset=0, length=4096, seed=3)
    with connect(addr) as s:
        s.sendall(request(READ, 1, peer.buffer, 4096))
        status, seq, length = read_response(s)
        assert (status, seq, length) == (0, 1, 4096)
        got = b""
        while len(got) < 4096:
            got += s.recv(4096 - len(got))
        # Outside the registered buffer (and straddling its end): rejected, connection stays usable.
        for a, n in [(peer.buffer + (1 << 20), 16), (peer.buffer + (1 << 20) - 8, 16), (0x1000, 8)]:
            s.sendall(request(WRITE, 2, a, n) + b"\xff" * n)
            assert read_response(s) == (1, 2, 0)
            s.sendall(request(READ, 3, a, n))
            assert read_response(s) == (1, 3, 0)
        s.sendall(request(WRITE, 4, peer.buffer, 4) + b"abcd")
        assert read_response(s) == (0, 4, 0)
    expected = bytearray(got)
    expected[:4] = b"abcd"  # only the accepted write changed the buffer
    assert peer.digest(0, 4096) == hashlib.sha256(bytes(expected)).hexdigest()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.binary(min_size=1, max_size=96),
    st.builds(lambda op, seq, a, n, cut: request(op, seq, a, n)[:cut],
              st.integers(0, 255), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
              st.integers(0, 2**64 - 1), st.integers(1, 32)),
    st.builds(lambda m, v: request(READ, 1, 0x1000, 8, magic=m, version=v),
              st.binary(min_size=4, max_size=4), st.integers(0, 255)),
))
def test_garbage_never_hurts_the_target(target, data):
    _, peer, addr = target
    with connect(addr) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(2)
        try:
            while s.recv(65536):
                pass
        except (ConnectionResetError, socket.timeout):
            pass


def test_target_still_serves_after_the_fuzzing(target):
    meta, peer, _ = target
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1:31002", meta.url, "tcp", "") == 0
    buf = np.arange(1 << 20, dtype=np.uint64).view(np.uint8)[: 1 << 20].copy()
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, buf.nbytes) == 0
    assert peer.digest(0, buf.nbytes) == hashlib.sha256(buf).hexdigest()
    assert peer.proc.poll() is None
    engine.close()


def test_stalled_write_stops_at_an_unregistration():
    """A peer that stalls in the middle of a WRITE payload until the target unregistered the memory (its
    drain wait gave up) must not write the rest of it there: the rest is discarded and the WRITE rejected."""
    with HttpMetadataServer("127.0.0.1", 0) as meta:
        peer = EnginePeer(meta.url, "127.0.0.1:31002", 1 << 20, env={"MC_TRANSFER_TIMEOUT": "5"})
        try:
            desc = json.loads(meta.store.get(f"mooncake/ram/{peer.segment}"))
            peer.call("fill", offset=0, length=8192, seed=5)
            before = peer.digest(16, 8192 - 16)
            with connect((desc["tcp_data_ip"], desc["tcp_data_port"])) as s:
                s.sendall(request(WRITE, 1, peer.buffer, 8192) + b"\xee" * 16)
                time.sleep(0.3)  # the target has the header and pinned the range
                assert peer.call("unregister")["rc"] == 0  # returns once its drain wait gave up
                s.sendall(b"\xee" * (8192 - 16))
                assert read_response(s) == (1, 1, 0)
            assert peer.digest(16, 8192 - 16) == before
        finally:
            peer.close()


def _cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_backed_up_answers_do_not_spin_the_loop():
    """A client that pipelines more READs than the target queues answers for and then reads nothing: the
    target stops reading requests and sleeps (no busy loop on readable-but-paused sockets)."""
    with HttpMetadataServer("127.0.0.1", 0) as meta:
        peer = EnginePeer(meta.url, "127.0.0.1:31003", 1 << 20)
        try:
            desc = json.loads(meta.store.get(f"mooncake/ram/{peer.segment}"))
            with connect((desc["tcp_data_ip"], desc["tcp_data_port"])) as s:
                s.sendall(b"".join(request(READ, i + 1, peer.buffer, 4096) for i in range(6000)))
                time.sleep(1.0)
                before = _cpu_seconds(peer.info["pid"])
                time.sleep(2.0)
                used = _cpu_seconds(peer.info["pid"]) - before
            assert used < 0.5, f"target used {used:.2f} s of CPU in 2 s while its client read nothing"
        finally:
            peer.close()
