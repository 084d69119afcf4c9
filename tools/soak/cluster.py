"""The soak's processes: hosts (network namespaces through mooncake.testing.netns, or this host's loopback),
the master and the workers.

Every child runs this interpreter with this process's sys.path, on a host (``ip netns exec <ns>`` execs the
program, so a child's pid is the program's own and signals reach it). Waits are bounded; ``close`` kills.

Threading: each Proc has one reader thread (its stdout); the runner thread reads Proc state under Proc.lock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

_TC = shutil.which("tc", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])) or "tc"


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Hosts:
    """Two hosts joined by one link (namespaces), or two names for this host's loopback when namespaces
    cannot be made (then no link faults). ``ip(i)``: host i's address; ``prefix(i)``: run a program there."""

    def __init__(self, use_netns: bool = True) -> None:
        self.why_not = "namespaces not requested"
        self.topology = None
        if use_netns:
            try:  # the namespace helper lives in the source tree's test helpers (not in the wheel)
                from mooncake.testing import netns
            except ImportError:
                self.why_not = "mooncake.testing.netns not importable (run from a source checkout)"
            else:
                self.why_not = netns.available()
        if self.why_not is None:
            self.topology = netns.Topology(net=93)
            try:
                a, b = self.topology.host("a"), self.topology.host("b")
                self.link = self.topology.link(a, b)
                self._hosts = [a, b]
            except Exception:
                self.topology.close()
                raise

    @property
    def namespaces(self) -> bool:
        return self.topology is not None

    def ip(self, i: int) -> str:
        return self._hosts[i].ips[0] if self.topology else "127.0.0.1"

    def prefix(self, i: int) -> list[str]:
        return self._hosts[i].prefix if self.topology else []

    def set_link(self, up: bool) -> None:
        self.topology.set_link(self.link, up)

    def slow_link(self, rate_mbit: float | None) -> None:
        """Rate-limits both ends (tc tbf), or removes the limit (None)."""
        for host, nic in ((self.link.a, self.link.a_nic), (self.link.b, self.link.b_nic)):
            if rate_mbit is None:
                subprocess.run([_TC, "-n", host.name, "qdisc", "del", "dev", nic, "root"],
                               capture_output=True)
            else:
                burst = max(32 * 1024, int(rate_mbit * 1e6 / 8 / 1000))
                subprocess.run([_TC, "-n", host.name, "qdisc", "replace", "dev", nic, "root", "tbf", "rate",
                                f"{rate_mbit}mbit", "burst", str(burst), "latency", "100ms"], check=True,
                               capture_output=True)

    def http_get(self, i: int, url: str, timeout: float = 10.0) -> str:
        """GET `url` from host i (inside its namespace)."""
        if not self.topology:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.read().decode()
        code = f"import urllib.request,sys;sys.stdout.write(urllib.request.urlopen({url!r},timeout={timeout})" \
               ".read().decode())"
        out = subprocess.run(self.prefix(i) + [sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout + 10)
        if out.returncode != 0:
            raise OSError(f"GET {url} on host {i}: {out.stderr.strip()[-300:]}")
        return out.stdout

    def close(self) -> None:
        if self.topology:
            self.topology.close()


class Proc:
    """A child process with a JSON-lines stdout (worker.py) read by a thread."""

    def __init__(self, name: str, role: str, cmd: list[str], env: dict) -> None:
        self.name, self.role = name, role
        self.lock = threading.Lock()
        self.ready: dict | None = None
        self.ready_event = threading.Event()
        self.final: dict | None = None
        self.final_event = threading.Event()
        self.ticks = 0
        self.last_line = time.monotonic()
        self.latest: dict = {}  # the last tick's cumulative ops / bytes
        self.new_bad: list = []
        self.new_slow: list = []
        self.pauses: list[list[float]] = []  # [start, end] wall-clock (end: inf while paused)
        self.killed = False
        self.finished = False  # told to exit after its final check
        self.rss_peak = 0
        self.rss_first = 0
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self._stderr: list[str] = []
        threading.Thread(target=self._read, name=f"soak-{name}", daemon=True).start()
        threading.Thread(target=self._drain, name=f"soak-{name}-err", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.last_line = time.monotonic()
                kind = msg.get("type")
                if kind == "ready":
                    self.ready = msg
                    self.ready_event.set()
                elif kind == "tick":
                    self.ticks += 1
                    self.latest = msg
                    self.new_bad += msg["bad"]
                    self.new_slow += msg["slow"]
                elif kind == "final":
                    self.final = msg
                    self.final_event.set()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-50]

    def stderr_tail(self) -> str:
        return "".join(self._stderr[-20:])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, obj: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def wait_ready(self, timeout: float) -> dict:
        if not self.ready_event.wait(timeout):
            raise RuntimeError(f"{self.name} not ready within {timeout} s (rc {self.proc.poll()}): "
                               f"{self.stderr_tail()}")
        return self.ready

    def pause(self) -> None:
        with self.lock:
            self.pauses.append([time.time(), float("inf")])
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        with self.lock:
            if self.pauses and self.pauses[-1][1] == float("inf"):
                self.pauses[-1][1] = time.time()
            self.last_line = time.monotonic()  # its silence while stopped is not a hang

    @property
    def paused(self) -> bool:
        with self.lock:
            return bool(self.pauses) and self.pauses[-1][1] == float("inf")

    def paused_during(self, start: float, end: float) -> float:
        """Seconds of [start, end] this process spent stopped."""
        with self.lock:
            return sum(max(0.0, min(end, e) - max(start, s)) for s, e in self.pauses)

    def kill(self) -> None:
        self.killed = True
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


class Master:
    """``mooncake_master`` on host 0 at fixed ports, restartable (kill + start again on the same ports)."""

    BANNER = re.compile(r"listening on \S+:(\d+)(?: metrics \S+:(\d+))?")

    def __init__(self, hosts: Hosts, flags: list[str]) -> None:
        self.hosts, self.flags = hosts, flags
        self.port, self.metrics_port = _free_port(), _free_port()
        self.address = f"{hosts.ip(0)}:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.rss_peak = 0
        self.rss_first = 0
        self.pauses: list[list[float]] = []
        self.start()

    def start(self, timeout: float = 30.0) -> None:
        cmd = self.hosts.prefix(0) + [sys.executable, "-m", "mooncake.store.master.cli", f"--port={self.port}",
                                      f"--metrics_port={self.metrics_port}", "--rpc_address=0.0.0.0",
                                      "--metrics_host=0.0.0.0", *self.flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=child_env())
        errors: list[str] = []
        proc = self.proc

        def drain() -> None:
            for line in proc.stderr:
                errors.append(line)
                del errors[:-30]
        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            line = self.proc.stdout.readline()
            if self.BANNER.search(line):
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep the pipe drained
                return
        raise RuntimeError(f"master did not start (rc {self.proc.poll()}): {line!r} {''.join(errors)[-1500:]}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def status(self) -> dict:
        return json.loads(self.hosts.http_get(0, f"http://127.0.0.1:{self.metrics_port}/status.json"))

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
