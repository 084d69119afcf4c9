"""Helpers of the listener fuzz tests: seeded byte mutations, a process's memory and CPU, raw connections that
send or stall, and just enough HTTP/2 to speak gRPC by hand.

``fuzz_batches`` is the common loop: seeded cases in batches, and after each batch the listener must still
answer a legitimate request and the serving process's resident memory must not have grown past a bound.

Every helper bounds its waits; sockets are closed before returning, or by ``close`` of the object holding
them. Addresses are the caller's (tests use 127.0.0.1 only).
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from typing import Callable


def memory_kib(pid: int) -> int:
    """Resident memory (VmRSS) of `pid` in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time `pid` used so far."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def exchange(addr, data: bytes, timeout: float = 2.0, max_reply: int = 1 << 20) -> bytes:
    """Connects, sends `data`, half-closes and reads what comes back until the peer closes, `timeout` passes
    or `max_reply` bytes came. A peer that resets the connection is fine (its answer so far is returned)."""
    got = bytearray()
    deadline = time.monotonic() + timeout
    with socket.create_connection(addr, timeout=timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while len(got) < max_reply:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                s.settimeout(left)
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except (ConnectionError, socket.timeout, OSError):
            pass
    return bytes(got)


class Stalled:
    """`count` connections to `addr` that each send `data` (as much of it as the server takes within
    `send_timeout`) and then wait, keeping what they announced pending on the server, until ``close``. Replies
    are read and dropped by a thread so the server never blocks on them; ``closed_by_peer`` counts the
    connections the server closed."""

    def __init__(self, addr, data: bytes, count: int, send_timeout: float = 1.0) -> None:
        self.socks: list[socket.socket] = []
        self.closed_by_peer = 0
        self._stop = threading.Event()
        try:
            for _ in range(count):
                s = socket.create_connection(addr, timeout=5.0)
                self.socks.append(s)
                s.settimeout(send_timeout)
                try:
                    s.sendall(data)
                except (socket.timeout, ConnectionError):
                    pass  # the server stopped reading (or closed): what it has is pending there
        except BaseException:
            self.close()
            raise
        self._reader = threading.Thread(target=self._drain, name="stalled-drain", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        import select

        live = list(self.socks)
        while live and not self._stop.is_set():
            try:
                ready, _, _ = select.select(live, [], [], 0.1)
            except (OSError, ValueError):
                return
            for s in ready:
                try:
                    chunk = s.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    live.remove(s)
                    self.closed_by_peer += 1

    def close(self) -> None:
        self._stop.set()
        for s in self.socks:
            s.close()

    def __enter__(self) -> "Stalled":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def mutate(rng: random.Random, data: bytes, max_len: int = 4096) -> bytes:
    """A random small edit of `data`: flipped, inserted, deleted or repeated bytes, or a truncation."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 2:
            del b[pos:pos + rng.randint(1, 16)]
        elif op == 3:
            b[pos:pos] = b[pos:pos + rng.randint(1, 64)] * rng.randint(1, 8)
        else:
            del b[pos:]
    return bytes(b[:max_len])


def fuzz_batches(seed: int, batches: int, cases: int, case: Callable[[random.Random], None],
                 still_serves: Callable[[], None], pid: int, max_growth_kib: int,
                 time_budget: float = 60.0) -> int:
    """Runs `batches` x `cases` calls of ``case(rng)`` (rng seeded with `seed`); after each batch calls
    ``still_serves()`` (which asserts a legitimate request works) and checks that the resident memory of `pid`
    grew by at most `max_growth_kib` since the start. Stops early (after a whole batch) once `time_budget`
    seconds have passed; returns the number of cases run."""
    rng = random.Random(seed)
    still_serves()
    base = memory_kib(pid)
    end = time.monotonic() + time_budget
    done = 0
    for b in range(batches):
        for _ in range(cases):
            case(rng)
            done += 1
        still_serves()
        grown = memory_kib(pid) - base
        assert grown <= max_growth_kib, f"seed {seed} batch {b}: memory grew by {grown} KiB"
        if time.monotonic() > end:
            break
    return done


# -- HTTP/2, just enough for gRPC ------------------------------------------------------------------------------
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING = 0, 1, 4, 6
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman (names and values < 127 B)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


def grpc_headers(path: str) -> bytes:
    return b"".join(_literal(k, v) for k, v in ((":method", "POST"), (":scheme", "http"), (":path", path),
                                               (":authority", "fuzz"), ("content-type", "application/grpc"),
                                               ("te", "trailers")))


def grpc_message(payload: bytes, announce: int | None = None) -> bytes:
    """A gRPC length-prefixed message; `announce` overrides the length the prefix claims."""
    return b"\x00" + struct.pack(">I", len(payload) if announce is None else announce) + payload


def grpc_call_bytes(path: str, payload: bytes, stream: int = 1, announce: int | None = None,
                    end: bool = True) -> bytes:
    """Preface, SETTINGS and one call on `stream` carrying `payload` (END_STREAM unless `end` is False)."""
    return (H2_PREFACE + h2_frame(SETTINGS, 0, 0, b"")
            + h2_frame(HEADERS, END_HEADERS, stream, grpc_headers(path))
            + h2_frame(DATA, END_STREAM if end else 0, stream, grpc_message(payload, announce)))


class StalledGrpcCalls:
    """`connections` HTTP/2 connections to a gRPC server, each opening `streams` calls of `path` whose request
    message announces `announce` bytes and never arrives. A thread acknowledges the server's SETTINGS and
    PINGs so the connections stay up until ``close``."""

    def __init__(self, addr, path: str, connections: int, streams: int, announce: int = 1 << 20) -> None:
        out = H2_PREFACE + h2_frame(SETTINGS, 0, 0, b"")
        for i in range(streams):
            sid = 2 * i + 1
            out += h2_frame(HEADERS, END_HEADERS, sid, grpc_headers(path))
            out += h2_frame(DATA, 0, sid, grpc_message(b"\x0a", announce)[:6])
        self.socks: list[socket.socket] = []
        self._stop = threading.Event()
        try:
            for _ in range(connections):
                s = socket.create_connection(addr, timeout=5)
                s.sendall(out)
                self.socks.append(s)
        except BaseException:
            self.close()
            raise
        self._threads = [threading.Thread(target=self._answer, args=(s,), daemon=True) for s in self.socks]
        for t in self._threads:
            t.start()

    def _answer(self, s: socket.socket) -> None:
        buf = b""
        s.settimeout(0.2)
        while not self._stop.is_set():
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                kind, flags, payload = buf[3], buf[4], buf[9:9 + n]
                buf = buf[9 + n:]
                try:
                    if kind == SETTINGS and not flags & ACK:
                        s.sendall(h2_frame(SETTINGS, ACK, 0, b""))
                    elif kind == PING and not flags & ACK:
                        s.sendall(h2_frame(PING, ACK, 0, payload))
                except OSError:
                    return

    def close(self) -> None:
        self._stop.set()
        for s in self.socks:
            s.close()

    def __enter__(self) -> "StalledGrpcCalls":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
