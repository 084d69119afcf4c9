"""Random operation sequences against MasterService, checking its space accounting after every step.

Invariants: every allocator's used bytes equal the (rounded) sizes of the live replicas on its segment
(committed objects, puts in progress, held buffers, copy/move targets): no leak and no double free on
revoke/remove/expiry/eviction/unmount; live replicas never overlap; the pool total matches the segments;
side tables (pins, leases) only name keys that still exist or are being written.
"""

import dataclasses
import logging
import random

from mooncake.store.master.config import MasterConfig
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.objects import PutConfig, replicas_of
from mooncake.store.master.service import MasterService, SegmentSpec

KiB = 1 << 10
CLIENTS = ("c0", "c1", "c2")
SIZES = (1, 64, 100, 4 * KiB, 33 * KiB, 100 * KiB)


class Clock:
    t = 1000.0

    def __call__(self):
        return self.t


def live_replicas(svc):
    t = svc.table
    out = [r for v in t.objects.values() for r in replicas_of(v)]
    out += [r for p in t.pending.values() for r in p.replicas]
    out += [r for h in t.held for r in h.replicas]
    out += [r for op in t.busy.values() for r in op.new]
    return [r for r in out if r.segment.mounted]


def check_invariants(svc, where):
    per_segment = {}
    for r in live_replicas(svc):
        per_segment.setdefault(r.segment.id, []).append(r)
    for seg in svc.segments.all():
        reps = sorted(per_segment.get(seg.id, []), key=lambda r: r.offset)
        for a, b in zip(reps, reps[1:]):
            assert a.offset + seg.allocator.rounded(a.size) <= b.offset, (where, "overlap", a, b)
        expected = sum(seg.allocator.rounded(r.size) for r in reps)
        assert seg.allocator.used_bytes == expected, (where, seg.id, seg.allocator.used_bytes, expected)
    assert svc.segments.used == sum(s.allocator.used_bytes for s in svc.segments.all()), where
    t = svc.table
    for table in (t.hard_pins, t.soft_pins, t.leases, t.busy):
        stale = [k for k in table if k not in t.objects and k not in t.pending]
        assert not stale, (where, "stale side-table keys", stale)


def run(seed: int, steps: int) -> dict:
    rng = random.Random(seed)
    clock = Clock()
    svc = MasterService(MasterConfig(client_ttl_sec=5, put_start_discard_timeout_sec=3,
                                     put_start_release_timeout_sec=6, default_kv_lease_ttl_ms=1000,
                                     eviction_ratio=0.1, eviction_high_watermark_ratio=0.5),
                        clock=clock, rng=random.Random(seed))
    specs = {}
    for ci, client in enumerate(CLIENTS):
        for j in range(2):
            spec = SegmentSpec(f"s{ci}{j}", f"h{ci}", 0x1000000 * (ci * 4 + j + 1), 160 * KiB)
            specs[spec.id] = (client, spec)
            assert svc.mount_segment(client, spec) == E.OK
    keys = [f"k{i}" for i in range(12)]
    writer = {}  # key -> client that started its put (so that most ends/revokes are legitimate)
    ok = {}

    def note(op, code):
        if code == E.OK:
            ok[op] = ok.get(op, 0) + 1

    for step in range(steps):
        op = rng.choice(("put", "put", "upsert", "end", "end", "revoke", "get", "exist", "remove", "force_remove",
                         "remove_all", "tick", "advance", "ping", "unmount", "mount", "copy", "move",
                         "copy_end", "copy_revoke", "clear"))
        key = rng.choice(keys)
        client = rng.choice(CLIENTS)
        legit = writer.get(key, client) if rng.random() < 0.8 else client
        cfg = PutConfig(replica_num=rng.choice((1, 1, 2, 3)), with_hard_pin=rng.random() < 0.1,
                        with_soft_pin=rng.random() < 0.2)
        size = rng.choice(SIZES)
        old = svc.table.objects.get(key)
        if op == "upsert" and old is not None and rng.random() < 0.7:  # same shape: overwritten in place
            size = replicas_of(old)[0].size
            cfg = dataclasses.replace(cfg, replica_num=len(replicas_of(old)))
        if op in ("put", "upsert"):
            start = svc.put_start if op == "put" else svc.upsert_start
            code, _ = start(client, key, size, cfg)
            note(op, code)
            if code == E.OK:
                writer[key] = client
                if rng.random() < 0.6:  # most writers finish at once; the rest later, never, or too late
                    note("end", svc.put_end(client, key))
        elif op == "end":
            note(op, svc.put_end(legit, key))
        elif op == "revoke":
            note(op, svc.put_revoke(legit, key))
        elif op == "get":
            note(op, svc.get_replica_list(key)[0])
        elif op == "exist":
            svc.exist(key)
        elif op in ("remove", "force_remove"):
            note(op, svc.remove(key, force=op == "force_remove"))
        elif op == "remove_all":
            svc.remove_all(force=rng.random() < 0.5)
        elif op == "tick":
            svc.tick()
        elif op == "advance":
            clock.t += rng.choice((0.05, 0.2, 0.5, 1.0, 2.0, 4.0))
        elif op == "ping":
            for c in CLIENTS:
                if rng.random() < 0.9 and not svc.ping(c)[1]:
                    note("remount", svc.remount_segments(c, [s for owner, s in specs.values() if owner == c]))
        elif op == "unmount":
            sid = rng.choice(list(specs))
            svc.unmount_segment(specs[sid][0], sid)
        elif op == "mount":
            sid = rng.choice(list(specs))
            svc.mount_segment(*specs[sid])
        elif op in ("copy", "move"):
            target = f"h{rng.randrange(len(CLIENTS))}"
            code = (svc.copy_start(client, key, "", [target]) if op == "copy"
                    else svc.move_start(client, key, "", target))[0]
            note(op, code)
            if code == E.OK:
                writer[key] = client
                if rng.random() < 0.5:
                    note("copy_end", (svc.copy_end if op == "copy" else svc.move_end)(client, key))
        elif op == "copy_end":
            end = svc.copy_end if rng.random() < 0.5 else svc.move_end
            note(op, end(legit, key))
        elif op == "copy_revoke":
            revoke = svc.copy_revoke if rng.random() < 0.5 else svc.move_revoke
            note(op, revoke(legit, key))
        elif op == "clear":
            svc.batch_replica_clear(client, [key], rng.choice(("", "h0", "h1")))
        check_invariants(svc, (seed, step, op, key))
    # everything released at the end: no space may stay allocated
    clock.t += 3600
    for c in CLIENTS:
        svc.ping(c)
    svc.tick()
    svc.remove_all(force=True)
    clock.t += 3600
    for c in CLIENTS:
        svc.ping(c)
    svc.tick()
    check_invariants(svc, (seed, "final"))
    assert svc.segments.used == 0, [s.describe() for s in svc.segments.all()]
    for reason in ("watermark", "alloc_failure"):
        ok[f"evict_{reason}"] = svc.metrics.registry.get_sample_value("master_evicted_objects_total",
                                                                       {"reason": reason}) or 0
    return ok


def test_random_operations_keep_space_accounting_exact():
    logging.getLogger("mooncake.store.master").setLevel(logging.ERROR)
    total = {}
    for seed in range(12):
        for op, n in run(seed, 2500).items():
            total[op] = total.get(op, 0) + n
    # the sequences must really exercise the state machine, not bounce off errors
    for op in ("put", "upsert", "end", "revoke", "get", "remove", "force_remove", "copy", "copy_end", "remount",
               "evict_watermark", "evict_alloc_failure"):
        assert total.get(op, 0) > 0, (op, total)
