"""A target engine survives arbitrary bytes and hostile connection patterns on every listener it has (the TCP
data port and the handshake/RPC port), rejects out-of-range requests, and keeps serving legitimate peers.

Talks to a live engine's listeners with hand-made frames (data port: transfer_engine/transport/tcp/wire.h;
RPC port: uint64 length + type byte + JSON, transfer_engine/core/rpc.h).
"""

import hashlib
import json
import os
import random
import socket
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake.engine import TransferEngine, TransferNotify
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


# --- every listener, seeded batches: garbage, slow and many connections -------------------------------------

FUZZ_SEED = int(os.environ.get("MC_FUZZ_SEED", "20260607"))
RPC_METADATA, RPC_NOTIFY, RPC_PROBE = 1, 2, 3


def rpc_frame(kind, body, length=None):
    return struct.pack("<Q", len(body) + 1 if length is None else length) + bytes([kind]) + body


def rpc_call(port, kind, body, timeout=5):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(rpc_frame(kind, body))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    (length,) = struct.unpack("<Q", data[:8])
    assert len(data) == 8 + length
    return json.loads(data[9:])


@pytest.fixture(scope="module")
def p2p_target():
    """A target whose descriptor is fetched over its RPC port (P2P), with 1024 file descriptors: its data
    port then keeps at most 512 connections, so the batches below go past that limit."""
    peer = EnginePeer("P2PHANDSHAKE", "127.0.0.1", 1 << 20, prefix=["prlimit", "--nofile=1024:1024"])
    rpc_port = int(peer.segment.rsplit(":", 1)[1])
    desc = rpc_call(rpc_port, RPC_METADATA, b"{}")
    yield peer, rpc_port, desc["tcp_data_port"]
    peer.close()


def legit_peer_transfers(peer, seed):
    """A fresh engine opens the target (RPC), writes to it (data port), probes and notifies it (RPC)."""
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        buf = np.random.default_rng(seed).integers(0, 256, 65536, dtype=np.uint8)
        assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
        t0 = time.monotonic()
        assert engine.get_first_buffer_address(peer.segment) == peer.buffer
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, buf.nbytes) == 0
        assert engine.send_probe(peer.segment) == 0
        assert engine.send_notify(peer.segment, TransferNotify("fuzz", str(seed))) == 0
        assert time.monotonic() - t0 < 10
        assert peer.digest(0, buf.nbytes) == hashlib.sha256(buf).hexdigest()
    finally:
        engine.close()
    assert peer.proc.poll() is None


def _rpc_garbage(rng):
    bodies = [b"{}", b'{"segment_name": 5}', b'{"name": [], "notify_msg": {}}', b'{"name": "x"}', b"[1, 2",
              b"null", bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64))),
              json.dumps({"name": "n", "notify_msg": "m" * rng.randint(0, 4096)}).encode()]
    choice = rng.randrange(5)
    if choice == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
    body = rng.choice(bodies)
    kind = rng.choice([0, 1, 2, 3, 4, 200, 255])
    if choice == 1:
        return rpc_frame(kind, body, length=rng.choice([0, 2**64 - 1, 1 << 40, (1 << 20) + 1]))
    if choice == 2:
        return rpc_frame(kind, body)[: rng.randint(1, 8 + len(body))]  # cut short
    return rpc_frame(kind, body)


def _data_garbage(rng, buffer):
    op = rng.choice([0, WRITE, READ, 3, 255])
    addr = rng.choice([buffer, buffer + (1 << 20) - 8, 0, 0x1000, rng.getrandbits(64)])
    n = rng.choice([0, 1, 8, 4096, 1 << 40])
    frame = request(op, rng.getrandbits(64), addr, n, magic=rng.choice([REQ_MAGIC, b"XXXX"]),
                    version=rng.choice([VERSION, 0, 7]))
    if op == WRITE and n <= 4096:
        frame += bytes(rng.getrandbits(8) for _ in range(rng.randint(0, n)))
    return frame[: rng.randint(1, len(frame))] if rng.random() < 0.3 else frame


def _garbage_batch(port, frames):
    for data in frames:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            try:  # the target may close (or reset) as soon as it sees a bad frame
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(2)
                while s.recv(65536):
                    pass
            except (OSError, socket.timeout):
                pass


