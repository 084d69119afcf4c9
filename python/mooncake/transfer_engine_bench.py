"""transfer_engine_bench: Transfer Engine demo, benchmark and Mooncake-style target/initiator load tool.

Modes:
  demo      (default) embedded HTTP metadata server + a target engine in a second process; moves and
            verifies >= 1 GiB over TCP on 127.0.0.1 and prints sizes, GB/s and latency.
  compare   the benchmark: TE write/read vs a plain single-stream TCP socket doing the same work, interleaved
            in one run, plus single-core memcpy and the CPU a thread uses while it waits for a transfer, and
            same-host transfers between two processes vs memcpy (--same_host_only: that table alone).
  target    serve a registered buffer (Mooncake's flags) until stdin closes or Ctrl-C.
  initiator drive load against a target (Mooncake's flags: --segment_id --operation --batch_size ...).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import random
import re
import subprocess
import sys
import threading
import time

import numpy as np

from mooncake.engine import TransferEngine

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def parse_size(text: str) -> int:
    units = {"": 1, "B": 1, "K": KiB, "KB": KiB, "KIB": KiB, "M": MiB, "MB": MiB, "MIB": MiB, "G": GiB,
             "GB": GiB, "GIB": GiB}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    try:
        return int(float(num) * units[t[len(num):]])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 4096, 64KiB, 1GiB)") from None


def human(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def env_var(name: str, value: str | None):
    """Sets (or, with None, removes) an environment variable for the duration of the block."""
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def protocol_problem(protocol: str) -> str | None:
    """Why `protocol` cannot run in this process (its plugin is missing or unusable here), or None."""
    if not protocol:
        return None
    serving = [p for p in TransferEngine.plugins()
               if p["kind"] == "transport" and (protocol in p["protocols"] or p["name"] == protocol)]
    if not serving:
        usable = ", ".join(TransferEngine.get_supported_protocols()) or "none"
        return (f"protocol '{protocol}' is served by no transport plugin of this installation "
                f"(usable here: {usable}; MC_PLUGIN_DIR adds plugin folders)")
    for p in serving:
        if p["state"] == "loaded":
            return None
    return "; ".join(f"protocol '{protocol}' cannot run here: plugin '{p['name']}' is {p['state']}: {p['reason']}"
                     for p in serving)


def carried_bytes(engine: TransferEngine) -> dict:
    """{transport: bytes it moved} from the engine's counters (transports that moved nothing left out)."""
    out = {}
    for name, peers in json.loads(engine.get_stats()).items():
        if isinstance(peers, dict):
            total = sum(v.get("bytes", 0) for v in peers.values() if isinstance(v, dict))
            if isinstance(total, int) and total > 0:
                out[name] = total
    return out


class Endpoint:
    """An initialized engine with one registered buffer. force_tcp keeps same-host peers on TCP; copy_threads
    sets MC_SHM_COPY_THREADS (threads per same-host copy) for this engine."""

    def __init__(self, name: str, metadata: str, size: int, protocol: str = "tcp", device: str = "",
                 force_tcp: bool = False, copy_threads: int | None = None):
        problem = protocol_problem(protocol)
        if problem:
            raise SystemExit(f"error: {problem}")
        self.engine = TransferEngine()
        threads = str(copy_threads) if copy_threads else os.environ.get("MC_SHM_COPY_THREADS")
        with env_var("MC_FORCE_TCP", "1" if force_tcp else os.environ.get("MC_FORCE_TCP")), \
                env_var("MC_SHM_COPY_THREADS", threads):
            rc = self.engine.initialize(name, metadata, protocol, device)  # reads MC_* now
        if rc != 0:
            raise SystemExit(f"error: could not initialize the engine '{name}' with metadata '{metadata}' "
                             "(see the log line above)")
        self.buffer = np.zeros(size, dtype=np.uint8)
        self.buffer[::4096] = 1  # touch every page now, not during the measurements
        if self.engine.register_memory(self.buffer.ctypes.data, size) != 0:
            raise SystemExit(f"error: could not register {human(size)}")
        self.name = self.engine.get_local_segment_name()
        self.addr = self.buffer.ctypes.data


