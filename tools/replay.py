"""Trace-driven discrete-event simulation of a disaggregated (prefill/decode) cluster (`mooncake replay`).

Model (all times in seconds; every choice below is a documented simplification):

* Arrivals: request i arrives at timestamp_ms / 1000 / speed; several traces are merged by timestamp.
* Prefill instances: one FIFO queue each, one request at a time. Each keeps a local LRU prefix cache of
  `node_cache_tokens` (floor(tokens / block size) blocks) in its DRAM; together they form the global KV pool.
  Prefill time of a request of n tokens whose first p tokens are cached: T(n) - T(p), with
  T(x) = a x + b x^2 (default: the paper's Fig. 14 fit, a = 1.13e-4, b = 7.39e-10), with p <= n - 1 (the last
  token is always computed). That is T(n) for an uncached
  prompt, and for a cached prefix the cost of the suffix, whose attention still spans the prefix (at 95 % prefix
  on 128k tokens this gives 1.98 s against the paper's 2.33 s, which includes the cache load). Loading the local
  prefix is overlapped layer by layer and costs nothing extra.
* Scheduling (the Conductor, paper Algorithm 1), at arrival:
  `random` picks a prefill instance uniformly; `load-balance` the one with the shortest queue (ties: fewest
  requests so far); `local-cache-aware` the smallest estimated TTFT = queue time + prefill time after the local
  prefix match; `global-cache-aware` also considers fetching the longest prefix held anywhere in the pool: an
  instance whose own match is shorter than best / `balance_threshold` fetches the missing blocks from the best
  holder, adding transfer time = tokens * bytes_per_token / bandwidth; fetched blocks stay on the instance (hot
  blocks get replicated as a side effect). Queue times are exact here (service times are fixed at scheduling).
  Cache lookups happen at scheduling (the matched blocks are touched then); the request's blocks are inserted
  into the instance's cache when its prefill ends.
* Decode instances: continuous batching with at most `decode_batch` requests and `decode_kv_tokens` of reserved
  KV (input + output tokens per request; a request larger than that runs alone). A decode step takes
  `decode_step_s + decode_ctx_s * (context tokens in the batch)` (default fit to Fig. 14: 26.2 ms + 35 ns per
  token). Steps are simulated as a fluid between batch changes, at the step time of the segment's start. The
  decode instance is chosen at arrival: the one with the smallest predicted step time once the requests already
  assigned to it have joined, preferring instances where the request would not have to wait for room.
  The prompt's KV streams to it layer by layer during prefill: it joins at max(prefill end, prefill start +
  n * bytes_per_token / bandwidth), or waits in FIFO order for room.
* Tokens: the first token comes at the end of prefill (TTFT = that time - arrival); tokens 2..output_length
  come one per decode step. A request's TBT is the mean of its longest 10 % inter-token gaps (paper §5.1); the first
  gap includes the wait for the KV transfer and for a batch slot.
* Early rejection (optional): reject at arrival when the predicted TTFT exceeds the TTFT SLO or the chosen decode
  instance's predicted step time exceeds the TBT SLO. SLO attainment = requests with TTFT <= SLO and TBT <= SLO
  (requests with a single output token have no TBT) over all requests, rejected ones included.
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Callable, NamedTuple, Optional

from .cache import LRUCache
from .common import (Progress, ToolError, format_table, parse_count, parse_positive_float, percentile,
                     split_choices)
from .kvcache_size import bytes_per_token, load_model
from .plotting import check_plot_target, new_figure, save_figure
from .trace import Trace, add_trace_arguments, load_trace_args, merge_traces

SCHEDULERS = ("random", "load-balance", "local-cache-aware", "global-cache-aware")
_EPS = 1e-9


@dataclass(frozen=True)
class ClusterConfig:
    """Cluster, hardware-model and SLO parameters of a replay (defaults: the paper's LLaMA3-70B testbed)."""

    prefill_nodes: int = 8
    decode_nodes: int = 8
    bytes_per_token: int = 327_680
    bandwidth_gbps: float = 800.0
    node_cache_tokens: int = 3_000_000
    prefill_a: float = 1.13e-4
    prefill_b: float = 7.39e-10
    decode_step_s: float = 0.0262
    decode_ctx_s: float = 3.5e-8
    decode_batch: int = 128
    decode_kv_tokens: int = 1_500_000
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.1
    speed: float = 1.0
    early_rejection: bool = False
    balance_threshold: float = 1.0
    seed: int = 0

    def validate(self, block_size: int) -> None:
        """Raises ToolError unless counts, rates, capacities, SLOs and the base decode step are > 0, the other time
        coefficients are >= 0, the balance threshold is >= 1 and a node cache holds at least one block."""
        for name in ("prefill_nodes", "decode_nodes", "bytes_per_token", "bandwidth_gbps", "node_cache_tokens",
                     "decode_batch", "decode_kv_tokens", "ttft_slo_s", "tbt_slo_s", "speed", "decode_step_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ToolError(f"{name} must be > 0, got {value}")
        for name in ("prefill_a", "prefill_b", "decode_ctx_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ToolError(f"{name} must be a finite number >= 0, got {value}")
        if self.balance_threshold < 1:
            raise ToolError(f"balance threshold must be >= 1, got {self.balance_threshold}")
        if self.node_cache_tokens < block_size:
            raise ToolError(f"node cache of {self.node_cache_tokens} tokens is less than one {block_size}-token block")

    def prefill_time(self, n: int, cached: int = 0) -> float:
        """Seconds to prefill an n-token prompt whose first `cached` tokens are reused: T(n) - T(c) with
        c = min(cached, n - 1) (the last prompt token is always computed, to produce the first output token)."""
        c = max(0, min(cached, n - 1))
        return self.prefill_a * (n - c) + self.prefill_b * (n * n - c * c)

    def transfer_time(self, tokens: int) -> float:
        """Seconds to move the KV of `tokens` tokens over one link of `bandwidth_gbps`."""
        return tokens * self.bytes_per_token * 8 / (self.bandwidth_gbps * 1e9)

    def step_time(self, context_tokens: float) -> float:
        """Seconds of one decode step over a batch holding `context_tokens` tokens of KV."""
        return self.decode_step_s + self.decode_ctx_s * context_tokens


class _Plan(NamedTuple):
    """Where and how a request would be prefilled: `fetched_blocks` come from instance `source` first."""

    instance: int
    local_blocks: int
    fetched_blocks: int
    source: Optional[int]
    transfer_s: float
    prefill_s: float
    queue_s: float

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.transfer_s + self.prefill_s


@dataclass
class _Prefill:
    cache: LRUCache
    busy_until: float = 0.0
    busy_s: float = 0.0
    requests: int = 0


@dataclass
class _Active:
    """A request in a decode batch: its first step segment, its share of `context0`, its reserved KV tokens and
    how long it waited between its first token and joining the batch."""

    first_segment: int
    context0: float
    reserved: int
    wait_s: float


@dataclass
class _Decode:
    """One decode instance: a fluid model of continuous batching (see module docstring)."""

    cfg: ClusterConfig
    steps: float = 0.0  # decode steps done since the start by a request that was always in the batch
    time: float = 0.0  # time at which `steps` was last brought up to date
    context0: float = 0.0  # sum over active requests of (input length - steps at join); context = this + B*steps
    reserved: int = 0
    active: dict = field(default_factory=dict)
    finish_heap: list = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    seg_tau: list = field(default_factory=list)
    seg_steps: list = field(default_factory=list)
    version: int = 0
    pending: int = 0  # requests assigned at arrival that have not joined yet
    pending_tokens: int = 0  # their prompt tokens
    pending_reserved: int = 0  # their input + output tokens
    requests: int = 0
    batch_time: float = 0.0  # integral of batch size over time
    max_batch: int = 0

    def context_tokens(self, now: float) -> float:
        b = len(self.active)
        if not b:
            return 0.0
        steps = self.steps + (now - self.time) / self.cfg.step_time(self.context0 + b * self.steps)
        return self.context0 + b * steps

    def advance(self, now: float) -> None:
        b = len(self.active)
        if b and now > self.time:
            tau = self.cfg.step_time(self.context0 + b * self.steps)
            ds = (now - self.time) / tau
            self.seg_tau.append(tau)
            self.seg_steps.append(ds)
            self.steps += ds
            self.batch_time += b * (now - self.time)
        self.time = max(self.time, now)

    def can_admit(self, reserve: int) -> bool:
        if not self.active:
            return True
        return len(self.active) < self.cfg.decode_batch and self.reserved + reserve <= self.cfg.decode_kv_tokens

    def assign(self, input_len: int, output_len: int, sign: int = 1) -> None:
        """Counts a request assigned to this instance (sign=1) or joining it (sign=-1) for `choice_key`."""
        self.pending += sign
        self.pending_tokens += sign * input_len
        self.pending_reserved += sign * (input_len + output_len)

    def choice_key(self, now: float, input_len: int, output_len: int) -> tuple:
        """(would have to wait, predicted step time): the instance's load once every request assigned to it,
        this one included, has joined."""
        crowded = (len(self.active) + len(self.waiting) + self.pending >= self.cfg.decode_batch
                   or self.reserved + self.pending_reserved + input_len + output_len > self.cfg.decode_kv_tokens)
        return crowded, self.cfg.step_time(self.context_tokens(now) + self.pending_tokens + input_len)

    def admit(self, req: int, input_len: int, output_len: int, now: float, first_token_s: float) -> None:
        """Adds a request to the batch at `now` (call advance(now) first)."""
        target = self.steps + (output_len - 1)
        self.active[req] = _Active(len(self.seg_tau), input_len - self.steps, input_len + output_len,
                                   now - first_token_s)
        self.context0 += input_len - self.steps
        self.reserved += input_len + output_len
        heapq.heappush(self.finish_heap, (target, req))
        self.requests += 1
        self.max_batch = max(self.max_batch, len(self.active))

    def pop_finished(self, due: bool = False) -> list:
        """Removes and returns (request, _Active) for every request whose last token is done (after advance).
        `due`: the caller's event was scheduled for the first finish, which therefore counts as done even when
        rounding left `steps` a hair short (otherwise a tiny step time could reschedule it forever)."""
        if due and self.finish_heap:
            self.steps = max(self.steps, self.finish_heap[0][0])
        done = []
        while self.finish_heap and self.finish_heap[0][0] <= self.steps + 1e-6:
            _, req = heapq.heappop(self.finish_heap)
            a = self.active.pop(req)
            self.context0 -= a.context0
            self.reserved -= a.reserved
            done.append((req, a))
        return done

    def next_finish_time(self) -> Optional[float]:
        if not self.finish_heap:
            return None
        tau = self.cfg.step_time(self.context0 + len(self.active) * self.steps)
        return self.time + max(0.0, self.finish_heap[0][0] - self.steps) * tau

    def tbt(self, a: _Active, output_len: int) -> float:
        """Mean of the longest 10 % of the request's inter-token gaps (the first gap includes its wait)."""
        gaps = list(zip(self.seg_tau[a.first_segment:], self.seg_steps[a.first_segment:]))
        first_tau = gaps[0][0] if gaps else self.cfg.decode_step_s
        gaps.append((a.wait_s + first_tau, 1.0))
        remove = 1.0  # that first step is now counted in the wait gap
        for j in range(len(gaps) - 1):
            take = min(remove, gaps[j][1])
            gaps[j] = (gaps[j][0], gaps[j][1] - take)
            remove -= take
            if remove <= 0:
                break
        k = max(1, math.ceil(0.1 * (output_len - 1)))
        total = taken = 0.0
        for value, weight in sorted(gaps, reverse=True):
            w = min(weight, k - taken)
            total += value * w
            taken += w
            if taken >= k - _EPS:
                break
        return total / max(taken, _EPS)


@dataclass
class ReplayResult:
    """Metrics of one replay; `to_json` gives the stable `--json` object (without the per-request lists).

    `ttft_by_request[i]` / `tbt_by_request[i]` are request i's TTFT and TBT in trace order (None when rejected,
    and TBT None when the request has a single output token)."""

    policy: str
    requests: int
    completed: int
    rejected: int
    mean_ttft_s: float
    p50_ttft_s: float
    p90_ttft_s: float
    p99_ttft_s: float
    mean_tbt_s: float
    p50_tbt_s: float
    p90_tbt_s: float
    p99_tbt_s: float
    slo_attainment: float
    ttft_slo_s: float
    tbt_slo_s: float
    cache_hit_ratio: float
    remote_hit_ratio: float
    mean_prefill_s: float
    makespan_s: float
    prefill_load: list
    decode_load: list
    ttft_by_request: list = field(default_factory=list, repr=False)
    tbt_by_request: list = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.endswith("_by_request")}
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


class _Simulation:
    """One replay of a trace under one scheduler (use `simulate`)."""

    def __init__(self, trace: Trace, scheduler: str, cfg: ClusterConfig):
        self.trace, self.scheduler, self.cfg = trace, scheduler, cfg
        blocks = cfg.node_cache_tokens // trace.block_size
        self.prefill = [_Prefill(LRUCache(blocks)) for _ in range(cfg.prefill_nodes)]
        self.decode = [_Decode(cfg) for _ in range(cfg.decode_nodes)]
        self.rng = random.Random(cfg.seed)
        self.events: list = []
        self.seq = 0
        n = len(trace)
        self.ttft = [math.nan] * n
        self.tbt: list = [None] * n
        self.rejected = [False] * n
        self.prefill_s = [0.0] * n
        self.hit_tokens = self.remote_tokens = self.scheduled_tokens = 0
        self.end_time = 0.0

    def push(self, time: float, kind: str, *data) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time, self.seq, kind, data))

    # -- scheduling ---------------------------------------------------------------------------------------------
    def choose_prefill(self, i: int, now: float) -> _Plan:
        """The prefill plan of request i under the scheduler (see module docstring)."""
        trace, cfg, ids, n = self.trace, self.cfg, self.trace.hash_ids[i], self.trace.input_lengths[i]
        queue = [max(0.0, p.busy_until - now) for p in self.prefill]

        def local_plan(k: int, local: Optional[int] = None) -> _Plan:
            local = self.prefill[k].cache.prefix_len(ids) if local is None else local
            return _Plan(k, local, 0, None, 0.0, cfg.prefill_time(n, trace.block_tokens(i, local)), queue[k])

        if self.scheduler == "random":
            return local_plan(self.rng.randrange(len(self.prefill)))
        if self.scheduler == "load-balance":
            return local_plan(min(range(len(self.prefill)), key=lambda k: (queue[k], self.prefill[k].requests, k)))
        local = [p.cache.prefix_len(ids) for p in self.prefill]
        plans = [local_plan(k, local[k]) for k in range(len(self.prefill))]
        if self.scheduler == "global-cache-aware":
            best = max(range(len(local)), key=lambda k: local[k])
            for k in range(len(local)):
                if local[best] > local[k] and (local[k] == 0 or local[best] / local[k] > cfg.balance_threshold):
                    have, want = trace.block_tokens(i, local[k]), trace.block_tokens(i, local[best])
                    plans[k] = _Plan(k, local[k], local[best] - local[k], best, cfg.transfer_time(want - have),
                                     cfg.prefill_time(n, want), queue[k])
        return min(plans, key=lambda p: (p.ttft_s, -(p.local_blocks + p.fetched_blocks),
                                         self.prefill[p.instance].requests, p.instance))

    def choose_decode(self, i: int, now: float) -> tuple:
        """Returns (instance, predicted step time)."""
        n, m = self.trace.input_lengths[i], self.trace.output_lengths[i]
        best = min((d.choice_key(now, n, m), k) for k, d in enumerate(self.decode))
        return best[1], best[0][1]

    def on_arrival(self, i: int, now: float) -> None:
        cfg, trace = self.cfg, self.trace
        plan = self.choose_prefill(i, now)
        k, local, fetched, transfer, prefill = (plan.instance, plan.local_blocks, plan.fetched_blocks,
                                                plan.transfer_s, plan.prefill_s)
        d, step = self.choose_decode(i, now)
        if cfg.early_rejection and (plan.ttft_s > cfg.ttft_slo_s or step > cfg.tbt_slo_s):
            self.rejected[i] = True
            return
        ids = trace.hash_ids[i]
        node = self.prefill[k]
        node.cache.access(ids[:local])
        if fetched:
            self.prefill[plan.source].cache.access(ids[:local + fetched])
        start = max(now, node.busy_until)
        node.busy_until = start + transfer + prefill
        node.busy_s += transfer + prefill
        node.requests += 1
        cached = trace.block_tokens(i, local + fetched)
        self.hit_tokens += cached
        self.remote_tokens += cached - trace.block_tokens(i, local)
        self.scheduled_tokens += trace.input_lengths[i]
        self.prefill_s[i] = prefill
        if trace.output_lengths[i] > 1:
            self.decode[d].assign(trace.input_lengths[i], trace.output_lengths[i])
        self.push(node.busy_until, "prefill_done", i, k, d, start + transfer, now)

    # -- completion events -------------------------------------------------------------------------------------
    def on_prefill_done(self, now: float, i: int, k: int, d: int, compute_start: float, arrival: float) -> None:
        trace = self.trace
        self.prefill[k].cache.access(trace.hash_ids[i])
        self.ttft[i] = now - arrival
        if trace.output_lengths[i] <= 1:
            self.end_time = max(self.end_time, now)
            return
        join = max(now, compute_start + self.cfg.transfer_time(trace.input_lengths[i]))
        self.push(join, "decode_join", i, d, now)

    def on_decode_join(self, now: float, i: int, d: int, first_token: float) -> None:
        node = self.decode[d]
        node.advance(now)
        node.assign(self.trace.input_lengths[i], self.trace.output_lengths[i], sign=-1)
        node.waiting.append((i, first_token))
        self.admit_waiting(d, now)

    def admit_waiting(self, d: int, now: float) -> None:
        node, trace = self.decode[d], self.trace
        while node.waiting:
            i, first_token = node.waiting[0]
            n, m = trace.input_lengths[i], trace.output_lengths[i]
            if not node.can_admit(n + m):
                break
            node.waiting.popleft()
            node.admit(i, n, m, now, first_token)
        node.version += 1
        t = node.next_finish_time()
        if t is not None:
            self.push(t, "decode_finish", d, node.version)

    def on_decode_finish(self, now: float, d: int, version: int) -> None:
        node = self.decode[d]
        if version != node.version:
            return  # superseded by a later batch change
        node.advance(now)
        for i, a in node.pop_finished(due=True):
            self.tbt[i] = node.tbt(a, self.trace.output_lengths[i])
            self.end_time = max(self.end_time, now)
        self.admit_waiting(d, now)

    # -- driver -------------------------------------------------------------------------------------------------
    def run(self, progress: Optional[Callable[[int], None]] = None) -> ReplayResult:
        trace, cfg = self.trace, self.cfg
        t0 = min(trace.timestamps_ms)
        order = sorted(range(len(trace)), key=lambda i: trace.timestamps_ms[i])
        arrivals = [((trace.timestamps_ms[i] - t0) / 1000.0 / cfg.speed, i) for i in order]
        handlers = {"prefill_done": self.on_prefill_done, "decode_join": self.on_decode_join,
                    "decode_finish": self.on_decode_finish}
        a = 0
        while a < len(arrivals) or self.events:
            if a < len(arrivals) and (not self.events or arrivals[a][0] < self.events[0][0]):
                now, i = arrivals[a]
                a += 1
                self.on_arrival(i, now)
                if progress is not None and a % 1024 == 0:
                    progress(a)
            else:
                now, _, kind, data = heapq.heappop(self.events)
                handlers[kind](now, *data)
        return self.result()

    def result(self) -> ReplayResult:
        cfg, n = self.cfg, len(self.trace)
        done = [i for i in range(n) if not self.rejected[i]]
        ttfts = sorted(self.ttft[i] for i in done)
        tbts = sorted(self.tbt[i] for i in done if self.tbt[i] is not None)
        ok = sum(1 for i in done if self.ttft[i] <= cfg.ttft_slo_s
                 and (self.tbt[i] is None or self.tbt[i] <= cfg.tbt_slo_s))
        span = max(self.end_time, _EPS)
        mean = (lambda xs: sum(xs) / len(xs) if xs else math.nan)
        return ReplayResult(
            policy=self.scheduler, requests=n, completed=len(done), rejected=n - len(done),
            mean_ttft_s=mean(ttfts), p50_ttft_s=percentile(ttfts, 50), p90_ttft_s=percentile(ttfts, 90),
            p99_ttft_s=percentile(ttfts, 99), mean_tbt_s=mean(tbts), p50_tbt_s=percentile(tbts, 50),
            p90_tbt_s=percentile(tbts, 90), p99_tbt_s=percentile(tbts, 99), slo_attainment=ok / n,
            ttft_slo_s=cfg.ttft_slo_s, tbt_slo_s=cfg.tbt_slo_s,
            cache_hit_ratio=self.hit_tokens / max(1, self.scheduled_tokens),
            remote_hit_ratio=self.remote_tokens / max(1, self.scheduled_tokens),
            mean_prefill_s=mean([self.prefill_s[i] for i in done]), makespan_s=self.end_time,
            prefill_load=[{"requests": p.requests, "busy_s": p.busy_s, "utilization": p.busy_s / span}
                          for p in self.prefill],
            decode_load=[{"requests": d.requests, "mean_batch": d.batch_time / span, "max_batch": d.max_batch}
                         for d in self.decode],
            ttft_by_request=[None if self.rejected[i] else self.ttft[i] for i in range(n)],
            tbt_by_request=[None if self.rejected[i] else self.tbt[i] for i in range(n)])


