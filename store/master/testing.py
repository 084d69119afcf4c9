"""Process helpers shared by the multi-process tests and the benchmark: a master subprocess (the real CLI)
and client subprocesses (rpc_worker). Children get this interpreter and its sys.path, so they import the
same code in the source tree, a Bazel runfiles tree or an installed wheel.

Every helper bounds its waits (``timeout``) and cleans up: ``stop`` terminates, then kills after a grace.
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import subprocess
import sys
import threading
import time

from mooncake.testing.children import popen


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One stdout line of `proc`, or TimeoutError / RuntimeError (the child exited)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no output from pid {proc.pid} within {timeout} s")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if ready:
            line = proc.stdout.readline()
            if line:
                return line
            raise RuntimeError(f"pid {proc.pid} exited (rc={proc.wait(5)}) before answering")


def stop_process(proc: subprocess.Popen, grace: float) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(5)


class MasterProcess:
    """``python -m mooncake.store.master.cli --port=0 --metrics_port=0 <args>``; parses the bound ports.

    Its stderr is drained by a thread once it is up (a master that logs a lot must never block on a full
    pipe); ``stderr_tail()`` returns the last lines."""

    def __init__(self, *args: str, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "mooncake.store.master.cli", "--port=0", "--metrics_port=0",
               "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1", "--log_level=WARNING", *args]
        self.proc = popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=child_env())
        try:
            line = read_line(self.proc, timeout)
        except (TimeoutError, RuntimeError) as e:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            stop_process(self.proc, 2)
            raise RuntimeError(f"master did not start: {e}\n{err}") from None
        m = re.search(r"listening on \S+:(\d+)(?: metrics \S+:(\d+))?", line)
        if not m:
            stop_process(self.proc, 2)
            raise RuntimeError(f"unexpected master banner: {line!r}")
        self.port = int(m.group(1))
        self.metrics_port = int(m.group(2) or 0)
        self.address = f"127.0.0.1:{self.port}"
        self.banner = line
        self._stderr = collections.deque(maxlen=200)
        self._drain = threading.Thread(target=self._drain_stderr, name="master-stderr", daemon=True)
        self._drain.start()

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self._stderr.append(line)

    def stderr_tail(self) -> str:
        return "".join(self._stderr)

    def stop(self, grace: float = 5.0) -> int:
        """Terminates the master (killed after `grace`) and joins its stderr drain (it ends at the pipe's EOF)."""
        rc = stop_process(self.proc, grace)
        self._drain.join(5)
        return rc

    def kill(self) -> int:
        self.proc.kill()
        rc = self.proc.wait(5)
        self._drain.join(5)
        return rc


class WorkerProcess:
    """A client process (rpc_worker) driven request by request."""

    def __init__(self, master: str, client_id: str | None = None, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "mooncake.store.master.rpc_worker", "--master", master]
        if client_id:
            cmd += ["--client_id", client_id]
        self.proc = popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
        try:
            hello = json.loads(read_line(self.proc, timeout))
        except (TimeoutError, RuntimeError, ValueError):
            stop_process(self.proc, 2)
            raise
        self.client_id = hello["client_id"]

    def request(self, req: dict, timeout: float = 60.0) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(read_line(self.proc, timeout))

    def call(self, method: str, timeout: float = 60.0, **fields) -> dict:
        """The reply dict of one RPC; raises RuntimeError when the RPC itself failed."""
        out = self.request({"op": "call", "method": method, "fields": fields}, timeout)
        if not out.get("ok"):
            raise RuntimeError(out.get("error"))
        return out["reply"]

    def send(self, req: dict) -> None:
        """Writes a request without waiting (collect the answer later with ``receive``)."""
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 60.0) -> dict:
        return json.loads(read_line(self.proc, timeout))

    def kill(self) -> None:
        """SIGKILL: the client dies without unmounting or finishing its puts."""
        self.proc.kill()
        self.proc.wait(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request({"op": "exit"}, timeout=5)
            except (OSError, TimeoutError, RuntimeError, ValueError):
                pass
        stop_process(self.proc, 3)


def process_starter():
    """Generator behind the `procs`/`cluster` pytest fixtures: yields start(kind, *args, **kw), which starts a
    process harness (MasterProcess, WorkerProcess, StoreWorker ...) and stops every one started, newest first."""
    started = []

    def start(kind, *args, **kw):
        p = kind(*args, **kw)
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop()


def serve_json_lines(handle, ready: dict) -> None:
    """The worker side of the harnesses above: prints `ready`, then answers each JSON request line on stdin
    with handle(request) (a failure is reported, not fatal) until {"op": "exit"} or end of input."""
    import traceback

    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req.get("op") == "exit":
                print(json.dumps({"ok": True}), flush=True)
                break
            out = handle(req)
        except Exception as e:  # report and keep serving: the driver decides what a failure means
            out = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        print(json.dumps(out), flush=True)
