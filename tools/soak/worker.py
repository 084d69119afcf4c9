"""One soak process: a store client (``--mode store``) or a Transfer Engine (``--mode engine``) under load.

Run: ``python -m mooncake.tools.soak.worker --mode store --master H:P --hostname IP --seed N --prefix P``
or ``--mode engine --hostname IP``. stdout, one JSON object per line:

  {"type": "ready", ...}            once set up (engine: "segment" and "buffer" for its peer)
  {"type": "tick", "t", "ops": {op: [ok, failed]}, "bytes": {kind: n}, "bad": [...], "slow": [...],
   "rss": bytes}                    every second; bad and slow list what happened since the last tick
  {"type": "final", "ok": bool, "detail": str}   after the "final" command: one last verified round trip

stdin, one JSON object per line: {"cmd": "peer", "segment", "buffer"} (engine: where to write), {"cmd":
"final"} (stop the load, prove this process still serves, keep serving), {"cmd": "exit"} (close, exit 0).

Store values carry their own checksum: ``payload + blake2b(key + payload)``; a read whose bytes do not verify
is "bad" (a miss is not: the writer may have died or the object may have been evicted). Engine rounds write a
fresh random block into the peer's buffer, read it back and compare. "slow" lists calls that took longer than
``--hang_s`` with their wall-clock start and end (the runner excuses the time this process was paused).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import threading
import time

import numpy as np

DIGEST = 32


def make_value(key: str, size: int, rng: random.Random) -> bytes:
    payload = rng.randbytes(max(1, size - DIGEST))
    return payload + hashlib.blake2b(key.encode() + payload, digest_size=DIGEST).digest()


def verify(key: str, value: bytes) -> bool:
    if len(value) <= DIGEST:
        return False
    payload, digest = value[:-DIGEST], value[-DIGEST:]
    return hashlib.blake2b(key.encode() + payload, digest_size=DIGEST).digest() == digest


def memory(pid: int | str = "self") -> tuple[int, int]:
    """(VmRSS, RssAnon) of a process in bytes, (0, 0) when it is gone. RssAnon is its private memory; VmRSS
    also counts shared mappings (its own and same-host peers' memfd segments)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "RssAnon:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out.get("VmRSS", 0), out.get("RssAnon", 0)


class Stats:
    """Counters shared by the load thread and the tick printer (one lock)."""

    def __init__(self, hang_s: float) -> None:
        self.lock = threading.Lock()
        self.ops: dict[str, list[int]] = {}
        self.bytes: dict[str, int] = {}
        self.bad: list[str] = []
        self.slow: list[dict] = []
        self.hang_s = hang_s

    def timed(self, op: str, fn, ok_if, nbytes=lambda r: 0, kind: str = ""):
        start = time.time()
        t0 = time.monotonic()
        r = fn()
        took = time.monotonic() - t0
        ok = ok_if(r)
        with self.lock:
            c = self.ops.setdefault(op, [0, 0])
            c[0 if ok else 1] += 1
            if ok and kind:
                self.bytes[kind] = self.bytes.get(kind, 0) + nbytes(r)
            if took > self.hang_s:
                self.slow.append({"op": op, "start": start, "end": start + took, "seconds": round(took, 3)})
        return r

    def tick(self) -> dict:
        with self.lock:
            out = {"type": "tick", "t": time.time(), "ops": {k: list(v) for k, v in self.ops.items()},
                   "bytes": dict(self.bytes), "bad": self.bad, "slow": self.slow, "rss": memory()[0]}
            self.bad, self.slow = [], []
        return out


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class StoreLoad:
    def __init__(self, args, stats: Stats) -> None:
        from mooncake.store import MooncakeDistributedStore

        self.args, self.stats = args, stats
        self.rng = random.Random(args.seed)
        self.keys: list[str] = []
        self.n = 0
        deadline = time.monotonic() + args.setup_s
        while True:  # the master may be restarting when this process starts
            self.store = MooncakeDistributedStore()
            code = self.store.setup(args.hostname, "P2PHANDSHAKE", args.segment, args.buffer, "tcp", "",
                                    args.master)
            if code == 0:
                break
            self.store.close()
            if time.monotonic() > deadline:
                raise SystemExit(f"store setup failed: {code}")
            time.sleep(0.5)
        self.dst = np.zeros(args.value, dtype=np.uint8)
        if self.store.register_buffer(self.dst.ctypes.data, self.dst.nbytes) != 0:
            raise SystemExit("register_buffer failed")

    def ready(self) -> dict:
        return {"type": "ready", "hostname": self.store.get_hostname(), "pid": os.getpid()}

    def key(self) -> str:
        self.n += 1
        return f"{self.args.prefix}/{self.n}"

    def check(self, key: str, got: bytes) -> None:
        if got and not verify(key, got):
            with self.stats.lock:
                self.stats.bad.append(key)

    def step(self) -> None:
        s, st, r = self.store, self.stats, self.rng.random()
        if r < 0.3 or not self.keys:
            k = self.key()
            v = make_value(k, self.args.value, self.rng)
            if st.timed("put", lambda: s.put(k, v), lambda rc: rc == 0, lambda rc: len(v), "put") == 0:
                self.keys.append(k)
        elif r < 0.45:
            ks = [self.key() for _ in range(4)]
            vs = [make_value(k, self.args.value, self.rng) for k in ks]
            if st.timed("put_batch", lambda: s.put_batch(ks, vs), lambda rc: rc == 0,
                        lambda rc: sum(map(len, vs)), "put") == 0:
                self.keys += ks
        elif r < 0.75:
            k = self.rng.choice(self.keys)
            got = st.timed("get", lambda: s.get(k), lambda b: bool(b), len, "get")
            self.check(k, got)
        elif r < 0.95:
            k = self.rng.choice(self.keys)
            n = st.timed("get_into", lambda: s.get_into(k, self.dst.ctypes.data, self.dst.nbytes),
                         lambda n: n > 0, lambda n: n, "get")
            if n > 0:
                self.check(k, self.dst[:n].tobytes())
        else:
            k = self.keys.pop(self.rng.randrange(len(self.keys)))
            st.timed("remove", lambda: s.remove(k), lambda rc: rc in (0, -704))
        if len(self.keys) > 2000:
            del self.keys[:1000]

    def final(self) -> tuple[bool, str]:
        deadline = time.monotonic() + self.args.final_s
        last = ""
        while time.monotonic() < deadline:
            k = self.key()
            v = make_value(k, self.args.value, self.rng)
            rc = self.store.put(k, v)
            got = self.store.get(k) if rc == 0 else b""
            if rc == 0 and got == v:
                return True, f"put+get of {k}"
            last = f"put rc {rc}, get {len(got)} bytes"
            time.sleep(0.5)
        return False, last

    def close(self) -> None:
        self.store.close()


class EngineLoad:
    def __init__(self, args, stats: Stats) -> None:
        from mooncake.engine import TransferEngine

        self.args, self.stats = args, stats
        self.block = args.block
        self.engine = TransferEngine()
        if self.engine.initialize(args.hostname, "P2PHANDSHAKE", "tcp", "") != 0:
            raise SystemExit("engine initialize failed")
        # [0, block): the peer writes here; [block, 2 block): source; [2 block, 3 block): read-back
        self.buf = np.zeros(3 * self.block, dtype=np.uint8)
        if self.engine.register_memory(self.buf.ctypes.data, self.buf.nbytes) != 0:
            raise SystemExit("register_memory failed")
        self.rng = np.random.default_rng(args.seed)
        self.peer: tuple[str, int] | None = None
        self.peer_ready = threading.Event()

    def ready(self) -> dict:
        return {"type": "ready", "segment": self.engine.get_local_segment_name(), "buffer": self.buf.ctypes.data,
                "pid": os.getpid()}

    def set_peer(self, segment: str, buffer: int) -> None:
        self.peer = (segment, buffer)
        self.peer_ready.set()

    def round(self) -> bool:
        seg, remote = self.peer
        b, e, st = self.block, self.engine, self.stats
        src, back = self.buf[b:2 * b], self.buf[2 * b:3 * b]
        src[:] = self.rng.integers(0, 256, b, dtype=np.uint8)
        if st.timed("transfer_write", lambda: e.transfer_sync_write(seg, src.ctypes.data, remote, b),
                    lambda rc: rc == 0, lambda rc: b, "transfer") != 0:
            return False
        if st.timed("transfer_read", lambda: e.transfer_sync_read(seg, back.ctypes.data, remote, b),
                    lambda rc: rc == 0, lambda rc: b, "transfer") != 0:
            return False
        if not np.array_equal(src, back):
            with st.lock:
                st.bad.append(f"transfer to {seg}")
            return False
        return True

    def step(self) -> None:
        if not self.peer_ready.wait(0.2):
            return
        self.round()

    def final(self) -> tuple[bool, str]:
        if self.peer is None:
            return False, "never got a peer"
        deadline = time.monotonic() + self.args.final_s
        while time.monotonic() < deadline:
            if self.round():
                return True, f"write+read of {self.block} bytes to {self.peer[0]}"
            time.sleep(0.5)
        return False, "no verified round trip"

    def close(self) -> None:
        self.engine.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("store", "engine"), required=True)
    p.add_argument("--master", default="")
    p.add_argument("--hostname", default="127.0.0.1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="soak")
    p.add_argument("--segment", default="32MB")
    p.add_argument("--buffer", default="8MB")
    p.add_argument("--value", type=int, default=32 << 10)
    p.add_argument("--block", type=int, default=1 << 20)
    p.add_argument("--rate", type=float, default=50.0, help="load steps per second at most")
    p.add_argument("--hang_s", type=float, default=30.0)
    p.add_argument("--setup_s", type=float, default=60.0)
    p.add_argument("--final_s", type=float, default=30.0)
    args = p.parse_args(argv)
    stats = Stats(args.hang_s)
    load = StoreLoad(args, stats) if args.mode == "store" else EngineLoad(args, stats)
    emit(load.ready())
    stop = threading.Event()

    leave = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "peer":
                load.set_peer(cmd["segment"], cmd["buffer"])
            elif cmd["cmd"] == "final":
                stop.set()
            elif cmd["cmd"] == "exit":
                break
        stop.set()  # "exit", or stdin closed: the runner is gone
        leave.set()

    def ticks() -> None:
        while not stop.wait(1.0):
            emit(stats.tick())

    threading.Thread(target=commands, daemon=True).start()
    threading.Thread(target=ticks, daemon=True).start()
    start, steps = time.monotonic(), 0
    while not stop.is_set():
        load.step()
        steps += 1
        time.sleep(max(0.0, start + steps / args.rate - time.monotonic()))
    emit(stats.tick())
    ok, detail = load.final()
    emit({"type": "final", "ok": ok, "detail": detail})
    leave.wait()  # keep serving (peers' final round trips reach this process) until told to exit
    load.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
