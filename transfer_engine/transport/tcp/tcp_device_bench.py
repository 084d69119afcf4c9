"""tcp throughput with device memory on both sides (staged through pinned buffers) against host memory on both
sides, between two processes on 127.0.0.1, measured interleaved in one run. The device is the host EMULATION
(memfd memory, copies by one worker thread), so the ratio shows the staging's own cost, not a GPU's.

  bazel run //transfer_engine/transport/tcp:tcp_device_bench -- [--rounds 5] [--bytes_per_case 256MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tcp_device_peer  # noqa: E402
from tcp_device_peer import DeviceBuffers, DevicePeer  # noqa: E402

SIZE = 64 << 20


def gbps(engine, peer, local: DeviceBuffers, kind: str, op: str, block: int, total: int) -> float:
    fn = engine.transfer_sync_write if op == "write" else engine.transfer_sync_read
    n = max(1, total // block)
    t0 = time.perf_counter()
    for i in range(n):
        off = (i * block) % SIZE
        rc = fn(peer.segment, local.addr(kind) + off, peer.info[kind] + off, block)
        if rc != 0:
            raise RuntimeError(f"{op} of {block} bytes ({kind}) returned {rc}")
    return n * block / (time.perf_counter() - t0) / 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--bytes_per_case", type=int, default=256 << 20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    os.environ["MC_FORCE_TCP"] = "1"  # host to host would otherwise go over the same-host transport (the child inherits it)
    engine = tcp_device_peer.new_engine()
    local = DeviceBuffers(engine, SIZE)
    peer = DevicePeer(SIZE)
    rows = []
    try:
        for block in (1 << 20, 64 << 20):
            for op in ("write", "read"):
                for kind in ("host", "device"):  # warm-up: connections, staging buffers, first touches
                    gbps(engine, peer, local, kind, op, block, block * 2)
                ratios, host, dev = [], [], []
                for _ in range(args.rounds):
                    h = gbps(engine, peer, local, "host", op, block, args.bytes_per_case)
                    d = gbps(engine, peer, local, "device", op, block, args.bytes_per_case)
                    host.append(h)
                    dev.append(d)
                    ratios.append(d / h)
                rows.append({"block": block, "op": op, "host_gbps": statistics.median(host),
                             "device_gbps": statistics.median(dev), "ratio": statistics.median(ratios),
                             "ratio_min": min(ratios), "ratio_max": max(ratios)})
    finally:
        peer.close()
        engine.close()
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"tcp, device (emulated) vs host memory on both sides, {args.rounds} interleaved rounds (medians)")
        for r in rows:
            print(f"{r['block'] >> 20:>3} MiB {r['op']:<5} host {r['host_gbps']:.2f} GB/s  device "
                  f"{r['device_gbps']:.2f} GB/s  ratio {r['ratio']:.2f} [{r['ratio_min']:.2f}..{r['ratio_max']:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
