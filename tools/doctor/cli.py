"""`mooncake doctor`: runs every check family for one configuration and prints the verdict.

Exit status: 0 ready (no check failed), 1 will not work (each failing line says what to do), 2 bad arguments.
Output: a table for people, or with --json one object {"ready", "summary", "config", "findings": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from . import fabric, gpu, kernel, memory, plugins, rdma, services
from .report import FAIL, Config, Finding, Host, worst

FAMILIES = (rdma, memory, gpu, fabric, kernel, services, plugins)
# Mooncake's protocol names plus those of this engine's transports (shm, cxl, file, nvmeof).
PROTOCOLS = ("tcp", "rdma", "efa", "cxl", "shm", "file", "nvmeof", "nvlink", "nvlink_intra", "hip", "musa",
             "ascend", "barex", "cxi", "ub", "ubshmem", "nccl", "maca")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


class ArgumentError(ValueError):
    """A bad option value: exit status 2."""


def parse_size(text: str) -> int:
    """'16MB', '1GiB', '4096' -> bytes (units are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ArgumentError(f"--segment-size: bad size {text!r} (a number with an optional unit KB/MB/GB/TB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_config(args: argparse.Namespace) -> Config:
    protocol = args.protocol.lower()
    if protocol not in PROTOCOLS:
        raise ArgumentError(f"--protocol: unknown protocol {args.protocol!r} (one of {', '.join(PROTOCOLS)})")
    if args.master:
        try:
            services.split_host_port(args.master, "--master")
        except ValueError as e:
            raise ArgumentError(str(e)) from None
    if args.timeout <= 0:
        raise ArgumentError("--timeout must be positive")
    try:
        lo = int(os.environ.get("MC_MIN_RPC_PORT", 15000))
        hi = int(os.environ.get("MC_MAX_RPC_PORT", 17000))
    except ValueError:
        raise ArgumentError("MC_MIN_RPC_PORT/MC_MAX_RPC_PORT must be integers") from None
    if not 0 < lo <= hi < 65536:
        raise ArgumentError(f"MC_MIN_RPC_PORT..MC_MAX_RPC_PORT must be a port range, got {lo}..{hi}")
    return Config(protocol=protocol, device_names=tuple(d for d in args.device_name.split(",") if d.strip()),
                  segment_size=parse_size(args.segment_size), metadata_server=args.metadata_server,
                  master=args.master, rpc_port_range=(lo, hi), timeout=args.timeout)


def run_checks(host: Host, cfg: Config, plugin_states=None) -> list[Finding]:
    """Every family's findings, in FAMILIES order. `plugin_states` replaces TransferEngine.plugins() (tests)."""
    findings: list[Finding] = []
    for family in FAMILIES:
        if family is plugins:
            findings += plugins.check(host, cfg, plugin_states)
        else:
            findings += family.check(host, cfg)
    return findings


def summary(findings: list[Finding], states) -> str:
    """One plain line: 'no RDMA, no GPU, tcp and shm ready' (or what is there). The rdma and gpu families
    report an item "devices" only when there is no device."""
    def none_of(family: str) -> bool:
        return any(f.family == family and f.item == "devices" for f in findings)

    usable = sum(1 for f in findings if f.family == "rdma" and " port " in f.item and f.state == "ok")
    gpus = sum(1 for f in findings if f.family == "gpu" and f.data and "pci" in f.data)
    parts = ["no RDMA" if none_of("rdma") else f"RDMA: {usable} usable port(s)",
             "no GPU" if none_of("gpu") else f"{gpus} GPU(s)"]
    ready = sorted(plugins.ready_transports(states), key=lambda n: (n != "tcp", n))
    if ready:
        parts.append((", ".join(ready[:-1]) + " and " + ready[-1] if len(ready) > 1 else ready[0]) + " ready")
    else:
        parts.append("no transport ready")
    return ", ".join(parts)


def render_table(findings: list[Finding], verdict: str, line: str) -> str:
    from mooncake.tools.common import format_table

    rows = [(f.family, f.item, f.state.upper(), f.detail) for f in findings]
    out = [format_table(("CHECK", "ITEM", "STATE", "DETAIL"), rows), ""]
    todo = [f for f in findings if f.fix and f.state in ("warn", "fail")]
    if todo:
        out.append("What to do:")
        out += [f"  [{f.state.upper()}] {f.family}/{f.item}: {f.fix}" for f in todo]
        out.append("")
    out.append(f"{verdict}: {line}")
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        cfg = parse_config(args)
    except ArgumentError as e:
        print(f"mooncake doctor: error: {e}", file=sys.stderr)
        return 2
    host = Host(args.root)
    states = plugins.plugin_states()
    findings = run_checks(host, cfg, states)
    ready = worst(findings) != FAIL
    line = summary(findings, states)
    verdict = "READY" if ready else "WILL NOT WORK"
    if args.json:
        print(json.dumps({"ready": ready, "summary": line, "config": {
            "protocol": cfg.protocol, "device_name": list(cfg.device_names), "segment_size": cfg.segment_size,
            "metadata_server": cfg.metadata_server, "master": cfg.master,
            "rpc_port_range": list(cfg.rpc_port_range)}, "findings": [f.as_dict() for f in findings]}, indent=1))
    else:
        sys.stdout.write(render_table(findings, verdict, line))
    return 0 if ready else 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "doctor", help="preflight this host for a configuration (RDMA, memlock, GPUs, ports, services, plugins)",
        description="Checks whether this host can run Mooncake with the given configuration. Exit status: "
                    "0 ready, 1 will not work (each failing check says what to do), 2 bad arguments.",
        epilog="example: mooncake doctor --protocol rdma --device-name mlx5_0 --segment-size 4GB "
               "--master 10.0.0.1:50051")
    p.add_argument("--protocol", default="tcp", help="transport protocol to check (default tcp)")
    p.add_argument("--device-name", default="", help="comma-separated RDMA device allow-list ('' = all)")
    p.add_argument("--segment-size", default="16MB", help="bytes this process registers (segment + buffers)")
    p.add_argument("--metadata-server", default="P2PHANDSHAKE",
                   help="P2PHANDSHAKE, http://host:port/metadata, etcd://host:port or redis://host:port")
    p.add_argument("--master", default="", help="store master host:port to check (default: not checked)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds for each network probe (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--root", default="/", help=argparse.SUPPRESS)  # a fake /sys,/proc,/dev tree (tests)
    p.set_defaults(func=run)
