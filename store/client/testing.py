"""``StoreWorker``: a store client process (store_worker.py) for multi-process tests and the benchmark.
Waits are bounded (``timeout``); ``stop`` exits it cleanly, then terminates / kills it. ``local_store``: a
store client in the test's own process. ``SoakWorker``: a process running soak_worker.py's timed load.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys

from mooncake.store.client.store_worker import decode, encode
from mooncake.store.master.testing import child_env, read_line, stop_process
from mooncake.testing.children import popen


@contextlib.contextmanager
def local_store(master: str, segment: str = "32MB", buffer: str = "8MB", protocol: str = "tcp", device: str = ""):
    """A MooncakeDistributedStore of this process set up against `master` with the transfer engine's
    `protocol` and `device` names; emptied and closed afterwards."""
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", segment, buffer, protocol, device, master) == 0
    try:
        yield s
    finally:
        s.remove_all(force=True)
        s.close()


class StoreWorker:
    def __init__(self, master: str, segment: str = "64MB", buffer: str = "16MB", timeout: float = 60.0,
                 env: dict | None = None, ssd: str = "", metadata: str = "P2PHANDSHAKE", protocol: str = "tcp",
                 device: str = "", prefix: list[str] | None = None) -> None:
        """`protocol` / `device`: the worker's transfer engine protocol and device names; `prefix`: a command
        the worker runs under (e.g. ``["unshare", "--pid", "--fork"]``: another "host" for the engine)."""
        cmd = [*(prefix or []), sys.executable, "-m", "mooncake.store.client.store_worker", "--master", master,
               "--segment", str(segment), "--buffer", str(buffer), "--ssd", str(ssd), "--metadata", metadata,
               "--protocol", protocol, "--device", device]
        self.proc = popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**child_env(), **(env or {})})
        try:
            hello = json.loads(read_line(self.proc, timeout))
        except (TimeoutError, RuntimeError, ValueError):
            stop_process(self.proc, 2)
            raise
        if hello.get("code") != 0:
            stop_process(self.proc, 2)
            raise RuntimeError(f"store worker setup failed: {hello}")
        self.hostname = hello["hostname"]

    def request(self, req: dict, timeout: float = 60.0) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        out = json.loads(read_line(self.proc, timeout))
        if not out.get("ok"):
            raise RuntimeError(out.get("error"), out.get("trace"))
        return out

    def call(self, method: str, *args, timeout: float = 60.0, **kwargs):
        """store.<method>(*args, **kwargs) in the worker; bytes and ReplicateConfig (as a dict) travel."""
        out = self.request({"op": "call", "m": method, "a": encode(list(args)),
                            "kw": {k: encode(v) for k, v in kwargs.items()}}, timeout)
        return decode(out["r"])

    def kill(self) -> None:
        """SIGKILL: no close, no unmount, unfinished puts stay unfinished."""
        self.proc.kill()
        self.proc.wait(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        stop_process(self.proc, 3)


class SoakWorker:
    """soak_worker.py in a child process: ``SoakWorker(master, seconds, seed, **flags)`` waits for its ready
    line (``ready`` is its dict: ``ready["ready"]`` False when every setup attempt failed); ``result`` waits
    for the summary. Flags are soak_worker's (hostname=, metadata=, segment=, ...). ``kill``: SIGKILL;
    ``pause`` / ``resume``: SIGSTOP / SIGCONT. ``returncode`` is the child's (negative: the signal that
    ended it, e.g. -11 for SIGSEGV)."""

    def __init__(self, master: str, seconds: float, seed: int, timeout: float = 60.0, env: dict | None = None,
                 **flags) -> None:
        cmd = [sys.executable, "-m", "mooncake.store.client.soak_worker", "--master", master,
               "--seconds", str(seconds), "--seed", str(seed)]
        for k, v in flags.items():
            cmd += [f"--{k}", str(v)]
        self.proc = popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                     env={**child_env(), **(env or {})})
        try:
            self.ready = json.loads(read_line(self.proc, timeout))
        except (TimeoutError, RuntimeError, ValueError):
            stop_process(self.proc, 2)
            raise

    def result(self, timeout: float) -> dict:
        """The summary line (see soak_worker.py); TimeoutError / RuntimeError when it does not come."""
        return json.loads(read_line(self.proc, timeout))

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> int:
        self.proc.kill()
        return self.proc.wait(5)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()
        stop_process(self.proc, 3)