def simulate(trace: Trace, scheduler: str, cfg: ClusterConfig = ClusterConfig(),
             progress: Optional[Callable[[int], None]] = None) -> ReplayResult:
    """Replays `trace` on the cluster `cfg` with prefill scheduler `scheduler` (one of SCHEDULERS).

    Raises:
      ToolError: unknown scheduler or invalid configuration.
    """
    if scheduler not in SCHEDULERS:
        raise ToolError(f"unknown policy {scheduler!r} (choose from {', '.join(SCHEDULERS)})")
    cfg.validate(trace.block_size)
    return _Simulation(trace, scheduler, cfg).run(progress)


def plot_ttft(results: list, path: str) -> None:
    """Draws the TTFT distribution (CDF over completed requests, log x axis) of each replay."""
    fig, ax = new_figure()
    for r in results:
        ttfts = sorted(t for t in r.ttft_by_request if t is not None)
        if ttfts:
            ys = [(j + 1) / len(ttfts) for j in range(len(ttfts))]
            ax.plot([max(t, 1e-3) for t in ttfts], ys, label=f"{r.policy} (mean {r.mean_ttft_s:.2f} s)")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of completed requests")
    ax.axvline(results[0].ttft_slo_s, color="grey", linestyle=":", linewidth=1, label="TTFT SLO")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


