"""Network services: free ports in the RPC range, and whether the metadata server and the master answer.

Probes run only on the real host (never against a fake tree) and each takes at most ``cfg.timeout`` seconds.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from .report import FAIL, OK, SKIP, WARN, Config, Finding, Host

_LISTEN = "0A"


def listening_ports(host: Host) -> set[int]:
    """TCP ports in LISTEN state (any address) from /proc/net/tcp and /proc/net/tcp6."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (host.read(table) or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) > 3 and cols[3] == _LISTEN:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def rpc_ports(host: Host, cfg: Config) -> Finding:
    lo, hi = cfg.rpc_port_range
    busy = sorted(p for p in listening_ports(host) if lo <= p <= hi)
    total = hi - lo + 1
    free = total - len(busy)
    data = {"range": [lo, hi], "free": free, "listening": busy[:50]}
    detail = f"{free} of {total} free in {lo}-{hi} (MC_MIN_RPC_PORT/MC_MAX_RPC_PORT)"
    if free <= 0:
        return Finding("network", "rpc ports", FAIL, detail, "widen MC_MIN_RPC_PORT..MC_MAX_RPC_PORT", data)
    if free < 16:
        return Finding("network", "rpc ports", WARN, detail, "widen MC_MIN_RPC_PORT..MC_MAX_RPC_PORT", data)
    return Finding("network", "rpc ports", OK, detail, data=data)


def split_host_port(text: str, what: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); ValueError with `what` in the message."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be host:port, got {text!r}")
    return host, int(port)


def _connect(addr: tuple[str, int], timeout: float) -> str | None:
    """None when a TCP connection opens, else the error."""
    try:
        with socket.create_connection(addr, timeout=timeout):
            return None
    except OSError as e:
        return str(e) or type(e).__name__


def _redis_ping(addr: tuple[str, int], timeout: float) -> str:
    with socket.create_connection(addr, timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(b"PING\r\n")
        return s.recv(64).decode(errors="replace").strip()


def metadata(cfg: Config) -> Finding:
    url = cfg.metadata_server
    if url.upper() == "P2PHANDSHAKE":
        return Finding("network", "metadata server", SKIP, "P2PHANDSHAKE: no metadata server needed")
    fix = f"start the metadata server at {url} or fix --metadata-server"
    try:
        if url.startswith("http://") or url.startswith("https://"):
            try:
                with urllib.request.urlopen(url.split("?")[0], timeout=cfg.timeout) as r:
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code  # any HTTP answer (404 for a missing key) means it answers
            return Finding("network", "metadata server", OK, f"{url} answers (HTTP {code})")
        if url.startswith("etcd://"):
            first = url[len("etcd://"):].split(";")[0].split(",")[0]
            host, port = split_host_port(first, "etcd address")
            with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=cfg.timeout) as r:
                return Finding("network", "metadata server", OK, f"etcd {host}:{port} health: {r.read()[:80]!r}")
        if url.startswith("redis://"):
            host, port = split_host_port(url[len("redis://"):].split("/")[0], "redis address")
            reply = _redis_ping((host, port), cfg.timeout)
            state = OK if reply.startswith(("+PONG", "-NOAUTH")) else WARN
            return Finding("network", "metadata server", state, f"redis {host}:{port} answered {reply!r}",
                           fix if state != OK else "")
    except (OSError, ValueError) as e:
        return Finding("network", "metadata server", FAIL, f"{url} does not answer: {e}", fix)
    return Finding("network", "metadata server", FAIL, f"unknown metadata server {url!r}",
                   "use P2PHANDSHAKE, http://host:port/metadata, etcd://host:port or redis://host:port")


def master(cfg: Config) -> Finding:
    if not cfg.master:
        return Finding("network", "master", SKIP, "not checked (pass --master host:port)")
    addr = split_host_port(cfg.master, "--master")
    fix = f"start mooncake_master on {cfg.master} (its --port) or fix --master"
    err = _connect(addr, cfg.timeout)
    if err is not None:
        return Finding("network", "master", FAIL, f"{cfg.master}: {err}", fix)
    try:
        from mooncake.store.common.master_client import MasterClient
    except ImportError:
        return Finding("network", "master", OK, f"{cfg.master} accepts connections (gRPC not checked: no "
                       "grpc module)")
    client = MasterClient(cfg.master, timeout=cfg.timeout)
    try:
        client.wait_ready(timeout=cfg.timeout)
        info = client.call("GetServiceInfo", timeout=cfg.timeout)
        return Finding("network", "master", OK, f"{cfg.master} answers (view {info.view_version}, client TTL "
                       f"{info.client_ttl_sec} s)", data={"view_version": info.view_version})
    except Exception as e:  # noqa: BLE001  (grpc raises several types; any means it did not answer)
        return Finding("network", "master", FAIL, f"{cfg.master} accepts connections but no gRPC answer: "
                       f"{type(e).__name__}", fix)
    finally:
        client.close()


def check(host: Host, cfg: Config) -> list[Finding]:
    findings = [rpc_ports(host, cfg)]
    if host.is_real:
        findings += [metadata(cfg), master(cfg)]
    return findings
