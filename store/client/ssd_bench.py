"""SSD tier reads of another client's disk replicas: straight from the owner's file (file transport) against
through the owner (ReadDiskObject + a Transfer Engine read of its staging + ReleaseDiskObject), in one run.

  bazel run //store/client:ssd_bench -- [--sizes 64K,1M,4M] [--mib 32]

Setup: a real master, an owner process A with an SSD tier on /tmp (ext4) and a small segment, and two reader
clients in this process, one reading owners' files itself (the file plugin from MC_PLUGIN_DIR), one forced to
ask the owner. Per size, A puts --mib MiB of objects, persists them and puts three times its segment of other
objects, so the measured ones are on disk only; then every object is read once by each reader, alternating
(each reads a key once: no promotion to memory). Printed per size: p50 latency and throughput of each path
and the ratio direct / through the owner (> 1: the direct path is faster). The files were just written, so
both paths read the page cache: the owner's pread and the reader's file transport (the store opens these
files without O_DIRECT).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("MC_PLUGIN_DIR", os.path.join(HERE, "..", "..", "transfer_engine", "transport", "file"))

from mooncake.store import MooncakeDistributedStore  # noqa: E402
from mooncake.store.client.config import parse_size  # noqa: E402
from mooncake.store.client.store_worker import pattern  # noqa: E402
from mooncake.store.client.testing import StoreWorker  # noqa: E402
from mooncake.store.master.testing import MasterProcess  # noqa: E402

SEGMENT = 16 << 20


def _reader(master: str, direct: bool, protocol: str = "tcp", device: str = "") -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, "64MB", protocol, device, master) == 0
    s._file_reads = direct  # decided once per client (disk_link._file_reads_enabled); forced here
    return s


def _stage(owner: StoreWorker, prefix: str, size: int, count: int) -> None:
    per_round = max(1, SEGMENT // 2 // size)  # persisted before the next round evicts them from memory
    for i in range(count):
        code, deadline = -1, time.monotonic() + 30
        while code != 0 and time.monotonic() < deadline:  # a full segment: wait for the master's eviction
            code = owner.call("put", f"{prefix}{i}", pattern(size, i))
            if code != 0:
                time.sleep(0.05)
        if code != 0:
            raise RuntimeError(f"put {prefix}{i} failed: {code}")
        if (i + 1) % per_round == 0:
            assert owner.request({"op": "flush_disk"})["done"]
    assert owner.request({"op": "flush_disk"})["done"]
    filler = 256 << 10
    for i in range(3 * SEGMENT // filler):
        deadline = time.monotonic() + 30
        while owner.call("put", f"{prefix}-fill{i}", pattern(filler, 7)) != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the segment stays full")
            time.sleep(0.05)
    descs = owner.request({"op": "descs", "key": f"{prefix}0"})["descs"]
    if [(d["memory"], d["local_disk"]) for d in descs] != [(False, True)]:
        raise RuntimeError(f"{prefix}0 is not on disk only: {descs}")


def run(sizes: list[int], mib: int, protocol: str = "tcp", device: str = "") -> list[dict]:
    master = MasterProcess("--eviction_high_watermark_ratio=0.9", "--default_kv_lease_ttl=100")
    ssd = tempfile.mkdtemp(prefix="mc-ssd-bench-", dir="/tmp")
    owner = StoreWorker(master.address, str(SEGMENT), "64MB", ssd=ssd, env={"MC_STORE_HEARTBEAT_INTERVAL": "0.2"},
                        protocol=protocol, device=device)
    direct, through = _reader(master.address, True, protocol, device), _reader(master.address, False, protocol, device)
    rows = []
    try:
        for size in sizes:
            count = max(8, (mib << 20) // size)
            prefix = f"s{size}-"
            _stage(owner, prefix, size, count)
            times = {"direct": [], "owner": []}
            for i in range(count):
                key, want = f"{prefix}{i}", pattern(size, i)
                for name, reader in (("direct", direct), ("owner", through)) if i % 2 else \
                        (("owner", through), ("direct", direct)):
                    t0 = time.perf_counter()
                    got = reader.get(key)
                    times[name].append(time.perf_counter() - t0)
                    if got != want:
                        raise RuntimeError(f"{name} read of {key} returned other bytes")
            row = {"size": size, "count": count}
            for name, ts in times.items():
                row[f"{name}_p50_us"] = statistics.median(ts) * 1e6
                row[f"{name}_mbps"] = size / statistics.mean(ts) / 1e6
            row["ratio"] = row["direct_mbps"] / row["owner_mbps"]
            rows.append(row)
            print(f"{size >> 10:>6} KiB x {count:<4}  direct p50 {row['direct_p50_us']:8.0f} us "
                  f"{row['direct_mbps']:8.0f} MB/s   through owner p50 {row['owner_p50_us']:8.0f} us "
                  f"{row['owner_mbps']:8.0f} MB/s   direct/owner {row['ratio']:.2f}x", flush=True)
    finally:
        direct.close()
        through.close()
        owner.stop()
        master.stop()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64K,1M,4M")
    p.add_argument("--mib", type=int, default=32, help="MiB of objects per size (default 32)")
    p.add_argument("--protocol", default="tcp", help="the transfer engine's protocol (tcp, rdma, efa, ...)")
    p.add_argument("--device", default="", help="the protocol's device names (device_name)")
    args = p.parse_args(argv)
    run([parse_size(s) for s in args.sizes.split(",")], args.mib, args.protocol, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