# ---- command line -------------------------------------------------------------------------------------------------

def register(subparsers) -> None:
    d = ClusterConfig()
    p = subparsers.add_parser(
        "replay", help="trace-driven simulation of a disaggregated prefill/decode cluster",
        description="Replays traces at their timestamps on a simulated cluster (prefill instances with queues and "
                    "local caches forming a global KV pool, decode instances with continuous batching) under one "
                    "or more scheduling policies, and reports TTFT, TBT, SLO attainment, rejections, cache hits "
                    "and per-instance load.",
        epilog="example: mooncake replay --trace conversation --prefill-nodes 8 --decode-nodes 8 "
               "--policy random,load-balance,local-cache-aware,global-cache-aware")
    add_trace_arguments(p)
    p.add_argument("--policy", default=",".join(SCHEDULERS),
                   help=f"one or a comma list of: {', '.join(SCHEDULERS)} (default: all)")
    p.add_argument("--prefill-nodes", default=str(d.prefill_nodes), metavar="N", help="prefill instances (default 8)")
    p.add_argument("--decode-nodes", default=str(d.decode_nodes), metavar="N", help="decode instances (default 8)")
    p.add_argument("--speed", default=str(d.speed), metavar="X", help="replay speed factor (default 1)")
    p.add_argument("--max-requests", metavar="N", help="replay only the first N requests (by time)")
    p.add_argument("--ttft-slo", default=str(d.ttft_slo_s), metavar="S", help="TTFT SLO in seconds (default 30)")
    p.add_argument("--tbt-slo", default=str(d.tbt_slo_s), metavar="S", help="TBT SLO in seconds (default 0.1)")
    p.add_argument("--early-rejection", action="store_true",
                   help="reject requests at arrival whose predicted TTFT or TBT misses its SLO")
    p.add_argument("--bandwidth-gbps", default=str(d.bandwidth_gbps), metavar="GBPS",
                   help="per-node network bandwidth for KV transfers (default 800 = 4x200 Gbps)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="PRESET", help="model whose KV bytes per token sizes transfers "
                                                       "(default llama-3-70b)")
    src.add_argument("--config", metavar="PATH", help="Hugging Face config.json instead of a preset")
    p.add_argument("--dtype", default="bf16", help="KV dtype (default bf16)")
    p.add_argument("--node-cache-tokens", default=str(d.node_cache_tokens), metavar="N",
                   help="KV-cache capacity of each prefill node's DRAM, in tokens (default 3e6, about 1 TB)")
    p.add_argument("--prefill-coeffs", default=f"{d.prefill_a},{d.prefill_b}", metavar="A,B",
                   help="prefill time T(n) = A n + B n^2 seconds (default the paper's Fig. 14 fit)")
    p.add_argument("--decode-step", default=f"{d.decode_step_s},{d.decode_ctx_s}", metavar="BASE,PER_TOKEN",
                   help="decode step seconds = BASE + PER_TOKEN * context tokens in the batch "
                        "(BASE > 0; default 0.0262,3.5e-8, fitted to Fig. 14)")
    p.add_argument("--decode-batch", default=str(d.decode_batch), metavar="N",
                   help="max requests in a decode batch (default 128)")
    p.add_argument("--decode-kv-tokens", default=str(d.decode_kv_tokens), metavar="N",
                   help="KV tokens a decode instance can hold (default 1.5e6)")
    p.add_argument("--balance-threshold", default=str(d.balance_threshold), metavar="X",
                   help="global-cache-aware fetches a remote prefix when it is more than X times the local one "
                        "(default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random policy (default 0)")
    p.add_argument("--plot", metavar="FILE", help="draw the TTFT distribution of each policy to FILE")
    p.add_argument("--per-instance", action="store_true", help="also print the load of every instance")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of tables")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def _two_floats(text: str, what: str) -> tuple:
    parts = text.split(",")
    if len(parts) != 2:
        raise ToolError(f"{what}: expected two comma-separated numbers, got {text!r}")
    try:
        a, b = float(parts[0]), float(parts[1])
    except ValueError:
        raise ToolError(f"{what}: expected two comma-separated numbers, got {text!r}") from None
    if not (math.isfinite(a) and math.isfinite(b)) or a < 0 or b < 0:
        raise ToolError(f"{what}: numbers must be finite and >= 0, got {text!r}")
    return a, b