def _open_slow(port, count, rng, starts):
    """`count` connections, each left open after sending one of `starts` (b"" = idle), cut at a random point."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        start = rng.choice(starts)
        if start:
            s.sendall(start[: rng.randint(1, len(start))])
        socks.append(s)
    return socks


def test_every_listener_survives_seeded_garbage_and_connection_floods(p2p_target):
    peer, rpc_port, data_port = p2p_target
    rng = random.Random(FUZZ_SEED)
    legit_peer_transfers(peer, 0)
    for batch in range(8):
        kind = ["rpc-garbage", "rpc-slow", "data-garbage", "data-slow"][batch % 4]
        held = []
        try:
            if kind == "rpc-garbage":
                _garbage_batch(rpc_port, [_rpc_garbage(rng) for _ in range(40)])
            elif kind == "data-garbage":
                _garbage_batch(data_port, [_data_garbage(rng, peer.buffer) for _ in range(40)])
            elif kind == "rpc-slow":  # more than the RPC server keeps open, idle or stuck mid-request
                starts = [b"", rpc_frame(RPC_PROBE, b"{}"), rpc_frame(RPC_NOTIFY, b'{"name": "n", "notify_msg": "'
                                                                            + b"m" * 60000 + b'"}')]
                held = _open_slow(rpc_port, rng.randint(280, 320), rng, starts)
            else:  # more than the data port keeps open, idle or stuck mid-frame (some inside a WRITE payload)
                # (their WRITEs aim at the buffer's second half: the server may still be storing their first
                # bytes when the legitimate write below lands in the first 64 KiB)
                spare = peer.buffer + (1 << 19)
                starts = [b"", request(READ, 1, spare, 4096), request(WRITE, 1, spare, 8192) + b"w" * 64]
                held = _open_slow(data_port, rng.randint(560, 640), rng, starts)
            legit_peer_transfers(peer, batch + 1)  # while the slow connections are still open
        finally:
            for s in held:
                s.close()
    stats = peer.call("stats")["stats"]
    assert stats["listeners"]["rpc"]["evicted"] > 0, stats["listeners"]
    assert stats["listeners"]["tcp"]["evicted"] > 0, stats["listeners"]
    assert stats["listeners"]["tcp"]["open"] <= stats["listeners"]["tcp"]["limit"] == 512
    assert [n[0] for n in peer.call("notifies")["notifies"]] == ["fuzz"] * 9


def test_a_write_stalled_mid_frame_is_closed_and_lets_go_of_the_memory():
    """A peer that stops in the middle of a WRITE payload holds the target's registered memory: the target
    closes such a connection after twice MC_TRANSFER_TIMEOUT without progress (its client gave the slice up
    long before), and unregistering then has nothing to wait for."""
    with HttpMetadataServer("127.0.0.1", 0) as meta:
        peer = EnginePeer(meta.url, "127.0.0.1:31004", 1 << 20, env={"MC_TRANSFER_TIMEOUT": "5"})
        try:
            desc = json.loads(meta.store.get(f"mooncake/ram/{peer.segment}"))
            with connect((desc["tcp_data_ip"], desc["tcp_data_port"])) as s:
                s.sendall(request(WRITE, 1, peer.buffer, 8192) + b"\xee" * 16)
                t0 = time.monotonic()
                s.settimeout(20)
                assert s.recv(64) == b""  # closed by the target
                assert 9.5 < time.monotonic() - t0 < 13
            t0 = time.monotonic()
            assert peer.call("unregister")["rc"] == 0
            assert time.monotonic() - t0 < 2  # no pin left to wait for
            assert peer.call("stats")["stats"]["listeners"]["tcp"]["stalled"] == 1
        finally:
            peer.close()


def test_a_peer_trickling_one_frame_is_closed_after_the_stall_limit():
    """A peer that keeps one WRITE frame unfinished by sending a byte now and then (progress, but no frame)
    holds registered memory just the same: it is closed once the frame has taken twice MC_TRANSFER_TIMEOUT."""
    with HttpMetadataServer("127.0.0.1", 0) as meta:
        peer = EnginePeer(meta.url, "127.0.0.1:31005", 1 << 20, env={"MC_TRANSFER_TIMEOUT": "5"})  # the minimum
        try:
            desc = json.loads(meta.store.get(f"mooncake/ram/{peer.segment}"))
            with connect((desc["tcp_data_ip"], desc["tcp_data_port"])) as s:
                s.sendall(request(WRITE, 1, peer.buffer, 8192))
                t0 = time.monotonic()
                s.settimeout(0.3)
                closed = False
                while not closed and time.monotonic() - t0 < 20:
                    try:
                        s.sendall(b"\xee")
                        closed = s.recv(64) == b""
                    except socket.timeout:
                        pass
                    except OSError:  # reset: closed by the target
                        closed = True
                assert closed
                assert 9.5 < time.monotonic() - t0 < 13
            assert peer.call("stats")["stats"]["listeners"]["tcp"]["stalled"] == 1
        finally:
            peer.close()
