"""A tcp engine with emulated device memory in a child process, for the device-staging test and benchmark.

The child enables the host emulation (memfd "cuda" memory; not a GPU), registers one device buffer and one host
buffer of `size` bytes each, prints {"segment", "device", "host", "pid"} and answers one JSON line per command:
  {"cmd": "fill", "which": "device"|"host", "offset", "length", "seed"}   pseudo-random bytes (pattern below)
  {"cmd": "digest", "which", "offset", "length"}                          sha256 hex of the range
  {"cmd": "stats"}                                                        the engine's get_stats()
  {"cmd": "exit"}
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys

import numpy as np


def pattern(length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8)


class DeviceBuffers:
    """One emulated device buffer and one host buffer of this process, both registered with `engine`."""

    def __init__(self, engine, size: int):
        from mooncake._native import platform

        self.emu = platform.get("host_emulation")
        self.size = size
        self.device = self.emu.allocate(size, "device", 0)
        self.host_array = np.zeros(size, dtype=np.uint8)
        self.host = self.host_array.ctypes.data
        assert platform.classify(self.device) == "cuda:0", platform.classify(self.device)
        for addr in (self.device, self.host):
            rc = engine.register_memory(addr, size)
            if rc != 0:
                raise RuntimeError(f"register_memory returned {rc}")

    def addr(self, which: str) -> int:
        return self.device if which == "device" else self.host

    def write(self, which: str, offset: int, data: np.ndarray) -> None:
        if which == "host":
            self.host_array[offset:offset + data.size] = data
        else:
            self.emu.copy(self.device + offset, data.ctypes.data, data.size)

    def read(self, which: str, offset: int, length: int) -> np.ndarray:
        if which == "host":
            return self.host_array[offset:offset + length].copy()
        out = np.empty(length, dtype=np.uint8)
        self.emu.copy(out.ctypes.data, self.device + offset, length)
        return out


def new_engine():
    from mooncake._native import platform
    from mooncake.engine import TransferEngine

    platform.enable_host_emulation()
    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("initialize failed")
    return engine


def _child(size: int) -> None:
    engine = new_engine()
    bufs = DeviceBuffers(engine, size)
    print(json.dumps({"segment": engine.get_local_segment_name(), "device": bufs.device, "host": bufs.host,
                      "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        out = {"ok": True}
        if req["cmd"] == "fill":
            bufs.write(req["which"], req["offset"], pattern(req["length"], req["seed"]))
        elif req["cmd"] == "digest":
            out["sha256"] = hashlib.sha256(bufs.read(req["which"], req["offset"], req["length"])).hexdigest()
        elif req["cmd"] == "stats":
            out["stats"] = json.loads(engine.get_stats())
        elif req["cmd"] == "exit":
            break
        print(json.dumps(out), flush=True)
    engine.close()


class DevicePeer:
    """Starts the child; call(cmd, **kw) returns its answer."""

    def __init__(self, size: int):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(size)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"device peer failed to start ({self.proc.wait(timeout=10)})")
        self.info = json.loads(line)
        self.segment = self.info["segment"]

    def call(self, cmd: str, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"device peer exited with {self.proc.poll()}")
        return json.loads(line)

    def digest(self, which: str, offset: int, length: int) -> str:
        return self.call("digest", which=which, offset=offset, length=length)["sha256"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait(timeout=10)


if __name__ == "__main__":
    _child(int(sys.argv[1]))
