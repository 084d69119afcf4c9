"""Real etcd and Redis servers for tests: started on free loopback ports in a temporary directory, stopped
(and cleaned up) by close(). Each waits until the server answers before returning."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

from mooncake.testing.children import popen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(check, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not become ready within {timeout} s")


class _Service:
    def __init__(self, cmd: list[str], cwd: str):
        self.dir = cwd
        self.proc = popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Etcd(_Service):
    """etcd 3.x (Debian's etcd-server) with its v3 JSON gateway on `endpoint`."""

    def __init__(self):
        self.port, peer = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        d = tempfile.mkdtemp(prefix="mc-etcd-")
        super().__init__([
            shutil.which("etcd") or "/usr/bin/etcd", "--name", "test", "--data-dir", os.path.join(d, "data"),
            "--listen-client-urls", f"http://{self.endpoint}", "--advertise-client-urls", f"http://{self.endpoint}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--initial-cluster", f"test=http://127.0.0.1:{peer}",
            "--log-level", "error", "--logger", "zap"], d)
        _wait_for(lambda: self.get("health-probe") is not None or self._healthy(), "etcd")

    def _healthy(self) -> bool:
        out = subprocess.run(["etcdctl", "--endpoints", self.endpoint, "endpoint", "health"],
                             capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
        return out.returncode == 0

    def get(self, key: str) -> str | None:
        out = subprocess.run(["etcdctl", "--endpoints", self.endpoint, "get", "--print-value-only", key],
                             capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
        return out.stdout.rstrip("\n") if out.returncode == 0 and out.stdout else None

    def keys(self, prefix: str = "mooncake/") -> list[str]:
        out = subprocess.run(["etcdctl", "--endpoints", self.endpoint, "get", "--prefix", "--keys-only", prefix],
                             capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
        return [k for k in out.stdout.split("\n") if k]


class Redis(_Service):
    """redis-server (Debian's) on `endpoint`, no persistence."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        d = tempfile.mkdtemp(prefix="mc-redis-")
        super().__init__([shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(self.port),
                          "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d], d)
        _wait_for(lambda: self._cli("PING") == "PONG", "redis")

    def _cli(self, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True)
        return out.stdout.rstrip("\n")

    def get(self, key: str) -> str | None:
        v = self._cli("GET", key)
        return v or None

    def keys(self, prefix: str = "mooncake/") -> list[str]:
        return [k for k in self._cli("KEYS", prefix + "*").split("\n") if k]


class EtcdCluster:
    """A 3-member (or `n`) etcd cluster on loopback ports; ``endpoints`` is "h:p;h:p;h:p". ``kill(i)`` SIGKILLs
    member i (the others keep quorum while a majority lives); ``close`` stops them all."""

    def __init__(self, n: int = 3, timeout: float = 30.0):
        self.dir = tempfile.mkdtemp(prefix="mc-etcd-cluster-")
        ports = [(free_port(), free_port()) for _ in range(n)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
        self.members = []
        self.endpoint_list = [f"127.0.0.1:{client}" for client, _ in ports]
        self.endpoints = ";".join(self.endpoint_list)
        for i, (client, peer) in enumerate(ports):
            cmd = [shutil.which("etcd") or "/usr/bin/etcd", "--name", f"m{i}",
                   "--data-dir", os.path.join(self.dir, f"m{i}"),
                   "--listen-client-urls", f"http://127.0.0.1:{client}",
                   "--advertise-client-urls", f"http://127.0.0.1:{client}",
                   "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                   "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                   "--initial-cluster", initial, "--initial-cluster-state", "new",
                   "--initial-cluster-token", os.path.basename(self.dir),
                   "--heartbeat-interval", "50", "--election-timeout", "500",
                   "--log-level", "error", "--logger", "zap"]
            self.members.append(popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for(self._healthy, "etcd cluster", timeout)

    def _healthy(self) -> bool:
        out = subprocess.run(["etcdctl", "--endpoints", ",".join(self.endpoint_list), "endpoint", "health"],
                             capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
        return out.returncode == 0

    def kill(self, i: int) -> None:
        self.members[i].kill()
        self.members[i].wait()

    def close(self) -> None:
        for p in self.members:  # SIGKILL: the data is thrown away with the directory
            if p.poll() is None:
                p.kill()
        for p in self.members:
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
