"""Hit-rate simulator: replays request traces through a prefix cache (the paper's Fig. 9 methodology).

Conventions (paper.md §3, "Conventions for reproducing Fig. 9"):

* requests are replayed in file order (merged traces: by timestamp, ids offset into disjoint ranges);
* a request's hit is the longest prefix of its `hash_ids` resident in the cache, counted in tokens, with the last
  block of a request at its partial size; hit ratio = hit tokens / input tokens over all requests;
* after the lookup all of the request's blocks are inserted or touched, head first;
* capacity in blocks = floor(capacity_tokens / block_size).

Local vs global: `instances` > 1 splits the same total capacity over N caches (the first `total % N` get one block
more) and routes each request to one of them: `prefix` sends it to the instance with the longest resident prefix
(ties: fewest input tokens routed so far, then lowest index); `round-robin` and `random` (seeded) are fixed in
advance. The global pool is the single cache of the full capacity (`instances` = 1).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .cache import POLICIES, make_cache
from .common import (Progress, ToolError, format_table, human_count, parse_count, parse_count_list,
                     split_choices)
from .plotting import check_plot_target, new_figure, save_figure
from .trace import Trace, add_trace_arguments, check_merge_args, load_trace_args

ROUTINGS = ("prefix", "round-robin", "random")
# P Fig. 9's capacity axis (tokens); the default sweep.
PAPER_CAPACITIES = (10**4, 10**5, 10**6, 2 * 10**6, 4 * 10**6, 5 * 10**6, 8 * 10**6, 10**7, 5 * 10**7, 10**8, 10**9)

ProgressFn = Optional[Callable[[int], None]]


@dataclass(frozen=True)
class HitRateResult:
    """Outcome of one replay. `capacity_tokens`/`capacity_blocks` are None for the unbounded policy;
    `scope` is "global" (one pool) or "local" (`instances` caches, `routing` names the rule)."""

    trace: str
    policy: str
    capacity_tokens: Optional[int]
    capacity_blocks: Optional[int]
    scope: str
    instances: int
    routing: Optional[str]
    requests: int
    input_tokens: int
    hit_tokens: int
    block_refs: int
    hit_blocks: int

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def block_hit_ratio(self) -> float:
        return self.hit_blocks / self.block_refs if self.block_refs else 0.0

    def to_json(self) -> dict:
        """Stable JSON object: every field above plus `hit_ratio` and `block_hit_ratio`."""
        out = dict(self.__dict__)
        out["hit_ratio"] = self.hit_ratio
        out["block_hit_ratio"] = self.block_hit_ratio
        return out


def capacity_blocks_for(capacity_tokens: int, block_size: int) -> int:
    """floor(capacity_tokens / block_size); raises ToolError when that is zero."""
    blocks = capacity_tokens // block_size
    if blocks < 1:
        raise ToolError(f"capacity {capacity_tokens} tokens is less than one {block_size}-token block")
    return blocks


def _split_capacity(total_blocks: Optional[int], instances: int) -> list[Optional[int]]:
    if total_blocks is None:
        return [None] * instances
    if total_blocks < instances:
        raise ToolError(f"capacity of {total_blocks} blocks cannot be split over {instances} instances")
    base, extra = divmod(total_blocks, instances)
    return [base + (1 if i < extra else 0) for i in range(instances)]


def _check_belady_routing(policy: str, instances: int, routing: str) -> None:
    """Belady needs each cache's future request sequence, which the dynamic `prefix` routing does not fix."""
    if policy == "belady" and instances > 1 and routing == "prefix":
        raise ToolError("belady cannot be combined with the dynamic 'prefix' routing; "
                        "use --routing round-robin or random")


def _static_routes(n_requests: int, instances: int, routing: str, seed: int) -> list[int]:
    if routing == "round-robin":
        return [i % instances for i in range(n_requests)]
    rng = random.Random(seed)
    return [rng.randrange(instances) for _ in range(n_requests)]


