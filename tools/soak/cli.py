"""`mooncake soak --seconds N`: the chaos soak (runner.py); prints the report table (or --json).

Exit status: 0 no violation, 1 violations, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from mooncake.tools.common import ToolError


def run(args: argparse.Namespace) -> int:
    if args.seconds < 20:
        raise ToolError("--seconds must be at least 20 (the last 10 s run without faults)")
    from .runner import run_soak

    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.verbose else None
    report = run_soak(args.seconds, args.seed, not args.no_netns, log)
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        sys.stdout.write(report.table())
    return 1 if report.violations else 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "soak", help="chaos soak: engines and store clients under load while processes and links fail",
        description="Runs engines and store clients on two network-namespace hosts (root) doing verified "
                    "transfers, puts and gets while a chaos loop kills, restarts, pauses processes and flaps "
                    "and slows the link. Exit status 0 when no invariant was violated.",
        epilog="example: sudo mooncake soak --seconds 3600 --seed 7")
    p.add_argument("--seconds", type=float, default=180, help="how long (default 180)")
    p.add_argument("--seed", type=int, default=1, help="seed of the load and the chaos schedule")
    p.add_argument("--no-netns", action="store_true", help="run on loopback (no link faults)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verbose", action="store_true", help="log each fault and violation to stderr")
    p.set_defaults(func=run)