def config_from_args(args) -> ClusterConfig:
    """ClusterConfig from parsed `replay` options. Raises ToolError on a bad value."""
    shape = load_model(args.model or (None if args.config else "llama-3-70b"), args.config)
    prefill_a, prefill_b = _two_floats(args.prefill_coeffs, "--prefill-coeffs")
    step, per_token = _two_floats(args.decode_step, "--decode-step")
    threshold = parse_positive_float(args.balance_threshold, "--balance-threshold")
    return ClusterConfig(
        prefill_nodes=parse_count(args.prefill_nodes, "--prefill-nodes"),
        decode_nodes=parse_count(args.decode_nodes, "--decode-nodes"),
        bytes_per_token=bytes_per_token(shape, args.dtype),
        bandwidth_gbps=parse_positive_float(args.bandwidth_gbps, "--bandwidth-gbps"),
        node_cache_tokens=parse_count(args.node_cache_tokens, "--node-cache-tokens"),
        prefill_a=prefill_a, prefill_b=prefill_b, decode_step_s=step, decode_ctx_s=per_token,
        decode_batch=parse_count(args.decode_batch, "--decode-batch"),
        decode_kv_tokens=parse_count(args.decode_kv_tokens, "--decode-kv-tokens"),
        ttft_slo_s=parse_positive_float(args.ttft_slo, "--ttft-slo"),
        tbt_slo_s=parse_positive_float(args.tbt_slo, "--tbt-slo"),
        speed=parse_positive_float(args.speed, "--speed"), early_rejection=args.early_rejection,
        balance_threshold=threshold, seed=args.seed)


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{1000 * x:.1f}"


