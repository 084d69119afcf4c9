"""Store client benchmark against Redis, measured in one run and interleaved (same machine, same moment).

  bazel run //store/client:store_bench -- [--iters 200] [--sizes 4K,64K,1M,16M] [--sections ...] [--json out.json]

Setup: a real ``mooncake_master``, a store client process B holding a large segment (the "remote" data),
this process as client A (its own segment is the "local" data), and a Debian ``redis-server`` reached with
redis-py. For every value size, each iteration runs, back to back: store put, Redis SET, store get, Redis
GET (so drift hits both equally). Reported per size and placement (remote: replica in B's segment; local:
replica in A's own segment): put/get p50/p99 latency and throughput (bytes / mean latency), the ratio to
Redis, the first ("cold") get after a put, batch put/get of 64 x 64 KiB, bytes and zero copy (Redis: MSET/MGET),
single-thread 4 KiB get/put ops/s for --seconds, local-segment get_into vs a single-core memcpy
(numpy copyto) of the same size into the same registered buffer, remote 16 MiB put/get of ``bytes``
against put_from/get_into with HTTP metadata (bench_bytes_vs_zero_copy), and a layer-wise load of --layers
layers (bench_layerwise: one get session against one batch_get_into per layer). --sections picks sections.

Gets cycle over a few keys, so after the first get of a key its descriptors come from the client's lease
cache (see store/client/core.py); "cold get" is the get that pays the master round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from mooncake.store.client.config import parse_size
from mooncake.store.client.testing import StoreWorker
from mooncake.store.master.testing import MasterProcess

KiB, MiB = 1 << 10, 1 << 20
GET_KEYS = 4


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def _summary(lat: list[float], size: int) -> dict:
    mean = statistics.fmean(lat)
    return {"p50_us": _pct(lat, 50) * 1e6, "p99_us": _pct(lat, 99) * 1e6, "MBps": size / mean / 1e6}


def settle(store, limit: float = 30.0) -> float:
    """Waits (at most `limit` s) until the engine's same-host transport has filled the page tables of the
    peer segments it mapped (a background thread, seconds for GiBs, that would share the CPU with the timed
    loop); returns the seconds waited."""
    engine = getattr(store, "_engine", None)
    t0 = time.perf_counter()
    while engine is not None and time.perf_counter() - t0 < limit:
        peers = json.loads(engine.get_stats()).get("shm", {})
        if not any(p.get("filling_mappings", 0) for p in peers.values()):
            break
        time.sleep(0.05)
    return time.perf_counter() - t0


def bench_size(store, r, size: int, iters: int, where: str, cfg: ReplicateConfig) -> dict:
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    lat = {k: [] for k in ("put", "set", "get", "rget", "cold")}
    for k in range(GET_KEYS):
        assert store.put(f"g{where}{size}-{k}", value, cfg) == 0
        r.set(f"g{where}{size}-{k}", value)
    settle(store)
    for i in range(iters):
        key = f"p{where}{size}-{i}"
        lat["put"].append(_timed(store.put, key, value, cfg))
        lat["set"].append(_timed(r.set, key, value))
        if i < min(iters, 50):
            lat["cold"].append(_timed(store.get, key))
        gk = f"g{where}{size}-{i % GET_KEYS}"
        t = time.perf_counter()
        got = store.get(gk)
        lat["get"].append(time.perf_counter() - t)
        t = time.perf_counter()
        rgot = r.get(gk)
        lat["rget"].append(time.perf_counter() - t)
        if i == 0:
            assert got == value and rgot == value, "data mismatch"
        if (i + 1) * size >= 128 * MiB or i == iters - 1:  # bounded memory: drop the put keys as we go
            store.remove_by_regex(f"^p{where}{size}-", force=True)
            r.flushdb()
            for k in range(GET_KEYS):
                r.set(f"g{where}{size}-{k}", value)
    store.remove_by_regex(f"^g{where}{size}-", force=True)
    out = {"size": size, "where": where}
    for name, key in (("put", "put"), ("redis_set", "set"), ("get", "get"), ("redis_get", "rget"),
                      ("cold_get", "cold")):
        out[name] = _summary(lat[key], size)
    out["put_vs_redis"] = out["put"]["MBps"] / out["redis_set"]["MBps"]
    out["get_vs_redis"] = out["get"]["MBps"] / out["redis_get"]["MBps"]
    out["get_p50_vs_redis"] = out["get"]["p50_us"] / out["redis_get"]["p50_us"]
    out["put_p50_vs_redis"] = out["put"]["p50_us"] / out["redis_set"]["p50_us"]
    return out


def bench_batch(store, r, cfg, iters: int) -> dict:
    """64 x 64 KiB: put_batch / get_batch of bytes and batch_put_from / batch_get_into of a registered buffer
    (the zero-copy calls vLLM, SGLang and LMCache use), against pipelined MSET / MGET of the same values."""
    n, size = 64, 64 * KiB
    vals = [np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes() for i in range(n)]
    buf = np.zeros(2 * n * size, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    buf[:n * size] = np.frombuffer(b"".join(vals), dtype=np.uint8)
    srcs = [buf.ctypes.data + j * size for j in range(n)]
    dsts = [buf.ctypes.data + (n + j) * size for j in range(n)]
    lat = {k: [] for k in ("put", "mset", "get", "mget", "put_from", "get_into")}
    for i in range(max(3, iters // 10)):
        keys = [f"b{i}-{j}" for j in range(n)]
        zkeys = [f"bz{i}-{j}" for j in range(n)]
        lat["put"].append(_timed(store.put_batch, keys, vals, cfg))
        lat["mset"].append(_timed(r.mset, dict(zip(keys, vals))))
        lat["put_from"].append(_timed(store.batch_put_from, zkeys, srcs, [size] * n, cfg))
        lat["get"].append(_timed(store.get_batch, keys))
        lat["mget"].append(_timed(r.mget, keys))
        lat["get_into"].append(_timed(store.batch_get_into, zkeys, dsts, [size] * n))
        if i == 0:
            assert store.get_batch(keys[:2]) == vals[:2] and (buf[n * size:] == buf[:n * size]).all()
        store.remove_by_regex("^b", force=True)
        r.flushdb()
    store.unregister_buffer(buf.ctypes.data)
    out = {k: _summary(v, n * size) for k, v in lat.items()}
    for k in ("put", "put_from"):
        out[k + "_vs_mset"] = out[k]["MBps"] / out["mset"]["MBps"]
    for k in ("get", "get_into"):
        out[k + "_vs_mget"] = out[k]["MBps"] / out["mget"]["MBps"]
    return out


def bench_ops(store, r, cfg, seconds: float) -> dict:
    value = b"x" * (4 * KiB)
    store.put("ops", value, cfg)
    r.set("ops", value)
    out = {}
    for name, fn in (("store_get", lambda i: store.get("ops")), ("redis_get", lambda i: r.get("ops")),
                     ("store_put", lambda i: store.put(f"o{i}", value, cfg)),
                     ("redis_set", lambda i: r.set(f"o{i}", value))):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn(n)
            n += 1
        out[name] = n / (time.perf_counter() - t0)
    store.remove_all(force=True)
    r.flushdb()
    return out


def bench_get_into(store, size: int, iters: int) -> dict:
    buf = np.zeros(2 * size, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    buf[:size] = src
    cfg = ReplicateConfig(preferred_segments=[store.get_hostname()])
    assert store.put_from("gi", buf.ctypes.data, size, cfg) == 0
    dst = buf[size:]
    gi, mc = [], []
    for _ in range(iters):
        gi.append(_timed(store.get_into, "gi", dst.ctypes.data, size))
        mc.append(_timed(np.copyto, dst, src))
    assert (dst == src).all()
    store.remove("gi", force=True)
    store.unregister_buffer(buf.ctypes.data)
    gi_bw, mc_bw = size / statistics.median(gi) / 1e9, size / statistics.median(mc) / 1e9
    return {"size": size, "get_into_GBps": gi_bw, "memcpy_GBps": mc_bw, "ratio": gi_bw / mc_bw}


def bench_bytes_vs_zero_copy(size: int, iters: int, protocol: str = "tcp", device: str = "") -> dict:
    """Remote put/get of a `bytes` value against put_from/get_into of the same size, in the setup users
    reported (HTTP metadata; a peer with a 512 MiB segment and a 128 MiB buffer holds the replica; the writer
    has a 64 MiB buffer from register_buffer). Byte puts of >= 2 MiB register the value for the transfer, and
    each registration is published to the metadata server: this is where a slow metadata round trip shows.
    Removed objects stay allocated while the read lease of their get lasts (10 s): `iters` <= 10 fits."""
    from mooncake.http_metadata_server import HttpMetadataServer

    # A master of its own: clients on P2P metadata (the other sections) cannot be reached from HTTP metadata.
    with HttpMetadataServer("127.0.0.1", 0) as meta:
        url = f"http://127.0.0.1:{meta.port}/metadata"
        master_proc = MasterProcess("--eviction_high_watermark_ratio=1.0")
        master = master_proc.address
        peer = StoreWorker(master, segment="512MB", buffer="128MB", metadata=url, protocol=protocol, device=device)
        store = MooncakeDistributedStore()
        try:
            assert store.setup("127.0.0.1", url, "0", "64MB", protocol, device, master) == 0
            buf = np.zeros(4 * size, dtype=np.uint8)
            assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
            value = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes()
            buf[:size] = np.frombuffer(value, dtype=np.uint8)
            cfg = ReplicateConfig(replica_num=1, preferred_segment=peer.hostname)
            lat = {k: [] for k in ("put", "get", "put_from", "get_into")}
            for i in range(iters):
                codes = []
                lat["put"].append(_timed(lambda: codes.append(store.put(f"zb{i}", value, cfg))))
                lat["get"].append(_timed(lambda: codes.append(len(store.get(f"zb{i}")) - size)))
                lat["put_from"].append(_timed(lambda: codes.append(store.put_from(f"zz{i}", buf.ctypes.data, size,
                                                                                  cfg))))
                lat["get_into"].append(_timed(lambda: codes.append(
                    store.get_into(f"zz{i}", buf.ctypes.data + 2 * size, size) - size)))
                assert codes == [0] * 4, codes
                if i == 0:
                    assert store.get("zb0") == value and (buf[2 * size:3 * size] == buf[:size]).all()
                store.remove(f"zb{i}", force=True)
                store.remove(f"zz{i}", force=True)
            store.unregister_buffer(buf.ctypes.data)
        finally:
            store.close()
            peer.stop()
            master_proc.stop()
    out = {k: _summary(v, size) for k, v in lat.items()}
    out["size"] = size
    out["put_vs_put_from"] = out["put"]["p50_us"] / out["put_from"]["p50_us"]
    out["get_vs_get_into"] = out["get"]["p50_us"] / out["get_into"]["p50_us"]
    return out


def bench_layerwise(store, cfg, iters: int, layers: int = 64, keys: int = 16, layer_bytes: int = 16 * KiB) -> dict:
    """A layer-wise load (SGLang's layer-by-layer KV loading) of `keys` pages of `layers` layers, remote: one get
    session (batch_get_session_start, one batch_get_into_multi_buffer_ranges per layer, batch_get_session_end)
    over one object per page, against the same bytes stored as one object per page and layer and loaded with
    one batch_get_into per layer (`layers` calls). Interleaved per iteration: the per-layer load cold (the
    client's descriptor cache dropped first, as for a prefix loaded once: a lookup per call) and warm
    (descriptors cached), then the session load (which always looks up once). Same destination layout: layer
    l of page i at (l * keys + i) * layer_bytes."""
    page = layers * layer_bytes
    total = keys * page
    buf = np.zeros(2 * total, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    src, dst = buf.ctypes.data, buf.ctypes.data + total
    buf[:total] = np.random.default_rng(3).integers(0, 256, total, dtype=np.uint8)
    pages = [f"lw-p{i}" for i in range(keys)]
    per_layer = [[f"lw-l{l}-p{i}" for i in range(keys)] for l in range(layers)]
    assert store.batch_put_from(pages, [src + i * page for i in range(keys)], [page] * keys, cfg) == [0] * keys
    for l in range(layers):
        assert store.batch_put_from(per_layer[l], [src + i * page + l * layer_bytes for i in range(keys)],
                                    [layer_bytes] * keys, cfg) == [0] * keys
    dsts = [[dst + (l * keys + i) * layer_bytes for i in range(keys)] for l in range(layers)]

    def per_layer_load() -> None:
        for l in range(layers):
            assert store.batch_get_into(per_layer[l], dsts[l], [layer_bytes] * keys) == [layer_bytes] * keys

    def cold_load() -> None:
        store.cache_clear()
        per_layer_load()

    def session_load() -> None:
        assert store.batch_get_session_start(pages) == [0] * keys
        sizes, ptrs = [[layer_bytes]] * keys, [[[p] for p in dsts[l]] for l in range(layers)]
        for l in range(layers):
            offs = [[l * layer_bytes]] * keys
            assert store.batch_get_into_multi_buffer_ranges(pages, ptrs[l], sizes, offs) == [layer_bytes] * keys
        assert store.batch_get_session_end(pages) == 0

    expect = buf[:total].reshape(keys, layers, layer_bytes).transpose(1, 0, 2)
    lat = {"per_layer_cold": [], "per_layer_warm": [], "session": []}
    for i in range(max(3, iters // 10)):
        for name, fn in (("per_layer_cold", cold_load), ("per_layer_warm", per_layer_load),
                         ("session", session_load)):
            buf[total:] = 0
            lat[name].append(_timed(fn))
            if i == 0:
                assert (buf[total:].reshape(layers, keys, layer_bytes) == expect).all(), name
    store.remove_by_regex("^lw-", force=True)
    store.unregister_buffer(buf.ctypes.data)
    out = {k: _summary(v, total) for k, v in lat.items()}
    out.update(layers=layers, keys=keys, layer_bytes=layer_bytes,
               cold_vs_session=out["per_layer_cold"]["p50_us"] / out["session"]["p50_us"],
               warm_vs_session=out["per_layer_warm"]["p50_us"] / out["session"]["p50_us"])
    return out


SECTIONS = ("sizes", "batch", "ops", "get_into", "bytes", "layerwise")


def run(iters: int, sizes: list[int], seconds: float, remote_segment: str = "2GB", local_segment: str = "1GB",
        sections=SECTIONS, layers: int = 64, protocol: str = "tcp", device: str = "") -> dict:
    """Segments must hold what the run puts while read leases (10 s) keep removed buffers held."""
    import redis

    from mooncake.testing.services import Redis

    master = MasterProcess("--eviction_high_watermark_ratio=1.0")
    srv = Redis()
    remote = StoreWorker(master.address, segment=remote_segment, buffer="16MB", protocol=protocol, device=device)
    store = MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", local_segment, "64MB", protocol, device, master.address) == 0
        r = redis.Redis(host="127.0.0.1", port=srv.port)
        remote_cfg = ReplicateConfig(preferred_segments=[remote.hostname])
        local_cfg = ReplicateConfig(preferred_segments=[store.get_hostname()])
        out = {"sizes": [], "iters": iters}
        if "sizes" in sections:
            for size in sizes:
                n = max(5, min(iters, (256 * MiB) // size))
                out["sizes"].append(bench_size(store, r, size, n, "remote", remote_cfg))
                out["sizes"].append(bench_size(store, r, size, n, "local", local_cfg))
        if "batch" in sections:
            out["batch_64x64KiB_remote"] = bench_batch(store, r, remote_cfg, iters)
        if "ops" in sections:
            out["ops_4KiB_remote"] = bench_ops(store, r, remote_cfg, seconds)
        if "get_into" in sections:
            out["get_into_local"] = [bench_get_into(store, s, max(5, min(iters, 64))) for s in (MiB, 16 * MiB)]
        if "bytes" in sections:
            out["bytes_vs_zero_copy_http"] = bench_bytes_vs_zero_copy(16 * MiB, max(5, min(iters, 10)), protocol, device)
        if "layerwise" in sections:
            out["layerwise_remote"] = bench_layerwise(store, remote_cfg, iters, layers=layers)
        return out
    finally:
        store.close()
        remote.stop()
        srv.close()
        master.stop()


def report(out: dict) -> str:
    lines = [f"{'size':>6} {'where':6} | {'put p50/p99 us':>17} {'SET p50/p99':>17} {'x thr':>5} {'p50 x':>5} | "
             f"{'get p50/p99 us':>17} {'GET p50/p99':>17} {'x thr':>5} {'p50 x':>5} | cold get p50"][:len(out["sizes"])]
    for s in out["sizes"]:
        def f(d):
            return f"{d['p50_us']:8.0f}/{d['p99_us']:<8.0f}"
        size = f"{s['size'] // KiB}K" if s["size"] < MiB else f"{s['size'] // MiB}M"
        lines.append(f"{size:>6} {s['where']:6} | {f(s['put'])} {f(s['redis_set'])} {s['put_vs_redis']:5.2f} "
                     f"{s['put_p50_vs_redis']:5.2f} | "
                     f"{f(s['get'])} {f(s['redis_get'])} {s['get_vs_redis']:5.2f} {s['get_p50_vs_redis']:5.2f} | "
                     f"{s['cold_get']['p50_us']:.0f} us")
    b = out.get("batch_64x64KiB_remote")
    if b:
        lines.append("batch 64 x 64 KiB (remote), p50 ms: put_batch %.2f  batch_put_from %.2f  MSET %.2f  |  "
                     "get_batch %.2f  batch_get_into %.2f  MGET %.2f" % tuple(b[k]["p50_us"] / 1e3 for k in (
                         "put", "put_from", "mset", "get", "get_into", "mget")))
        lines.append("  throughput x MSET: put_batch %.2f  batch_put_from %.2f;  x MGET: get_batch %.2f  "
                     "batch_get_into %.2f" % (b["put_vs_mset"], b["put_from_vs_mset"], b["get_vs_mget"],
                                              b["get_into_vs_mget"]))
    o = out.get("ops_4KiB_remote")
    if o:
        lines.append("single thread 4 KiB ops/s: store get %.0f  Redis GET %.0f  store put %.0f  Redis SET %.0f" % (
            o["store_get"], o["redis_get"], o["store_put"], o["redis_set"]))
    for g in out.get("get_into_local", []):
        lines.append("local get_into %d MiB: %.2f GB/s vs memcpy %.2f GB/s = %.2fx" % (
            g["size"] // MiB, g["get_into_GBps"], g["memcpy_GBps"], g["ratio"]))
    z = out.get("bytes_vs_zero_copy_http")
    if z:
        lines.append("16 MiB remote, HTTP metadata, p50 ms: put %.2f put_from %.2f (%.2fx)  get %.2f get_into %.2f "
                     "(%.2fx)" % (z["put"]["p50_us"] / 1e3, z["put_from"]["p50_us"] / 1e3, z["put_vs_put_from"],
                                  z["get"]["p50_us"] / 1e3, z["get_into"]["p50_us"] / 1e3, z["get_vs_get_into"]))
    w = out.get("layerwise_remote")
    if w:
        lines.append("layer-wise load, %d layers x %d pages x %d KiB (remote), p50 ms: %d batch_get_into cold %.2f  "
                     "warm %.2f  |  get session %.2f  =>  %.2fx (cold), %.2fx (warm) the session's time" % (
                         w["layers"], w["keys"], w["layer_bytes"] // KiB, w["layers"],
                         w["per_layer_cold"]["p50_us"] / 1e3, w["per_layer_warm"]["p50_us"] / 1e3,
                         w["session"]["p50_us"] / 1e3, w["cold_vs_session"], w["warm_vs_session"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--sizes", default="4K,64K,1M,16M")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help="comma-separated, of: " + ", ".join(SECTIONS) + " (default: all)")
    p.add_argument("--layers", type=int, default=64, help="layers of the layer-wise load (default 64)")
    p.add_argument("--json", default="")
    p.add_argument("--protocol", default="tcp", help="the transfer engine's protocol (tcp, rdma, efa, ...)")
    p.add_argument("--device", default="", help="the protocol's device names (device_name)")
    args = p.parse_args(argv)
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    out = run(args.iters, [parse_size(s) for s in args.sizes.split(",")], args.seconds, sections=sections,
              layers=args.layers, protocol=args.protocol, device=args.device)
    print(report(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
