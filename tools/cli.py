"""The `mooncake` command: planning tools for KV-cache pools and scheduling, as subcommands.

    mooncake kvcache-size  KV-cache bytes per token/block/request of a model
    mooncake hitrate       prefix-cache hit ratio of traces per policy and capacity
    mooncake replay        trace-driven simulation of a disaggregated prefill/decode cluster
    mooncake trace-stats   statistics of traces (paper Table 2)
    mooncake doctor        preflight of this host for a configuration (doctor/README.md)
    mooncake soak          chaos soak of engines and store clients (soak/README.md)

Contract: results go to stdout (tables, or JSON with --json), progress and errors to stderr. Exit status 0 on
success, 2 on bad input (unknown option or model, missing or malformed trace, bad value) with a one-line message
and no traceback, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from . import hitrate, kvcache_size, replay, stats
from .common import ToolError
from .doctor import cli as doctor
from .soak import cli as soak

_SUBCOMMANDS = (kvcache_size, hitrate, replay, stats, doctor, soak)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `mooncake` with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="mooncake", description="Mooncake planning tools: KV-cache sizing, hit-rate and cluster simulation.",
        epilog="run `mooncake SUBCOMMAND --help` for the options of each subcommand",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=30))
    subparsers = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    subparsers.required = True
    for module in _SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line `argv` (default: sys.argv[1:]) and returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with status 2 and a usage message on bad options
    try:
        return args.func(args)
    except ToolError as e:
        print(f"mooncake {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mooncake {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `mooncake hitrate ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
