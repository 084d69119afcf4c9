"""Trace statistics (`mooncake trace-stats`), comparable with the paper's Table 2.

The cache ratio is the hit ratio of an unbounded prefix cache (hitrate conventions), in tokens and in blocks.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from .common import format_table
from .hitrate import simulate
from .trace import Trace, add_trace_arguments, load_trace_args


@dataclass(frozen=True)
class TraceStats:
    """Summary of one trace; `to_json` gives the stable `--json` object."""

    trace: str
    requests: int
    duration_s: float
    arrival_rate: float
    mean_input_tokens: float
    mean_output_tokens: float
    block_refs: int
    unique_blocks: int
    cache_ratio: float
    block_cache_ratio: float

    def to_json(self) -> dict:
        return dict(self.__dict__)


def trace_stats(trace: Trace) -> TraceStats:
    """Computes TraceStats (one unbounded-cache replay)."""
    unbounded = simulate(trace, "unbounded")
    n = len(trace)
    duration = (max(trace.timestamps_ms) - min(trace.timestamps_ms)) / 1000.0
    return TraceStats(
        trace=trace.name, requests=n, duration_s=duration, arrival_rate=n / duration if duration > 0 else 0.0,
        mean_input_tokens=unbounded.input_tokens / n, mean_output_tokens=sum(trace.output_lengths) / n,
        block_refs=unbounded.block_refs, unique_blocks=len({b for ids in trace.hash_ids for b in ids}),
        cache_ratio=unbounded.hit_ratio, block_cache_ratio=unbounded.block_hit_ratio)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "trace-stats", help="request counts, lengths, arrival rate and cache ratio of traces (paper Table 2)",
        description="Statistics of request traces: requests, duration, mean input/output tokens, block references, "
                    "unique blocks, and the cache ratio (unbounded prefix-cache hit ratio).",
        epilog="example: mooncake trace-stats --trace conversation --trace synthetic --merge")
    add_trace_arguments(p, merge_help="also report all traces merged (disjoint block ids)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    traces = load_trace_args(args)
    stats = [trace_stats(t) for t in traces]
    if args.json:
        print(json.dumps([s.to_json() for s in stats], indent=2))
        return 0
    print(format_table(
        ["trace", "requests", "duration s", "req/s", "mean input", "mean output", "blocks", "unique",
         "cache ratio", "block ratio"],
        [[s.trace, s.requests, f"{s.duration_s:.0f}", f"{s.arrival_rate:.2f}", f"{s.mean_input_tokens:.0f}",
          f"{s.mean_output_tokens:.0f}", s.block_refs, s.unique_blocks, f"{s.cache_ratio:.4f}",
          f"{s.block_cache_ratio:.4f}"] for s in stats]))
    return 0
