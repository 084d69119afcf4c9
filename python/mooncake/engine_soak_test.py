"""Soak: more than 4 GiB through one TCP connection from two threads at once, data verified throughout
(Mooncake users saw TCP connections die after ~4 GB and crashes under sustained load)."""

import hashlib
import os
import threading

import numpy as np

from mooncake.engine import TransferEngine
from mooncake.testing.engine_peer import EnginePeer

os.environ["MC_FORCE_TCP"] = "1"
os.environ["MC_TCP_LANES_PER_PEER"] = "1"  # everything through a single connection

MiB = 1 << 20
HALF = 32 * MiB


def test_six_gib_through_one_connection_from_two_threads():
    peer = EnginePeer("P2PHANDSHAKE", size=2 * HALF)
    engine = TransferEngine()
    try:
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        buf = np.zeros(4 * HALF, dtype=np.uint8)  # per thread: [source half | read-back half]
        assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
        errors = []

        def worker(t: int, rounds: int) -> None:
            rng = np.random.default_rng(t)
            src = buf[2 * t * HALF:(2 * t + 1) * HALF]
            back = buf[(2 * t + 1) * HALF:(2 * t + 2) * HALF]
            remote = peer.buffer + t * HALF
            for i in range(rounds):
                src[::4096] = rng.integers(0, 256, HALF // 4096, dtype=np.uint8)  # change a byte per page
                if engine.transfer_sync_write(peer.segment, src.ctypes.data, remote, HALF) != 0:
                    errors.append(f"thread {t} write {i}")
                    return
                if engine.transfer_sync_read(peer.segment, back.ctypes.data, remote, HALF) != 0:
                    errors.append(f"thread {t} read {i}")
                    return
                if not np.array_equal(src, back):
                    errors.append(f"thread {t} round {i}: data mismatch")
                    return

        rounds = 48  # 2 threads x 48 rounds x 2 x 32 MiB = 6 GiB
        threads = [threading.Thread(target=worker, args=(t, rounds)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        assert not any(t.is_alive() for t in threads), "soak did not finish"
        assert not errors, errors
        assert peer.digest(0, HALF) == hashlib.sha256(buf[:HALF]).hexdigest()
    finally:
        engine.close()
        peer.close()
