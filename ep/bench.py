"""EP benchmark: dispatch + combine over the Transfer Engine against the same exchange done with
all_to_all_single over gloo, interleaved in one run (128 tokens per rank, hidden 7168, top-8 by default).

Run: bazel run //ep:bench -- [--ranks 2,4] [--iters 20]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def rank_main(rank, world, port, args):
    from mooncake.ep import Buffer, layout

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    t, hidden, topk, experts = args.tokens, args.hidden, args.topk, args.experts
    local = experts // world
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(t, hidden, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(t)]).to(torch.int64)
    w = torch.rand(t, topk, generator=g)
    buf = Buffer(dist.group.WORLD)
    active = torch.ones(world, dtype=torch.int32)

    def ep_step():
        recv_x, count, handle, _, _ = buf.dispatch(x, idx, active, t, experts, -1, use_fp8=False)
        out, _, _ = buf.combine(recv_x, idx, w, active, -1, handle)
        return out

    per_expert = layout.tokens_per_expert(idx, experts)
    send_rows = [torch.cat([x[per_expert[r * local + le]] for le in range(local)]) for r in range(world)]
    send_counts = [len(s) for s in send_rows]
    recv_counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(recv_counts, torch.tensor([send_counts[0]]))  # warm-up of gloo itself
    counts_in = torch.tensor(send_counts, dtype=torch.int64)
    counts_out = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(counts_out, counts_in)
    recv_counts = counts_out.tolist()
    sendbuf = torch.cat(send_rows)

    def gloo_step():
        recv = torch.empty(sum(recv_counts), hidden, dtype=torch.bfloat16)
        dist.all_to_all_single(recv, sendbuf, recv_counts, send_counts)  # dispatch
        back = torch.empty(sum(send_counts), hidden, dtype=torch.bfloat16)
        dist.all_to_all_single(back, recv, send_counts, recv_counts)  # combine (weights applied locally)
        return back

    results = {"ep": [], "gloo": []}
    for _ in range(2):
        ep_step()
        gloo_step()
    for _ in range(args.iters):
        for name, fn in (("ep", ep_step), ("gloo", gloo_step)):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            results[name].append(time.perf_counter() - t0)
    dist.barrier()
    if rank == 0:
        out = {"ranks": world}
        for name, lat in results.items():
            lat.sort()
            p50 = lat[len(lat) // 2]
            out[name] = {"p50_ms": p50 * 1e3, "tokens_per_s": t * world / p50}
        out["ep_over_gloo_latency"] = out["ep"]["p50_ms"] / out["gloo"]["p50_ms"]
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank is not None:
        rank_main(args.rank, args.world, args.port, args)
        return 0
    rows = []
    for world in [int(r) for r in args.ranks.split(",")]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MC_LOG_LEVEL": "ERROR"}
        common = ["--tokens", str(args.tokens), "--hidden", str(args.hidden), "--topk", str(args.topk),
                  "--experts", str(args.experts), "--iters", str(args.iters)]
        procs = [subprocess.Popen([sys.executable, "-m", "mooncake.ep.bench", "--rank", str(r), "--world",
                                   str(world), "--port", str(port)] + common, stdout=subprocess.PIPE, text=True, env=env)
                 for r in range(world)]
        out = [q.communicate(timeout=600)[0] for q in procs]
        rows.append(json.loads(out[0]))
        print(f"{world} ranks done", file=sys.stderr)
    print(f"\nMoE dispatch+combine, {args.tokens} tokens/rank, hidden {args.hidden}, top-{args.topk}, "
          f"{args.experts} experts, one host (p50 over {args.iters} interleaved iterations)\n")
    print(f"{'ranks':>5} | {'EP ms':>8} {'EP tok/s':>10} | {'gloo a2a ms':>11} {'gloo tok/s':>10} | {'EP/gloo time':>12}")
    for r in rows:
        print(f"{r['ranks']:>5} | {r['ep']['p50_ms']:>8.2f} {r['ep']['tokens_per_s']:>10.0f} | "
              f"{r['gloo']['p50_ms']:>11.2f} {r['gloo']['tokens_per_s']:>10.0f} | {r['ep_over_gloo_latency']:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
