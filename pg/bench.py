"""Benchmark: mooncake-cpu against gloo on this machine, interleaved in one run.

    bazel run //pg:bench -- --world 2 4        (or: python -m mooncake.pg.bench --world 2)

For each world size, every rank joins a mooncake-cpu default group and a gloo group; for each size and
collective the two backends alternate in rounds, so load on the machine hits both alike. Prints
algorithm bandwidth (bytes / p50 time) and p50 latency, and barrier latency.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

SIZES = [4 << 10, 1 << 20, 16 << 20, 64 << 20]


def _time(op, reps):
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        op()
        samples.append(time.perf_counter() - t0)
    return samples


def _reps(nbytes):
    return 200 if nbytes <= 64 << 10 else 40 if nbytes <= 1 << 20 else 8 if nbytes <= 16 << 20 else 4


def measure(rank, world, port, sizes, rounds):
    """Runs in each rank; returns {(name, nbytes, backend): [seconds...]} (rank 0's samples)."""
    from mooncake.pg.testutil import exit_handshake, init

    init("mooncake-cpu", rank, world, port)
    groups = {"mooncake-cpu": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    results = {}
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        outs = [torch.empty_like(x) for _ in range(world)]
        ops = {"all_reduce": lambda g: dist.all_reduce(x, group=g),
               "all_gather": lambda g: dist.all_gather(outs, x, group=g)}
        for name, op in ops.items():
            for _ in range(rounds):
                for backend, g in groups.items():
                    op(g)  # warm-up, then the timed repetitions
                    dist.barrier(group=g)
                    samples = _time(lambda: op(g), _reps(nbytes))
                    results.setdefault((name, nbytes, backend), []).extend(samples)
    for _ in range(rounds):
        for backend, g in groups.items():
            results.setdefault(("barrier", 0, backend), []).extend(_time(lambda: dist.barrier(group=g), 200))
    exit_handshake(rank, world)
    return results


def report(world, results):
    lines = [f"world={world}  {'op':<11} {'size':>8} {'backend':<13} {'p50':>10} {'algbw GB/s':>11} {'vs gloo':>8}"]
    keys = sorted({(n, s) for n, s, _ in results}, key=lambda k: (k[0], k[1]))
    for name, nbytes in keys:
        p50 = {b: statistics.median(results[(name, nbytes, b)]) for b in ("mooncake-cpu", "gloo")}
        for b in ("mooncake-cpu", "gloo"):
            bw = f"{nbytes / p50[b] / 1e9:.2f}" if nbytes else "-"
            ratio = f"{p50['gloo'] / p50[b]:.2f}x" if b != "gloo" else ""
            lines.append(f"world={world}  {name:<11} {nbytes >> 10:>6}Ki {b:<13} {p50[b] * 1e6:>8.0f}us "
                         f"{bw:>11} {ratio:>8}")
    return "\n".join(lines)


def main(argv=None):
    from mooncake.pg.testutil import run_ranks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="message sizes in bytes")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two backends per case")
    args = ap.parse_args(argv)
    out = []
    for world in args.world:
        res = run_ranks(measure, world, args.sizes, args.rounds, timeout=600)
        out.append(report(world, res[0]))
        print(out[-1], flush=True)
    return "\n".join(out)


if __name__ == "__main__":
    import mooncake.pg  # noqa: F401  (registers the backends)

    main()
