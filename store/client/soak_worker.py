"""A store client *process* that runs a seeded put / batch_put_from / get / get_into load for a fixed time and
reports what every call returned (restart and chaos soaks: restart_test.py, chaos_test.py).

Run: ``python -m mooncake.store.client.soak_worker --master HOST:PORT --seconds S --seed X [--hostname H]
[--metadata P2PHANDSHAKE|http://...] [--segment 32MB] [--buffer 8MB] [--value 64KB] [--batch 4]
[--prefix P] [--setup_tries N] [--rate OPS]`` (--rate: at most OPS load steps per second, so a failing call
does not turn into a busy loop; 0: as fast as it goes).

stdout: first {"ready": true, "hostname": ..., "setup_tries": n} (or {"ready": false, "code": c} when
every setup attempt failed; a failed attempt is retried with a fresh MooncakeDistributedStore), then, after
S seconds of load, one summary line {"done": true, "counts": {op: {code: n}}, "bad": n, "bad_keys": [...]}
and the process exits. Codes: put / batch_put_from (per key): the call's result; get / get_into: "ok", or
the negative code (get: "empty" for b""). ``bad`` counts reads that returned other bytes than were put
(silent corruption; a correct store never has any). Keys are ``<prefix>-<n>``; a value's bytes derive from
its key, so any reader can check them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time

import numpy as np

from mooncake.store import MooncakeDistributedStore
from mooncake.store.client.config import parse_size


def value_of(key: str, size: int) -> bytes:
    """The bytes the soak puts under `key` (a 64-byte digest of the key, repeated)."""
    d = hashlib.blake2b(key.encode(), digest_size=64).digest()
    return (d * (size // 64 + 1))[:size]


def setup_store(args) -> tuple[MooncakeDistributedStore | None, int, int]:
    """(store, attempts, last code); store is None when every attempt failed."""
    code = -1
    for attempt in range(1, args.setup_tries + 1):
        store = MooncakeDistributedStore()
        code = store.setup(args.hostname, args.metadata, args.segment, args.buffer, args.protocol, args.device,
                           args.master)
        if code == 0:
            return store, attempt, code
        store.close()
        time.sleep(0.2)
    return None, args.setup_tries, code


class Load:
    def __init__(self, store: MooncakeDistributedStore, args) -> None:
        self.store = store
        self.rng = random.Random(args.seed)
        self.size = args.value
        self.batch = args.batch
        self.prefix = args.prefix
        self.counts: dict[str, dict[str, int]] = {}
        self.stored: list[str] = []  # keys whose put returned 0
        self.bad_keys: list[str] = []
        self.n = 0
        self.src = np.zeros(self.size * self.batch, dtype=np.uint8)
        self.dst = np.zeros(self.size, dtype=np.uint8)
        for buf in (self.src, self.dst):
            if store.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
                raise RuntimeError("register_buffer failed")

    def count(self, op: str, what) -> None:
        c = self.counts.setdefault(op, {})
        c[str(what)] = c.get(str(what), 0) + 1

    def next_key(self) -> str:
        self.n += 1
        return f"{self.prefix}-{self.n}"

    def check(self, key: str, got: bytes) -> None:
        if got != value_of(key, self.size):
            self.bad_keys.append(key)

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.35 or not self.stored:
            key = self.next_key()
            code = self.store.put(key, value_of(key, self.size))
            self.count("put", code)
            if code == 0:
                self.stored.append(key)
        elif r < 0.65:
            keys = [self.next_key() for _ in range(self.batch)]
            for i, k in enumerate(keys):
                self.src[i * self.size:(i + 1) * self.size] = np.frombuffer(value_of(k, self.size), dtype=np.uint8)
            base = self.src.ctypes.data
            codes = self.store.batch_put_from(keys, [base + i * self.size for i in range(len(keys))],
                                              [self.size] * len(keys))
            for k, c in zip(keys, codes):
                self.count("batch_put_from", c)
                if c == 0:
                    self.stored.append(k)
        elif r < 0.83:
            key = self.rng.choice(self.stored)
            got = self.store.get(key)
            self.count("get", "ok" if got else "empty")
            if got:
                self.check(key, got)
        else:
            key = self.rng.choice(self.stored)
            n = self.store.get_into(key, self.dst.ctypes.data, self.dst.nbytes)
            self.count("get_into", "ok" if n == self.size else n)
            if n >= 0:
                self.check(key, self.dst[:n].tobytes())
        if len(self.stored) > 4096:
            del self.stored[:2048]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--master", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hostname", default="127.0.0.1")
    p.add_argument("--metadata", default="P2PHANDSHAKE")
    p.add_argument("--protocol", default="tcp", help="the transfer engine's protocol (tcp, rdma, efa, ...)")
    p.add_argument("--device", default="", help="the protocol's device names (device_name)")
    p.add_argument("--segment", default="32MB")
    p.add_argument("--buffer", default="8MB")
    p.add_argument("--value", type=parse_size, default=64 * 1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prefix", default="soak")
    p.add_argument("--setup_tries", type=int, default=5)
    p.add_argument("--rate", type=float, default=100.0)
    args = p.parse_args(argv)
    store, tries, code = setup_store(args)
    if store is None:
        print(json.dumps({"ready": False, "code": code, "setup_tries": tries}), flush=True)
        return 1
    print(json.dumps({"ready": True, "hostname": store.get_hostname(), "setup_tries": tries}), flush=True)
    load = Load(store, args)
    start = time.monotonic()
    deadline = start + args.seconds
    steps = 0
    while time.monotonic() < deadline:
        load.step()
        steps += 1
        if args.rate > 0:
            time.sleep(max(0.0, start + steps / args.rate - time.monotonic()))
    print(json.dumps({"done": True, "counts": load.counts, "bad": len(load.bad_keys),
                      "bad_keys": load.bad_keys[:10]}), flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