def simulate(trace: Trace, policy: str, capacity_blocks: Optional[int] = None, *, instances: int = 1,
             routing: str = "prefix", seed: int = 0, capacity_tokens: Optional[int] = None,
             progress: ProgressFn = None) -> HitRateResult:
    """Replays `trace` through `instances` caches of `policy` sharing `capacity_blocks` in total.

    Args:
      trace: the requests, in replay order.
      policy: one of cache.POLICIES.
      capacity_blocks: total capacity (>= instances); ignored (None) for `unbounded`.
      instances: 1 = one global pool; N > 1 = N local caches and a routing rule.
      routing: one of ROUTINGS (used when instances > 1).
      seed: seed of the `random` routing.
      capacity_tokens: reported capacity (defaults to capacity_blocks * block size).
      progress: called with the number of requests done, now and then.

    Returns:
      HitRateResult with token and block hit counts.

    Raises:
      ToolError: unknown policy or routing, missing/too small capacity, or belady with the dynamic `prefix` routing
        (its per-instance future depends on the cache states).
    """
    if policy not in POLICIES:
        raise ToolError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
    if routing not in ROUTINGS:
        raise ToolError(f"unknown routing {routing!r} (choose from {', '.join(ROUTINGS)})")
    if instances < 1:
        raise ToolError(f"instances must be >= 1, got {instances}")
    if policy == "unbounded":
        capacity_blocks = capacity_tokens = None
    elif capacity_blocks is None or capacity_blocks < 1:
        raise ToolError(f"policy {policy} needs a capacity of at least one block")
    elif capacity_tokens is None:
        capacity_tokens = capacity_blocks * trace.block_size
    _check_belady_routing(policy, instances, routing)
    shares = _split_capacity(capacity_blocks, instances)
    requests = trace.hash_ids
    n = len(requests)
    if instances == 1 or routing != "prefix":
        routes = [0] * n if instances == 1 else _static_routes(n, instances, routing, seed)
        per_instance = [[i for i in range(n) if routes[i] == k] for k in range(instances)]
        caches = [make_cache(policy, shares[k], future=[requests[i] for i in per_instance[k]])
                  for k in range(instances)]
        local_index = [0] * n
        for idxs in per_instance:
            for j, i in enumerate(idxs):
                local_index[i] = j
    else:
        caches = [make_cache(policy, shares[k]) for k in range(instances)]
        routes, local_index = None, None
    routed_tokens = [0] * instances
    hit_tokens = hit_blocks = refs = 0
    for i, ids in enumerate(requests):
        if routes is None:
            best, best_len = 0, -1
            for k, c in enumerate(caches):
                m = c.prefix_len(ids)
                if m > best_len or (m == best_len and routed_tokens[k] < routed_tokens[best]):
                    best, best_len = k, m
            cache, k_hit, where = caches[best], best_len, 0
        else:
            best = routes[i]
            cache = caches[best]
            k_hit = cache.prefix_len(ids)
            where = local_index[i]
        routed_tokens[best] += trace.input_lengths[i]
        hit_blocks += k_hit
        hit_tokens += trace.block_tokens(i, k_hit)
        refs += len(ids)
        cache.access(ids, where)
        if progress is not None and i % 2048 == 0:
            progress(i)
    return HitRateResult(
        trace=trace.name, policy=policy, capacity_tokens=capacity_tokens, capacity_blocks=capacity_blocks,
        scope="global" if instances == 1 else "local", instances=instances,
        routing=None if instances == 1 else routing, requests=n, input_tokens=sum(trace.input_lengths),
        hit_tokens=hit_tokens, block_refs=refs, hit_blocks=hit_blocks)


def plot_hit_ratios(results: Sequence[HitRateResult], path: str) -> None:
    """Draws hit ratio against capacity (log x axis), one curve per trace/policy/scope, like the paper's Fig. 9.
    Unbounded results are drawn as dashed horizontal lines."""
    fig, ax = new_figure()
    curves: dict[tuple, list[HitRateResult]] = {}
    for r in results:
        curves.setdefault((r.trace, r.policy, r.scope, r.instances), []).append(r)
    for (trace, policy, scope, instances), rs in curves.items():
        label = f"{trace} {policy}" + (f" local x{instances}" if scope == "local" else "")
        if policy == "unbounded":
            ax.axhline(rs[0].hit_ratio, linestyle="--", linewidth=1, label=label)
            continue
        rs = sorted(rs, key=lambda r: r.capacity_tokens)
        ax.plot([r.capacity_tokens for r in rs], [r.hit_ratio for r in rs], marker="o", markersize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel("hit ratio (fraction of input tokens)")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)


