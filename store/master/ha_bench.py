"""Master HA figures, measured in one run (``bazel run //store/master:ha_bench -- --kills 10``):

- failover time: SIGKILL of the leader to the first successful put through the new one, p50 and max over
  ``--kills`` kills, against the election lease TTL (goal: < 2x TTL);
- put and get throughput of one store client with the op log on (HA leader, 3-member etcd) against a single
  master without HA, interleaved rounds (goal: >= 0.8x);
- standby lag under that load (ops the standby had not applied yet, sampled), and the leader's memory per
  object (RSS growth over ``--objects`` small objects).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request

from mooncake.store.client.store_worker import pattern
from mooncake.store.client.testing import StoreWorker
from mooncake.store.master.testing import MasterProcess
from mooncake.testing.services import EtcdCluster


def _health(m: MasterProcess) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/health", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _ha_master(endpoints: str, ttl: float) -> MasterProcess:
    return MasterProcess("--enable_ha", "--ha_backend_type=etcd", f"--ha_backend_connstring={endpoints}",
                         f"--ha_lease_ttl={ttl}", "--oplog_poll_interval_ms=50")


def _leader(masters, timeout: float = 30.0) -> MasterProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ls = [m for m in masters if m.proc.poll() is None and _health(m).get("role") == "leader"]
        if len(ls) == 1:
            return ls[0]
        time.sleep(0.02)
    raise RuntimeError("no leader")


def _throughput(w: StoreWorker, prefix: str, n: int, size: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    r = w.request({"op": "fill", "prefix": prefix, "count": n, "size": size, "seed": 1}, timeout=300)
    t1 = time.perf_counter()
    assert r["codes"] == {"0": n}, r
    v = w.request({"op": "verify", "prefix": prefix, "count": n, "size": size, "seed": 1}, timeout=300)
    t2 = time.perf_counter()
    assert not v["bad"], v["bad"][:3]
    return n / (t1 - t0), n / (t2 - t1)


def _concurrent_puts(workers, prefix: str, n: int, size: int) -> float:
    """Puts per second of `workers` filling `n` keys each at once (one thread per client process)."""
    import threading

    out = []
    t0 = time.perf_counter()
    threads = [threading.Thread(target=lambda w=w, i=i: out.append(w.request(
        {"op": "fill", "prefix": f"{prefix}{i}-", "count": n, "size": size, "seed": 1}, timeout=600)))
        for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    assert all(r["codes"] == {"0": n} for r in out), out
    return len(workers) * n / dt


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--ttl", type=float, default=2.0)
    p.add_argument("--ops", type=int, default=2000, help="puts (and gets) per throughput round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--objects", type=int, default=20000)
    args = p.parse_args(argv)
    size = 4096
    with EtcdCluster(3) as etcd:
        masters = [_ha_master(etcd.endpoints, args.ttl) for _ in range(2)]
        plain = MasterProcess()
        workers = []
        try:
            leader = _leader(masters)
            ha_w = StoreWorker("etcd://" + etcd.endpoints, segment="256MB", buffer="16MB")
            workers.append(ha_w)
            plain_w = StoreWorker(plain.address, segment="256MB", buffer="16MB")
            workers.append(plain_w)
            # -- throughput, interleaved rounds; standby lag sampled during the HA rounds -----------------------
            on, off, lags = [], [], []
            for r in range(args.rounds):
                off.append(_throughput(plain_w, f"off{r}-", args.ops, size))
                standby = next(m for m in masters if m is not leader)
                on.append(_throughput(ha_w, f"on{r}-", args.ops, size))
                lead_ops = _health(leader).get("ha", {}).get("applied_ops", 0)
                lags.append(max(0, lead_ops - _health(standby).get("ha", {}).get("applied_ops", 0)))
            more_ha = [StoreWorker("etcd://" + etcd.endpoints, segment="64MB", buffer="8MB") for _ in range(3)]
            more_plain = [StoreWorker(plain.address, segment="64MB", buffer="8MB") for _ in range(3)]
            workers += more_ha + more_plain
            conc_off = _concurrent_puts([plain_w] + more_plain, "coff-", args.ops // 2, size)
            conc_on = _concurrent_puts([ha_w] + more_ha, "con-", args.ops // 2, size)
            put_ratio = statistics.median(a[0] for a in on) / statistics.median(a[0] for a in off)
            get_ratio = statistics.median(a[1] for a in on) / statistics.median(a[1] for a in off)
            # -- memory per object (log on) ----------------------------------------------------------------------
            before = _rss_kib(leader.proc.pid)
            ha_w.request({"op": "fill", "prefix": "mem-", "count": args.objects, "size": 64, "seed": 2}, timeout=600)
            per_object = (_rss_kib(leader.proc.pid) - before) * 1024 / args.objects
            # -- failover --------------------------------------------------------------------------------------
            times = []
            for k in range(args.kills):
                killed = time.monotonic()
                leader.kill()
                masters.remove(leader)
                masters.append(_ha_master(etcd.endpoints, args.ttl))
                i = 0
                while ha_w.call("put", f"fo{k}-{i}", pattern(size, i), timeout=120) != 0:
                    i += 1
                times.append(time.monotonic() - killed)
                leader = _leader(masters)
        finally:
            for w in workers:
                w.stop()
            for m in masters + [plain]:
                m.stop()
    print(f"failover (kill -> first put on the new leader) over {len(times)} kills: p50 {statistics.median(times):.2f} s,"
          f" max {max(times):.2f} s; lease TTL {args.ttl:.1f} s -> p50 {statistics.median(times) / args.ttl:.2f}x,"
          f" max {max(times) / args.ttl:.2f}x TTL")
    print(f"throughput, op log on / off ({args.ops} x {size} B, {args.rounds} rounds, median): put {put_ratio:.2f}x "
          f"({statistics.median(a[0] for a in on):.0f} vs {statistics.median(a[0] for a in off):.0f} ops/s), get "
          f"{get_ratio:.2f}x ({statistics.median(a[1] for a in on):.0f} vs {statistics.median(a[1] for a in off):.0f})")
    print(f"4 clients putting at once, op log on / off: {conc_on / conc_off:.2f}x ({conc_on:.0f} vs {conc_off:.0f} "
          f"puts/s: the leader batches the ops of concurrent calls into one log write)")
    print(f"standby lag right after each round: max {max(lags)} ops")
    print(f"leader memory per object (log on, {args.objects} objects of 64 B): {per_object:.0f} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