def _s(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def run(args) -> int:
    """Executes `mooncake replay`: tables (default) or a JSON list of ReplayResult.to_json() objects."""
    policies = split_choices(args.policy, SCHEDULERS, "--policy")
    cfg = config_from_args(args)
    limit = None if args.max_requests is None else parse_count(args.max_requests, "--max-requests")
    if args.plot:
        check_plot_target(args.plot)
    trace = merge_traces(load_trace_args(args))
    if limit is not None:
        order = sorted(range(len(trace)), key=lambda i: trace.timestamps_ms[i])
        trace = trace.subset(order[:limit])
    results = []
    for policy in policies:
        bar = Progress(f"[replay {len(results) + 1}/{len(policies)}] {trace.name} {policy}", len(trace),
                       enabled=not args.quiet)
        results.append(simulate(trace, policy, cfg, progress=bar.update))
        bar.finish()
    if args.plot:
        plot_ttft(results, args.plot)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
        return 0
    print(f"{trace.name}: {len(trace)} requests, {cfg.prefill_nodes} prefill + {cfg.decode_nodes} decode nodes, "
          f"speed {cfg.speed:g}, SLO TTFT {cfg.ttft_slo_s:g} s / TBT {1000 * cfg.tbt_slo_s:g} ms")
    print(format_table(
        ["policy", "rejected", "TTFT mean s", "p50", "p90", "p99", "TBT mean ms", "p50", "p90", "p99",
         "SLO met", "cache hit", "remote hit", "prefill util min-max"],
        [[r.policy, r.rejected, _s(r.mean_ttft_s), _s(r.p50_ttft_s), _s(r.p90_ttft_s), _s(r.p99_ttft_s),
          _ms(r.mean_tbt_s), _ms(r.p50_tbt_s), _ms(r.p90_tbt_s), _ms(r.p99_tbt_s), f"{r.slo_attainment:.2%}",
          f"{r.cache_hit_ratio:.3f}", f"{r.remote_hit_ratio:.3f}",
          f"{min(p['utilization'] for p in r.prefill_load):.2f}-"
          f"{max(p['utilization'] for p in r.prefill_load):.2f}"] for r in results]))
    if args.per_instance:
        rows = []
        for r in results:
            rows += [[r.policy, f"prefill {k}", p["requests"], f"{p['utilization']:.2f}", "-", "-"]
                     for k, p in enumerate(r.prefill_load)]
            rows += [[r.policy, f"decode {k}", d["requests"], "-", f"{d['mean_batch']:.1f}", d["max_batch"]]
                     for k, d in enumerate(r.decode_load)]
        print()
        print(format_table(["policy", "instance", "requests", "utilization", "mean batch", "max batch"], rows))
    return 0