def anonymous_buffer(size: int, huge: bool) -> np.ndarray:
    """Private anonymous memory, as malloc gives a large allocation (what users register), with every page
    touched: 4 KiB pages (MADV_NOHUGEPAGE) or transparent huge pages where the kernel grants them
    (MADV_HUGEPAGE, before the first touch). The returned view keeps the mapping alive."""
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    view = np.frombuffer(m, dtype=np.uint8)
    view[::4096] = 1
    return view


def huge_page_kib(addr: int) -> int:
    """AnonHugePages (KiB) of this process's mapping that holds addr."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                inside = int(m.group(1), 16) <= addr < int(m.group(2), 16)
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------------------------------------
# target


def run_target(args) -> int:
    ep = Endpoint(args.local_server_name, args.metadata_server, args.buffer_size, args.protocol, args.device_name)
    info = {"segment": ep.name, "buffer": ep.addr, "size": args.buffer_size}
    if args.managed_size:  # engine-allocated (memfd) memory that same-host peers map
        info["managed"] = ep.engine.allocate_managed_buffer(args.managed_size)
    page_buffers = []  # registered until this process exits
    if args.page_buffers_size:  # ordinary registered memory, once with 4 KiB pages and once with huge pages
        for key, huge in (("pages_4k", False), ("pages_huge", True)):
            view = anonymous_buffer(args.page_buffers_size, huge)
            if ep.engine.register_memory(view.ctypes.data, view.nbytes) != 0:
                raise SystemExit(f"error: could not register {human(view.nbytes)}")
            page_buffers.append(view)
            info[key] = view.ctypes.data
            info[key + "_huge_kib"] = huge_page_kib(view.ctypes.data)
    raw = None
    if args.raw_socket:
        from mooncake._native import bench

        raw = bench.RawSocketServer()
        info["raw_port"] = raw.start("127.0.0.1")
    print(json.dumps(info), flush=True)
    log(f"target '{ep.name}' serving {human(args.buffer_size)} at {ep.addr:#x}; close stdin or Ctrl-C to stop")
    try:
        sys.stdin.read()  # returns when the parent closes the pipe (or dies)
    except KeyboardInterrupt:
        pass
    if raw:
        raw.stop()
    return 0


class Target:
    """A target process started by demo/compare modes."""

    def __init__(self, metadata: str, name: str, size: int, raw_socket: bool, managed_size: int = 0,
                 page_buffers_size: int = 0):
        cmd = [sys.executable, "-m", "mooncake.transfer_engine_bench", "--mode", "target", "--metadata_server",
               metadata, "--local_server_name", name, "--buffer_size", str(size), "--managed_size",
               str(managed_size), "--page_buffers_size", str(page_buffers_size)]
        if raw_socket:
            cmd.append("--raw_socket")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("error: the target process failed to start (see its log above)")
        self.info = json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# --------------------------------------------------------------------------------------------------------
# measurements


def timed(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        rc = fn()
        out.append(time.perf_counter() - t)
        if rc != 0:
            raise SystemExit(f"error: transfer failed with {rc} (see the log above)")
    return out


def summary(lat: list[float], nbytes: int) -> dict:
    lat = sorted(lat)
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return {"gbps": nbytes * len(lat) / sum(lat) / 1e9, "p50_us": p50 * 1e6, "p99_us": p99 * 1e6}


def iterations(size: int, budget_bytes: int, lo: int = 5, hi: int = 2000) -> int:
    return max(lo, min(hi, budget_bytes // size))


CASES = [(4 * KiB, 1), (64 * KiB, 1), (1 * MiB, 1), (16 * MiB, 1), (64 * MiB, 1), (64 * KiB, 128)]


def te_op(ep: Endpoint, target: dict, write: bool, size: int, count: int):
    eng, seg = ep.engine, target["segment"]
    if count == 1:
        fn = eng.transfer_sync_write if write else eng.transfer_sync_read
        return lambda: fn(seg, ep.addr, target["buffer"], size)
    locals_ = [ep.addr + i * size for i in range(count)]
    remotes = [target["buffer"] + i * size for i in range(count)]
    lengths = [size] * count
    fn = eng.batch_transfer_sync_write if write else eng.batch_transfer_sync_read
    return lambda: fn(seg, locals_, remotes, lengths)


def demo_rows(ep: Endpoint, target: dict) -> tuple[list, int]:
    """Write and read back every size, verifying the data; then four verified 64 MiB round trips."""
    size = ep.buffer.nbytes
    rows, moved = [], 0
    rng = np.random.default_rng(7)
    check = np.empty(size, dtype=np.uint8)
    for n, _ in CASES[:-1]:
        iters = iterations(n, 256 * MiB, lo=8, hi=500)
        ep.buffer[:n] = rng.integers(0, 256, n, dtype=np.uint8)
        w = summary(timed(te_op(ep, target, True, n, 1), iters), n)
        saved = ep.buffer[:n].copy()
        ep.buffer[:n] = 0
        r = summary(timed(te_op(ep, target, False, n, 1), iters), n)
        if not np.array_equal(ep.buffer[:n], saved):
            raise SystemExit(f"error: data mismatch after a {human(n)} round trip")
        moved += 2 * n * iters
        rows.append((human(n), iters, w, r))
    for _ in range(4):
        ep.buffer[:] = rng.integers(0, 256, size, dtype=np.uint8)
        check[:] = ep.buffer
        if ep.engine.transfer_sync_write(target["segment"], ep.addr, target["buffer"], size):
            raise SystemExit("error: write failed")
        ep.buffer[:] = 0
        if ep.engine.transfer_sync_read(target["segment"], ep.addr, target["buffer"], size):
            raise SystemExit("error: read failed")
        if not np.array_equal(check, ep.buffer):
            raise SystemExit("error: data mismatch after a 64 MiB round trip")
        moved += 2 * size
    return rows, moved


def run_demo(args) -> int:
    from mooncake.http_metadata_server import HttpMetadataServer

    size = 64 * MiB
    tables = []
    with HttpMetadataServer("127.0.0.1", 0) as meta:
        log(f"metadata server at {meta.url}")
        target = Target(meta.url, "127.0.0.1:17001", size, raw_socket=False)
        try:
            for i, (label, force_tcp) in enumerate([("TCP (loopback)", True), ("same-host shared memory", False)]):
                ep = Endpoint(f"127.0.0.1:{17002 + i}", meta.url, size, force_tcp=force_tcp)
                rows, moved = demo_rows(ep, target.info)
                ep.engine.close()  # unpublish while the metadata server still runs
                tables.append((label, rows, moved))
        finally:
            target.close()
    for label, rows, moved in tables:
        print(f"\nTransfer Engine, {label}: 2 processes on 127.0.0.1, HTTP metadata; {moved / GiB:.2f} GiB moved, "
              "all verified\n")
        print(f"{'size':>9} {'iters':>6} | {'write GB/s':>10} {'p50 us':>9} {'p99 us':>9} | {'read GB/s':>10} "
              f"{'p50 us':>9} {'p99 us':>9}")
        for name, iters, w, r in rows:
            print(f"{name:>9} {iters:>6} | {w['gbps']:>10.2f} {w['p50_us']:>9.1f} {w['p99_us']:>9.1f} | "
                  f"{r['gbps']:>10.2f} {r['p50_us']:>9.1f} {r['p99_us']:>9.1f}")
    return 0


def wait_cpu_fraction(ep: Endpoint, target: dict) -> float:
    """CPU used by a thread blocked in get_batch_transfer_status while a large async batch runs."""
    n, count = 16 * MiB, 4
    locals_ = [ep.addr + i * n for i in range(count)]
    remotes = [target["buffer"] + i * n for i in range(count)]
    worst = 0.0
    for _ in range(3):
        bid = ep.engine.batch_transfer_async_read(target["segment"], locals_, remotes, [n] * count)
        if bid == 0:
            raise SystemExit("error: async submit failed")
        c0, t0 = time.thread_time(), time.perf_counter()
        if ep.engine.get_batch_transfer_status([bid]) != 0:
            raise SystemExit("error: async batch failed")
        worst = max(worst, (time.thread_time() - c0) / (time.perf_counter() - t0))
    return worst


def shm_parts(engine: TransferEngine) -> tuple[int, int]:
    """(parts, parts copied by helper threads) over all same-host peers of this engine."""
    peers = json.loads(engine.get_stats()).get("shm", {}).values()
    return sum(p.get("parts", 0) for p in peers), sum(p.get("helper_parts", 0) for p in peers)


def same_host_rows(metadata: str, tcp_ep: "Endpoint", target: dict, rounds: int) -> tuple[list[dict], int]:
    """64 MiB transfers between two processes of this host, each side its own registered memory: the target's
    engine-allocated (memfd, mapped here) buffer, and its ordinary anonymous memory with 4 KiB pages and with
    huge pages (cross-memory attach), each with one copy thread and with the default; TCP over loopback for
    scale. Returns the rows and how many bytes of the huge-page buffer the kernel backed with huge pages.
    Every transfer is paired with a single-core memcpy of the same 64 MiB timed right before it, and
    all cases take turns (A, B, C, ..., A, B, C, ...), so each ratio compares the same moment of the machine."""
    from mooncake._native import bench

    n = 64 * MiB
    single = Endpoint("127.0.0.1:17013", metadata, n, copy_threads=1)
    default = Endpoint("127.0.0.1:17014", metadata, n)
    threads = f"{os.environ['MC_SHM_COPY_THREADS']} threads" if "MC_SHM_COPY_THREADS" in os.environ else "default"
    paths = [("mapped, managed buffer", default, target["managed"]),
             ("attach, 4 KiB pages, 1 thread", single, target["pages_4k"]),
             (f"attach, 4 KiB pages, {threads}", default, target["pages_4k"]),
             ("attach, huge pages, 1 thread", single, target["pages_huge"]),
             (f"attach, huge pages, {threads}", default, target["pages_huge"]),
             ("tcp loopback (for scale)", tcp_ep, target["buffer"])]
    scratch = np.ones(n, dtype=np.uint8)
    cases = [(label, ep, remote, write) for label, ep, remote in paths for write in (True, False)]
    samples = {i: ([], [], [0, 0]) for i in range(len(cases))}  # transfer s, memcpy s, [parts, helper parts]
    for rnd in range(rounds * 4 + 1):  # round 0 warms up (maps the peer's memory, first touches)
        for i, (label, ep, remote, write) in enumerate(cases):
            copy_s = n / (bench.memcpy_bandwidth(scratch.ctypes.data, ep.addr, n, 1) * 1e9)
            before = shm_parts(ep.engine)
            lat = bench.time_engine(ep.engine, write, target["segment"], ep.addr, remote, n, 1, 1)[0]
            after = shm_parts(ep.engine)
            if rnd:
                samples[i][0].append(lat)
                samples[i][1].append(copy_s)
                samples[i][2][0] += after[0] - before[0]
                samples[i][2][1] += after[1] - before[1]
    single.engine.close()
    default.engine.close()
    rows = []
    for i, (label, ep, remote, write) in enumerate(cases):
        lat, copies, (parts, helper) = samples[i]
        ratios = sorted(c / t for c, t in zip(copies, lat))
        s = summary(lat, n)
        rows.append({"path": label, "op": "write" if write else "read", "gbps": s["gbps"],
                     "memcpy_gbps": n * len(copies) / sum(copies) / 1e9, "ratio": float(np.median(ratios)),
                     "ratio_min": ratios[0], "ratio_max": ratios[-1], "p50_us": s["p50_us"],
                     "helper_share": helper / parts if parts else 0.0})
    return rows, target["pages_huge_huge_kib"] * KiB


def print_same_host(rows: list[dict], huge_bytes: int, rounds: int) -> None:
    print(f"\nSame host, 64 MiB between two processes, each registering its own memory, vs a single-core memcpy of "
          f"64 MiB timed right before each transfer; {rounds * 4} interleaved rounds.\n(ratio: median [min..max] "
          "over those pairs; helpers: share of the copy's parts done by helper threads)\n")
    print(f"{'path':>32} {'op':>5} | {'GB/s':>6} {'memcpy':>6} | {'ratio':>5} {'min':>5} {'max':>5} | "
          f"{'helpers':>7} | {'p50 us':>7}")
    for r in rows:
        print(f"{r['path']:>32} {r['op']:>5} | {r['gbps']:>6.2f} {r['memcpy_gbps']:>6.2f} | {r['ratio']:>5.2f} "
              f"{r['ratio_min']:>5.2f} {r['ratio_max']:>5.2f} | {r['helper_share'] * 100:>6.0f}% | {r['p50_us']:>7.0f}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n(the kernel backed {huge_bytes / MiB:.0f} of the 64 MiB huge-page buffer with huge pages; default "
          f"threads: MC_SHM_COPY_THREADS unset, 2 or the usable CPUs if fewer; load average {load} on "
          f"{os.cpu_count()} CPUs)")


def tcp_results(args, ep: Endpoint, target: dict) -> dict:
    """TE over TCP vs the raw socket, per case: (TE latencies, raw latencies, paired throughput ratios)."""
    from mooncake._native import bench

    raw = bench.RawSocketClient()
    raw.connect("127.0.0.1", target["raw_port"])
    results = {}
    # Each case alternates short runs of the raw socket and of TE, so both see the same machine.
    for rnd in range(args.rounds):
        log(f"round {rnd + 1}/{args.rounds}")
        for n, count in CASES:
            iters = iterations(n * count, args.bytes_per_case, lo=10, hi=3000)
            chunk = max(1, iters // 10)
            for write in (True, False):
                acc = results.setdefault((n, count, "write" if write else "read"), ([], [], []))
                for _ in range(0, iters, chunk):
                    # Both sides are timed by a C++ loop (no interpreter between operations).
                    r_chunk = raw.timed(write, ep.addr, n, count, chunk)
                    t_chunk = bench.time_engine(ep.engine, write, target["segment"], ep.addr, target["buffer"], n,
                                                count, chunk)
                    acc[1].extend(r_chunk)
                    acc[0].extend(t_chunk)
                    acc[2].append(sum(r_chunk) / sum(t_chunk))  # paired: same moment, same machine
    return results


def run_compare(args) -> int:
    from mooncake._native import bench
    from mooncake.http_metadata_server import HttpMetadataServer

    size = 128 * MiB
    results, wait_cpu = {}, 0.0
    with HttpMetadataServer("127.0.0.1", 0) as meta:
        target = Target(meta.url, "127.0.0.1:17011", size, raw_socket=True, managed_size=64 * MiB,
                        page_buffers_size=64 * MiB)
        try:
            ep = Endpoint("127.0.0.1:17012", meta.url, size, force_tcp=True)
            src = np.ones(64 * MiB, dtype=np.uint8)
            dst = np.zeros(64 * MiB, dtype=np.uint8)
            memcpy = max(bench.memcpy_bandwidth(dst.ctypes.data, src.ctypes.data, dst.nbytes, 3) for _ in range(3))
            if not args.same_host_only:
                results = tcp_results(args, ep, target.info)
                wait_cpu = wait_cpu_fraction(ep, target.info)
            same_host, huge_bytes = same_host_rows(meta.url, ep, target.info, args.rounds)
            ep.engine.close()
        finally:
            target.close()
    rows = []
    for (n, count, op), (t_lat, r_lat, paired) in results.items():
        te, rs = summary(t_lat, n * count), summary(r_lat, n * count)
        rows.append({"size": n, "count": count, "op": op, "te_gbps": te["gbps"], "raw_gbps": rs["gbps"],
                     "throughput_ratio": float(np.median(paired)), "te_p50_us": te["p50_us"],
                     "te_p99_us": te["p99_us"], "raw_p50_us": rs["p50_us"], "raw_p99_us": rs["p99_us"],
                     "p50_ratio": te["p50_us"] / rs["p50_us"]})
    if args.json:
        print(json.dumps({"memcpy_gbps": memcpy, "wait_cpu_fraction": wait_cpu, "rows": rows,
                          "same_host": same_host, "same_host_huge_page_bytes": huge_bytes}, indent=1))
        return 0
    if rows:
        print(f"\nTE (TCP, 2 processes, loopback) vs a plain single-stream TCP socket doing the same work, "
              f"interleaved, {args.rounds} rounds\n(TE/raw throughput: median over back-to-back pairs of short runs)\n")
        print(f"{'case':>16} {'op':>5} | {'TE GB/s':>8} {'raw GB/s':>8} {'TE/raw':>6} | {'TE p50':>8} {'raw p50':>8} "
              f"{'TE/raw':>6} | {'TE p99':>8} {'raw p99':>8}   (latencies in us)")
        for r in rows:
            case = human(r["size"]) if r["count"] == 1 else f"{r['count']} x {human(r['size'])}"
            print(f"{case:>16} {r['op']:>5} | {r['te_gbps']:>8.2f} {r['raw_gbps']:>8.2f} {r['throughput_ratio']:>6.2f} "
                  f"| {r['te_p50_us']:>8.1f} {r['raw_p50_us']:>8.1f} {r['p50_ratio']:>6.2f} | {r['te_p99_us']:>8.1f} "
                  f"{r['raw_p99_us']:>8.1f}")
        print(f"\nsingle-core memcpy: {memcpy:.2f} GB/s; a thread waiting for a transfer used "
              f"{wait_cpu * 100:.1f}% of a core")
    print_same_host(same_host, huge_bytes, args.rounds)
    return 0


# --------------------------------------------------------------------------------------------------------
# initiator (Mooncake's load generator)


def run_initiator(args) -> int:
    ep = Endpoint(args.local_server_name, args.metadata_server, args.buffer_size, args.protocol, args.device_name)
    if not args.segment_id:
        raise SystemExit("error: --segment_id (the target's segment name) is required in initiator mode")
    remote = ep.engine.get_first_buffer_address(args.segment_id)
    if remote == 0:
        raise SystemExit(f"error: segment '{args.segment_id}' is unknown or has no registered buffer")
    span = args.batch_size * args.block_size
    if span * args.threads > args.buffer_size:
        raise SystemExit("error: --batch_size x --block_size x --threads exceeds --buffer_size")
    write = args.operation == "write"
    fn = ep.engine.batch_transfer_sync_write if write else ep.engine.batch_transfer_sync_read
    stop = time.monotonic() + args.duration
    done = [0] * args.threads
    failures = []

    def worker(i: int) -> None:
        base = i * span
        locals_ = [ep.addr + base + j * args.block_size for j in range(args.batch_size)]
        remotes = [remote + base + j * args.block_size for j in range(args.batch_size)]
        lengths = [args.block_size] * args.batch_size
        while time.monotonic() < stop:
            if fn(args.segment_id, locals_, remotes, lengths) != 0:
                failures.append(i)
                return
            done[i] += span

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        log(f"  {sum(done) / GiB:.2f} GiB moved after {time.monotonic() - t0:.0f} s")
    elapsed = time.monotonic() - t0
    total = sum(done)
    print(f"{args.operation}: {total / elapsed / GiB:.2f} GiB/s ({total / elapsed / 1e9:.2f} GB/s), "
          f"{total // (args.block_size or 1) / elapsed:.0f} req/s over {elapsed:.1f} s, {args.threads} thread(s), "
          f"batch {args.batch_size} x {human(args.block_size)}")
    moved = carried_bytes(ep.engine)
    print("carried by: " + (", ".join(f"{t} {human(n)}" for t, n in sorted(moved.items())) or "nothing"))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="transfer_engine_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["demo", "compare", "target", "initiator"], default="demo")
    p.add_argument("--metadata_server", default="P2PHANDSHAKE",
                   help="P2PHANDSHAKE or http://host:port/metadata (target/initiator modes)")
    p.add_argument("--local_server_name", default="127.0.0.1", help="this engine's name (host[:port])")
    p.add_argument("--segment_id", default="", help="initiator: the target's segment name")
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--device_name", default="", help="comma-separated NIC allow-list")
    p.add_argument("--operation", choices=["read", "write"], default="read")
    p.add_argument("--buffer_size", type=parse_size, default=GiB)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--block_size", type=parse_size, default=64 * KiB)
    p.add_argument("--duration", type=float, default=10.0, help="initiator: seconds to run")
    p.add_argument("--threads", type=int, default=1, help="initiator: submitting threads")
    p.add_argument("--raw_socket", action="store_true", help="target: also serve the raw-socket yardstick")
    p.add_argument("--managed_size", type=parse_size, default=0,
                   help="target: also expose this much engine-allocated (shareable) memory")
    p.add_argument("--page_buffers_size", type=parse_size, default=0,
                   help="target: also register two anonymous buffers of this size, 4 KiB pages and huge pages")
    p.add_argument("--same_host_only", action="store_true",
                   help="compare: only the same-host table (skip the TCP cases)")
    p.add_argument("--rounds", type=int, default=3, help="compare: interleaved rounds")
    p.add_argument("--bytes_per_case", type=parse_size, default=256 * MiB, help="compare: bytes per case and round")
    p.add_argument("--json", action="store_true", help="compare: print JSON")
    args = p.parse_args(argv)
    random.seed(7)
    handlers = {"demo": run_demo, "compare": run_compare, "target": run_target, "initiator": run_initiator}
    try:
        return handlers[args.mode](args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
