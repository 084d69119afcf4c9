"""A Transfer Engine in a child process, driven over pipes: the "other side" of two-process tests.

Child protocol (one JSON object per line): the child prints {"segment", "buffer", "size", "rpc_port"} once ready,
then answers each command on stdin with one JSON line. Commands:
  {"cmd": "fill", "offset", "length", "seed"}      write pseudo-random bytes (numpy default_rng(seed))
  {"cmd": "digest", "offset", "length"}            sha256 hex of a range
  {"cmd": "unregister"} / {"cmd": "register"}      drop / restore the buffer's registration
  {"cmd": "stats"}                                 the engine's transport counters
  {"cmd": "transfer", "op": "write"|"read", "segment", "remote", "offset", "length"}
                                                   a sync transfer from/to this buffer: {"rc", "seconds"}
  {"cmd": "notifies"}                              drain received notifications
  {"cmd": "exit"}
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from mooncake.testing.children import popen


def pattern(length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8)


def _child(name: str, metadata: str, size: int, managed: bool) -> None:
    from mooncake.engine import TransferEngine

    if os.environ.get("MC_TEST_NONDUMPABLE"):  # refuse ptrace-style access (same-host transport) to this process
        PR_SET_DUMPABLE = 4
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    engine = TransferEngine()
    if engine.initialize(name, metadata, "tcp", "") != 0:
        print(json.dumps({"error": "initialize failed"}), flush=True)
        sys.exit(1)
    if managed:  # engine-allocated (memfd) memory: same-host peers map it
        addr = engine.allocate_managed_buffer(size)
        buf = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(addr))
    else:
        buf = np.zeros(size, dtype=np.uint8)
        assert engine.register_memory(buf.ctypes.data, size) == 0
    print(json.dumps({"segment": engine.get_local_segment_name(), "buffer": buf.ctypes.data, "size": size,
                      "rpc_port": engine.get_rpc_port(), "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        cmd, out = req["cmd"], {"ok": True}
        if cmd == "fill":
            buf[req["offset"]:req["offset"] + req["length"]] = pattern(req["length"], req["seed"])
        elif cmd == "digest":
            out["sha256"] = hashlib.sha256(buf[req["offset"]:req["offset"] + req["length"]]).hexdigest()
        elif cmd == "unregister":
            out["rc"] = engine.unregister_memory(buf.ctypes.data)
        elif cmd == "stats":
            out["stats"] = json.loads(engine.get_stats())
        elif cmd == "transfer":
            fn = engine.transfer_sync_write if req["op"] == "write" else engine.transfer_sync_read
            t0 = time.monotonic()
            out["rc"] = fn(req["segment"], buf.ctypes.data + req.get("offset", 0), req["remote"], req["length"])
            out["seconds"] = time.monotonic() - t0
        elif cmd == "register":
            out["rc"] = engine.register_memory(buf.ctypes.data, size)
        elif cmd == "notifies":
            out["notifies"] = [[n.name, n.msg] for n in engine.get_notifies()]
        elif cmd == "exit":
            break
        print(json.dumps(out), flush=True)
    engine.close()


class EnginePeer:
    """Starts the child; `call(cmd, **kw)` sends a command and returns the reply. Kill-safe."""

    def __init__(self, metadata: str, name: str = "127.0.0.1", size: int = 64 << 20, env: dict | None = None,
                 managed: bool = False, prefix: list[str] | None = None):
        """`prefix` runs the child through a wrapper, e.g. Host.prefix to put it on a netns host."""
        self.proc = popen(
            (prefix or []) + [sys.executable, "-m", "mooncake.testing.engine_peer", name, metadata, str(size),
                              str(int(managed))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})})
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("engine peer failed to start")
        self.info = json.loads(line)
        if "error" in self.info:
            raise RuntimeError(self.info["error"])
        self.segment, self.buffer, self.size = self.info["segment"], self.info["buffer"], self.info["size"]

    def call(self, cmd: str, **kw) -> dict:
        self.send(cmd, **kw)
        return self.reply()

    def send(self, cmd: str, **kw) -> None:
        """Starts a command without waiting for its answer (see reply())."""
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine peer exited with {self.proc.poll()}")
        return json.loads(line)

    def digest(self, offset: int, length: int) -> str:
        return self.call("digest", offset=offset, length=length)["sha256"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, sig: int = signal.SIGSTOP) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                self.kill()


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
