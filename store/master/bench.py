"""Master benchmark: operations per second, the gRPC floor, memory per object, allocator fragmentation.

  bazel run //store/master:master_bench -- [--seconds 3] [--clients 1,8] [--objects 1000000] [--json out.json]

1. RPC throughput: a real ``mooncake_master`` process, one client process mounting a large (virtual) segment,
   and 1 or N client processes (rpc_worker) each running one operation kind for --seconds: put
   (PutStart+PutEnd), get (GetReplicaList), exist, and their batch forms (--batch keys per RPC). Reported as
   items/s and RPCs/s, summed over clients. In the same run, a plain gRPC echo server process (bytes in,
   bytes out, same thread pool size) is measured the same way: the floor any gRPC master could reach here.
2. Memory: --objects objects put into an in-process MasterService (batch calls, no RPC): resident memory
   growth per object, and (on up to 100 000 objects, tracemalloc) the exact Python heap bytes per object.
   Both include the key string (64 B keys, like vLLM-style hashes: 113 B as a Python str).
3. Allocator: mixed sizes 4 KiB..4 MiB churned at 85 % fill in a 4 GiB segment: fragmentation, largest free
   block, allocations/s, and the fill reached when a first allocation fails while filling after the churn.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
import tracemalloc
from concurrent import futures

import grpc

from mooncake.store.common.allocator import OffsetAllocator
from mooncake.store.master.config import MasterConfig
from mooncake.store.master.objects import PutConfig
from mooncake.store.master.rpc_worker import ECHO_METHOD
from mooncake.store.master.service import MasterService, SegmentSpec
from mooncake.store.master.testing import MasterProcess, WorkerProcess, child_env, read_line, stop_process

GiB = 1 << 30


# -- echo server (runs as `bench.py --serve-echo` in its own process) -------------------------------------------
def serve_echo(threads: int) -> int:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=[("grpc.so_reuseport", 0)])
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    service, method = ECHO_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {method: handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"echo listening on 127.0.0.1:{port}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(0)
    return 0


# -- 1. RPC throughput --------------------------------------------------------------------------------------------
def _parallel(workers: list[WorkerProcess], make_req) -> dict:
    for i, w in enumerate(workers):
        w.send(make_req(i))
    results = [w.receive(timeout=600) for w in workers]
    for r in results:
        if not r.get("ok"):
            raise RuntimeError(f"client failed: {r}")
    elapsed = max(r["elapsed"] for r in results)
    errors: dict[str, int] = {}
    for r in results:
        for code, n in r["errors"].items():
            errors[code] = errors.get(code, 0) + n
    return {"items_per_s": sum(r["items"] for r in results) / elapsed,
            "rpcs_per_s": sum(r["rpcs"] for r in results) / elapsed,
            "us_per_rpc_per_client": 1e6 * elapsed * len(results) / max(1, sum(r["rpcs"] for r in results)),
            "errors": errors}


def rpc_throughput(seconds: float, clients: list[int], batch: int, threads: int) -> dict:
    out: dict = {}
    master = MasterProcess(f"--max_threads={threads}", "--eviction_high_watermark_ratio=1.0")
    echo = subprocess.Popen([sys.executable, "-m", "mooncake.store.master.bench", "--serve-echo",
                             f"--threads={threads}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env())
    workers: list[WorkerProcess] = []
    try:
        echo_address = read_line(echo, 30).split()[-1]
        owner = WorkerProcess(master.address)
        workers.append(owner)
        seg = {"seg_id": "bench-pool", "name": "bench:1", "base": 1 << 40, "size": 1 << 40}
        assert owner.request({"op": "mount", "segment": seg})["code"] == 0
        owner.request({"op": "heartbeat", "interval": 1.0})
        n_keys = 20000
        r = owner.request({"op": "loop", "kind": "batch_put", "prefix": "g/", "size": 4096, "count": n_keys,
                           "batch": 1000})
        assert r["ok"] and not r["errors"], r
        pool = [WorkerProcess(master.address) for _ in range(max(clients))]
        workers.extend(pool)
        for n in clients:
            ws = pool[:n]
            run = f"{n}c"
            out[f"echo_{run}"] = _parallel(ws, lambda i: {"op": "echo", "address": echo_address,
                                                          "seconds": seconds, "payload": 16})
            for kind in ("put", "get", "exist", "batch_put", "batch_get"):
                def req(i, kind=kind):
                    prefix = "g/" if kind in ("get", "exist", "batch_get") else f"{kind}/{run}/{i}/"
                    return {"op": "loop", "kind": kind, "prefix": prefix, "size": 4096, "seconds": seconds,
                            "count": n_keys, "batch": batch}
                out[f"{kind}_{run}"] = _parallel(ws, req)
    finally:
        for w in workers:
            w.stop()
        echo.stdin.close()
        stop_process(echo, 5)
        master.stop()
    return out


# -- 2. memory per object -----------------------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_per_object(n: int, key_bytes: int = 64, replicas: int = 1, trace: bool = False) -> dict:
    """Resident memory growth per object; with `trace`, also the exact Python heap bytes per object
    (tracemalloc: slower, but independent of what the process freed earlier)."""
    svc = MasterService(MasterConfig(client_ttl_sec=1e9, eviction_high_watermark_ratio=1.0))
    for i in range(replicas):
        svc.mount_segment(f"c{i}", SegmentSpec(f"s{i}", f"host{i}:1", 1 << 40, 1 << 40))
    cfg = PutConfig(replica_num=replicas)
    gc.collect()
    before = _rss_bytes()
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    chunk = 2000
    for start in range(0, n, chunk):
        keys = [f"{start + j:0{key_bytes}x}" for j in range(min(chunk, n - start))]
        for code, _ in svc.batch_put_start("bench", keys, [16384 + (j & 0xFF) * 64 for j in range(len(keys))], cfg):
            if code:
                raise RuntimeError(f"put_start failed: {code}")
        svc.batch_put_end("bench", keys)
    elapsed = time.perf_counter() - t0
    gc.collect()
    traced = 0
    if trace:
        traced = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    after = _rss_bytes()
    assert svc.snapshot()["objects"] == n
    return {"objects": n, "key_bytes": key_bytes, "replicas": replicas,
            "rss_bytes_per_object": (after - before) / n, "rss_delta_mib": (after - before) / 2 ** 20,
            "heap_bytes_per_object": traced / n if trace else None,
            "in_process_puts_per_s": n / elapsed}


# -- 3. allocator fragmentation -----------------------------------------------------------------------------------
def allocator_fragmentation(ops: int = 200_000, fill: float = 0.85, seed: int = 1) -> dict:
    rng = random.Random(seed)
    cap = 4 * GiB
    a = OffsetAllocator(cap)
    sizes = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    live: list[tuple[int, int]] = []
    fails = 0
    t0 = time.perf_counter()
    for _ in range(ops):
        while a.used_bytes > fill * cap:
            j = rng.randrange(len(live))
            live[j], live[-1] = live[-1], live[j]
            a.free(*live.pop())
        size = rng.choice(sizes)
        off = a.allocate(size)
        if off is None:
            fails += 1
        else:
            live.append((off, size))
    churn_s = time.perf_counter() - t0
    result = {"ops": ops, "target_fill": fill, "alloc_free_per_s": 2 * ops / churn_s, "failed_allocs": fails,
              "fragmentation": a.fragmentation(), "largest_free_mib": a.largest_free() / 2 ** 20,
              "free_blocks": a.free_block_count}
    while True:  # keep filling with the same size mix: how full does the pool get before the first failure?
        size = rng.choice(sizes)
        if a.allocate(size) is None:
            break
    result["fill_at_first_failure"] = a.used_bytes / cap
    return result


def _fmt(name: str, r: dict) -> str:
    err = f"  errors {r['errors']}" if r.get("errors") else ""
    return (f"  {name:<16} {r['items_per_s']:>10.0f} items/s {r['rpcs_per_s']:>9.0f} RPC/s "
            f"{r['us_per_rpc_per_client']:>8.0f} us/RPC per client{err}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each throughput measurement")
    p.add_argument("--clients", default="1,8", help="comma-separated client process counts")
    p.add_argument("--batch", type=int, default=64, help="keys per batch RPC")
    p.add_argument("--threads", type=int, default=16, help="master (and echo server) RPC threads")
    p.add_argument("--objects", type=int, default=1_000_000, help="objects for the memory measurement")
    p.add_argument("--alloc_ops", type=int, default=200_000, help="allocator churn operations")
    p.add_argument("--json", default="", help="also write the results to this file")
    p.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_echo:
        return serve_echo(args.threads)
    try:
        clients = sorted({int(c) for c in args.clients.split(",")})
    except ValueError:
        p.error(f"--clients: expected comma-separated integers, got {args.clients!r}")
    if not clients or min(clients) < 1 or args.seconds <= 0 or args.objects < 1 or args.batch < 1:
        p.error("--clients, --seconds, --objects and --batch must be positive")

    results: dict = {"cpus": os.cpu_count()}
    print(f"master benchmark ({os.cpu_count()} CPUs, {args.seconds:g} s per point, batch {args.batch})", flush=True)
    results["rpc"] = rpc_throughput(args.seconds, clients, args.batch, args.threads)
    for name, r in results["rpc"].items():
        print(_fmt(name, r), flush=True)
    mem = results["memory"] = memory_per_object(args.objects)
    print(f"  memory: {mem['rss_bytes_per_object']:.0f} B/object (RSS) at {mem['objects']} objects "
          f"({mem['key_bytes']} B keys, RSS +{mem['rss_delta_mib']:.0f} MiB; "
          f"{mem['in_process_puts_per_s']:.0f} in-process puts/s)", flush=True)
    heap = results["memory_traced"] = memory_per_object(min(args.objects, 100_000), trace=True)
    print(f"  memory: {heap['heap_bytes_per_object']:.0f} B/object (Python heap, tracemalloc, "
          f"{heap['objects']} objects)", flush=True)
    al = results["allocator"] = allocator_fragmentation(args.alloc_ops)
    print(f"  allocator: {al['alloc_free_per_s']:.0f} alloc+free/s, after {al['ops']} ops at "
          f"{100 * al['target_fill']:.0f} % fill: fragmentation {al['fragmentation']:.3f}, largest free "
          f"{al['largest_free_mib']:.0f} MiB, {al['free_blocks']} free blocks, {al['failed_allocs']} failed; "
          f"fill at first failure {100 * al['fill_at_first_failure']:.1f} %", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