# ---- command line -------------------------------------------------------------------------------------------------

def register(subparsers) -> None:
    p = subparsers.add_parser(
        "hitrate", help="prefix-cache hit ratio of traces per eviction policy and capacity (paper Fig. 9)",
        description="Replays request traces through a prefix cache and reports the hit ratio (fraction of input "
                    "tokens reused) per trace, policy and capacity, with the paper's Fig. 9 conventions.",
        epilog="example: mooncake hitrate --trace synthetic --policy lru,belady --capacity-tokens 1e5,1e6,1e7 "
               "--plot fig9.png")
    add_trace_arguments(p, merge_help="also replay all traces merged by timestamp (block ids offset to disjoint "
                                      "ranges)")
    p.add_argument("--policy", default="lru",
                   help=f"one or a comma list of: {', '.join(POLICIES)} (default lru)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--capacity-tokens", metavar="LIST",
                     help="comma list of total capacities in tokens, e.g. 1e4,1e5,1e6 (default: the paper's "
                          "Fig. 9 axis, 1e4 ... 1e9)")
    cap.add_argument("--capacity-blocks", metavar="LIST", help="comma list of total capacities in blocks")
    p.add_argument("--instances", metavar="N", default="1",
                   help="N > 1: also split each capacity over N local caches (reported as scope=local) next to "
                        "the global pool (default 1)")
    p.add_argument("--routing", default="prefix", choices=ROUTINGS,
                   help="routing of requests to local caches (default prefix: longest resident prefix)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random routing (default 0)")
    p.add_argument("--plot", metavar="FILE", help="draw hit ratio against capacity to FILE (.png, .svg, .pdf)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def _capacities(args, block_size: int) -> list[tuple[int, int]]:
    """(capacity_tokens, capacity_blocks) pairs from the options."""
    if args.capacity_blocks is not None:
        return [(b * block_size, b) for b in parse_count_list(args.capacity_blocks, "--capacity-blocks")]
    tokens = (parse_count_list(args.capacity_tokens, "--capacity-tokens") if args.capacity_tokens is not None
              else list(PAPER_CAPACITIES))
    return [(t, capacity_blocks_for(t, block_size)) for t in tokens]


def run(args: argparse.Namespace) -> int:
    """Executes `mooncake hitrate`: a table (default) or a JSON list of HitRateResult.to_json() objects."""
    policies = split_choices(args.policy, POLICIES, "--policy")
    instances = parse_count(args.instances, "--instances")
    capacities = _capacities(args, parse_count(args.block_size, "--block-size"))  # checked before loading traces
    for policy in policies:
        _check_belady_routing(policy, instances, args.routing)
    check_merge_args(args)
    if instances > 1 and any(p != "unbounded" for p in policies):
        for _, blocks in capacities:
            _split_capacity(blocks, instances)
    if args.plot:
        check_plot_target(args.plot)
    traces = load_trace_args(args)
    jobs = []
    for t in traces:
        for policy in policies:
            for tokens, blocks in ([(None, None)] if policy == "unbounded" else capacities):
                for n in ([1, instances] if instances > 1 else [1]):
                    jobs.append((t, policy, tokens, blocks, n))
    results = []
    for t, policy, tokens, blocks, n in jobs:
        label = f"[hitrate {len(results) + 1}/{len(jobs)}] {t.name} {policy} {human_count(tokens)}" + (
            f" local x{n}" if n > 1 else "")
        bar = Progress(label, len(t), enabled=not args.quiet)
        results.append(simulate(t, policy, blocks, instances=n, routing=args.routing, seed=args.seed,
                                capacity_tokens=tokens, progress=bar.update))
        bar.finish()
    if args.plot:
        plot_hit_ratios(results, args.plot)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
        return 0
    print(format_table(
        ["trace", "policy", "scope", "capacity (tokens)", "blocks", "hit ratio", "block hit ratio"],
        [[r.trace, r.policy, r.scope if r.scope == "global" else f"local x{r.instances} ({r.routing})",
          human_count(r.capacity_tokens), "inf" if r.capacity_blocks is None else r.capacity_blocks,
          f"{r.hit_ratio:.4f}", f"{r.block_hit_ratio:.4f}"] for r in results]))
    return 0
