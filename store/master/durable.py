"""Durable metadata: snapshots of the master's durable state and the local op log, and recovery from them.

Files in the snapshot directory (``--snapshot_dir``, default ``$MOONCAKE_SNAPSHOT_LOCAL_PATH`` or
``./mooncake_master_snapshots``):
  ``snapshot.<seq>.json``  the durable state after op number ``seq`` (written to a temporary file, fsync'ed and
                           renamed, so a snapshot is complete or absent);
  ``oplog.<seq>.jsonl``    one JSON op per line (ops.encode plus ``"lsn"``, its number), the ops after ``seq``; a new file is
                           started at each snapshot. Lines are written with one ``write`` each before the RPC that
                           made the change answers, so a killed process (``kill -9``) loses nothing it
                           acknowledged; a torn last line (a crash mid-write) is ignored on recovery.
The newest ``--snapshot_retention_count`` snapshots are kept, and the logs that follow the oldest of them.

Recovery (``recover``): load the newest readable snapshot, apply the logs' ops with a higher seq in order, then
the caller takes over (``take_over``): allocators rebuilt from the state, owners of segments/tiers/puts/blocks
registered alive (they need not re-mount), and every object treated as leased for one lease TTL (readers may
hold descriptors the previous master granted).

Threading: ``FileJournal.append`` is called with the service lock held (by ``MasterService._apply``);
``snapshot_state`` takes the lock itself.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time

from mooncake.store.master import ops
from mooncake.store.master.objects import Held, PendingPut, PutKind, ReplicationOp, pack_replicas, replicas_of
from mooncake.store.master.segments import Replica

_log = logging.getLogger("mooncake.store.master")

_SNAPSHOT = re.compile(r"^snapshot\.(\d+)\.json$")
_OPLOG = re.compile(r"^oplog\.(\d+)\.jsonl$")


def _reps(reps) -> list:
    return [[r.segment.id, r.offset, r.size] for r in reps]


def snapshot_state(svc) -> dict:
    """The durable state of `svc` as JSON-able data (times in wall-clock seconds), with ``seq``: the number of
    ops applied so far (``svc.applied_ops``). Takes the service lock, for all but the encoding of the objects."""
    with svc.lock:
        state = state_locked(svc)
    return finish_state(state)


def state_locked(svc) -> dict:
    """snapshot_state with the lock held by the caller, except that the objects (the bulk of a large state)
    are only copied: ``finish_state`` encodes them after the lock is released. That is safe because an
    object's value is never changed in place (ObjectTable.objects holds immutable Replica/tuple values)."""
    off = svc.wall() - svc.now()
    t = svc.table
    return {
        "version": 1, "seq": svc.applied_ops, "taken": time.time(), "view_version": svc.view_version,
        "segments": [[s.client_id, s.id, s.name, s.base, s.size, s.te_endpoint, s.protocol]
                     for s in svc.segments.all()],
        "objects": list(t.objects.items()),
        "hard_pins": list(t.hard_pins),
        "soft_pins": [[k, d + off] for k, d in t.soft_pins.items()],
        "pending": [[k, p.client_id, p.size, _reps(p.replicas), p.started + off, ops.encode_config(p.config),
                     int(p.kind)] for k, p in t.pending.items()],
        "held": [[h.key, _reps(r for r in h.replicas if r.segment.mounted), h.release_at + off, h.writer, h.sticky]
                 for h in t.held],
        "disk_clients": [[c.client_id, c.endpoint] for c in svc.disk_tier.clients.values()],
        "disk": [[k, d.owner.client_id, d.size, d.seq] for k, d in t.disk.items()],
        "reservations": [[r.id, r.client_id, r.segment.id, r.cursor, r.end] for r in svc.reservations.values()],
        "busy": [[k, b.client_id, b.move, _reps([b.source]), _reps(b.new), b.started + off]
                 for k, b in t.busy.items()],
    }


def finish_state(state: dict) -> dict:
    """Encodes the objects state_locked copied (no lock needed); returns `state`."""
    state["objects"] = [[k, _reps(replicas_of(v))] for k, v in state["objects"]]
    return state


def load_state(svc, state: dict) -> None:
    """Replaces the (empty) durable state of `svc` with `state` (from snapshot_state). The allocators are not
    live afterwards: call ``take_over`` (or go on applying ops as a standby). Raises ValueError for a state
    that does not fit together (a replica on an unknown segment)."""
    with svc.lock:
        load_state_locked(svc, state)


def load_state_locked(svc, state: dict) -> None:
    """load_state with the service lock held by the caller (so a reset and the load are one step for every
    other thread). On ValueError (or KeyError/TypeError/IndexError for malformed rows) the state is partly
    loaded: the caller resets it."""
    if state.get("version") != 1:
        raise ValueError(f"unknown snapshot version {state.get('version')!r}")
    off = svc.wall() - svc.now()
    svc.allocators_live = False
    segs = svc.segments
    for client_id, seg_id, name, base, size, te, proto in state["segments"]:
        code, _ = segs.mount(client_id, seg_id, name, base, size, te, proto)
        if code != 0:
            raise ValueError(f"snapshot segment {seg_id!r} refused: {code!r}")

    def reps(lst):
        out = []
        for seg_id, offset, size in lst:
            seg = segs.get(seg_id)
            if seg is None:
                raise ValueError(f"snapshot replica on unknown segment {seg_id!r}")
            out.append(Replica(seg, int(offset), svc._shared_size(int(size))))
        return out

    t = svc.table
    for key, lst in state["objects"]:
        t.objects[key] = pack_replicas(reps(lst))
    t.hard_pins.update(state["hard_pins"])
    for key, d in state["soft_pins"]:
        t.soft_pins[key] = d - off
    for key, client_id, size, lst, started, cfg, kind in state["pending"]:
        t.pending[key] = PendingPut(client_id, size, reps(lst), started - off, ops.decode_config(cfg),
                                    PutKind(kind))
    for row in state["held"]:  # older snapshots: no sticky flag
        key, lst, release_at, writer = row[:4]
        t.held.append(Held(key, tuple(reps(lst)), release_at - off, writer, bool(row[4]) if len(row) > 4 else False))
    for client_id, endpoint in state["disk_clients"]:
        svc.disk_tier.mount(client_id, endpoint)
    for key, client_id, size, seq in state["disk"]:
        svc.disk_tier.add_replica(key, client_id, size, seq)
    now = svc.now()
    for rid, client_id, seg_id, cursor, end in state["reservations"]:
        svc.reservation_pool.add(rid, client_id, segs.get(seg_id), cursor, end, now)
    for key, client_id, move, source, new, started in state.get("busy", ()):  # absent in older snapshots
        t.busy[key] = ReplicationOp(client_id, bool(move), reps(source)[0], reps(new), started - off)
    svc.applied_ops = int(state["seq"])


def replay(svc, records) -> int:
    """Applies encoded ops (dicts with ``lsn``: the op's number) following ``svc.applied_ops``; skips older ones. Returns
    how many were applied. Raises ValueError on a gap (a lost record) or a record that does not decode."""
    n = 0
    with svc.lock:
        off = svc.wall() - svc.now()
        from_wall = (lambda w: w - off)
        for rec in records:
            seq = rec.get("lsn") if isinstance(rec, dict) else None
            if not isinstance(seq, int):
                raise ValueError(f"op record without lsn: {rec!r}")
            if seq <= svc.applied_ops:
                continue
            if seq != svc.applied_ops + 1:
                raise ValueError(f"op log gap: have {svc.applied_ops}, next record is {seq}")
            try:
                op = ops.decode(rec, svc.segments.get, from_wall)
            except KeyError as e:
                raise ValueError(str(e)) from None
            svc._apply(op)
            n += 1
    return n


def take_over(svc, hold_leases: bool = True) -> None:
    """Makes `svc` serve clients after a restore or as a new leader: allocators rebuilt, owners alive, leases
    floored (module docstring)."""
    with svc.lock:
        rebuild_allocators(svc)
        now = svc.now()
        t = svc.table
        owners = {s.client_id for s in svc.segments.all()} | set(svc.disk_tier.clients)
        owners |= {p.client_id for p in t.pending.values()} | {r.client_id for r in svc.reservations.values()}
        owners |= {op.client_id for op in t.busy.values()}
        for c in owners:
            svc.clients.register(c, now)
        for r in svc.reservations.values():
            r.last_used = now
        if hold_leases:
            t.lease_floor = now + svc.lease_ttl
        svc.taken_over_at = now


def rebuild_allocators(svc) -> None:
    """Rebuilds every segment's free space from the durable state and makes the allocators live. A held buffer
    that overlaps live data (its release was not logged before the range was reused) is dropped. Lock held by
    the caller; ValueError when live ranges overlap (the state is corrupt)."""
    import bisect

    from mooncake.store.common.allocator import OffsetAllocator

    segs = svc.segments
    t = svc.table
    live: dict[str, list[tuple[int, int]]] = {s.id: [] for s in segs.all()}

    def span(r: Replica) -> tuple[int, int]:
        return r.offset, r.segment.allocator.rounded(r.size)

    def claim(r: Replica) -> None:
        lst = live.get(r.segment.id)
        if lst is not None and r.segment.mounted:
            lst.append(span(r))

    for v in t.objects.values():
        for r in replicas_of(v):
            claim(r)
    for p in t.pending.values():
        for r in p.replicas:
            claim(r)
    for b in svc.reservations.values():
        if b.end > b.cursor:
            claim(Replica(b.segment, b.cursor, b.end - b.cursor))
    for op in t.busy.values():  # a copy/move's new buffers: its executor may be writing them
        for r in op.new:
            claim(r)
    for lst in live.values():
        lst.sort()
        for (o1, n1), (o2, _) in zip(lst, lst[1:]):
            if o1 + n1 > o2:
                raise ValueError(f"live ranges overlap at offset {o2}")

    def overlaps(lst, o, n) -> bool:
        i = bisect.bisect_left(lst, (o, 0))
        return (i < len(lst) and lst[i][0] < o + n) or (i > 0 and lst[i - 1][0] + lst[i - 1][1] > o)

    kept_held = []
    for h in t.held:
        reps = [r for r in h.replicas if r.segment.mounted and r.segment.id in live]
        if any(overlaps(live[r.segment.id], *span(r)) for r in reps):
            _log.warning("rebuild: held buffers of %r overlap live data and were dropped", h.key)
            continue
        for r in reps:
            bisect.insort(live[r.segment.id], span(r))
        kept_held.append(h)
    t.held = kept_held
    total = 0
    for seg in segs.all():
        seg.allocator = OffsetAllocator.from_used(seg.size, live[seg.id], seg.allocator.granule)
        total += seg.allocator.used_bytes
    segs.used = total
    svc.allocators_live = True


class FileJournal:
    """The local op log (module docstring). ``append`` encodes and writes one line; ``rotate(seq)`` starts the
    file of the ops after `seq` (called right after a snapshot at `seq`)."""

    def __init__(self, directory: str, svc, fsync: bool = False) -> None:
        self.directory = directory
        self._svc = svc
        self._fsync = fsync
        self._fd = -1
        self.records = 0
        os.makedirs(directory, exist_ok=True)
        self.rotate(svc.applied_ops)

    def rotate(self, seq: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        path = os.path.join(self.directory, f"oplog.{seq}.jsonl")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, op) -> None:
        svc = self._svc
        off = svc.wall() - svc.now()
        rec = ops.encode(op, lambda t: t + off)
        rec["lsn"] = svc.applied_ops
        os.write(self._fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
        if self._fsync:
            os.fsync(self._fd)
        self.records += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _numbered(directory: str, pattern) -> list[tuple[int, str]]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        m = pattern.match(n)
        if m:
            out.append((int(m.group(1)), os.path.join(directory, n)))
    return sorted(out)


def write_snapshot(directory: str, state: dict, retention: int = 2) -> str:
    """Writes `state` as snapshot.<seq>.json atomically; prunes older snapshots and logs (module docstring)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"snapshot.{state['seq']}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    snaps = _numbered(directory, _SNAPSHOT)
    keep = snaps[-max(1, retention):]
    for _, p in snaps[:-len(keep)]:
        os.unlink(p)
    oldest = keep[0][0]
    logs = _numbered(directory, _OPLOG)
    for i, (seq, p) in enumerate(logs):
        nxt = logs[i + 1][0] if i + 1 < len(logs) else None
        if nxt is not None and nxt <= oldest:
            os.unlink(p)  # every op in it is in the oldest kept snapshot
    return path


def read_log(path: str):
    """Yields the records of one op log file; stops at a torn or unreadable last line."""
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                _log.warning("%s: torn last record ignored", path)
                return
            try:
                yield json.loads(line)
            except ValueError:
                _log.warning("%s: unreadable record ignored (and everything after it)", path)
                return


def recover(svc, directory: str, oplogs: bool = True) -> dict:
    """Restores `svc` (fresh) from the newest snapshot and (`oplogs`) the local logs after it; returns what was
    found ({"snapshot": seq or None, "ops": n}). The caller then calls take_over (or, HA, reads the log on)."""
    snap_seq = None
    for seq, path in reversed(_numbered(directory, _SNAPSHOT)):
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except (OSError, ValueError) as e:
            _log.error("snapshot %s unreadable (%s); trying an older one", path, e)
            continue
        try:
            load_state(svc, state)
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"snapshot {path} does not fit together: {e!r}") from None
        snap_seq = seq
        break
    svc.allocators_live = False
    n = 0
    for seq, path in _numbered(directory, _OPLOG) if oplogs else ():
        n += replay(svc, read_log(path))
    return {"snapshot": snap_seq, "ops": n}


class Snapshotter:
    """Writes a snapshot every `interval` seconds while `when()` holds (default: always) and rotates the journal
    (if any) to follow it."""

    def __init__(self, svc, directory: str, interval: float, retention: int, journal: FileJournal | None,
                 when=None) -> None:
        self._svc, self._dir, self._interval, self._retention = svc, directory, interval, retention
        self._journal = journal
        self._when = when
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_seq = None
        self.last_time = 0.0
        self._take_lock = threading.Lock()  # one take at a time (the periodic thread and SIGUSR1)

    def take(self) -> str | None:
        """Writes one snapshot now; returns its path (None: `when()` did not hold, checked under the service
        lock). The state is taken and the journal rotated in one hold of the service lock; the file is written
        after it. Takes run one at a time, so last_seq never moves back."""
        with self._take_lock:
            return self._take()

    def _take(self) -> str | None:
        with self._svc.lock:
            if self._when is not None and not self._when():
                return None
            state = state_locked(self._svc)
            if self._journal is not None:
                self._journal.rotate(state["seq"])
        path = write_snapshot(self._dir, finish_state(state), self._retention)
        self.last_seq, self.last_time = state["seq"], time.time()
        return path

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="mooncake-master-snapshot", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        wait = self._interval
        while not self._stop.wait(wait):
            wait = self._interval
            try:
                if self.take() is None:
                    wait = min(self._interval, 1.0)  # not now (e.g. a standby ahead of the log): soon again
            except Exception:
                _log.exception("snapshot failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


class LocalDurability:
    """--enable_snapshot without HA: restore at start, then the local op log and periodic snapshots; a final
    snapshot at a clean stop. ``start`` before the master serves; ``stop`` after it stopped serving."""

    def __init__(self, svc, config) -> None:
        self._svc = svc
        self.directory = config.snapshot_path()
        self._interval = config.snapshot_interval_seconds
        self._retention = config.snapshot_retention_count
        self.journal: FileJournal | None = None
        self.snapshots: Snapshotter | None = None
        self.restored: dict = {}

    def start(self) -> "LocalDurability":
        svc = self._svc
        os.makedirs(self.directory, exist_ok=True)
        self.restored = recover(svc, self.directory)
        if self.restored["snapshot"] is not None or self.restored["ops"]:
            take_over(svc)
            t = svc.table
            _log.warning("restored from %s: snapshot %s + %d ops: %d objects, %d segments, %d puts in progress, "
                         "%d disk replicas", self.directory, self.restored["snapshot"], self.restored["ops"],
                         len(t.objects), len(svc.segments), len(t.pending), len(t.disk))
        else:
            svc.allocators_live = True
        self.journal = FileJournal(self.directory, svc)
        svc.journal = self.journal
        self.snapshots = Snapshotter(svc, self.directory, self._interval, self._retention, self.journal)
        self.snapshots.start()
        return self

    def info(self) -> dict:
        s = self.snapshots
        return {"snapshot_dir": self.directory, "log_records": self.journal.records if self.journal else 0,
                "last_snapshot_seq": s.last_seq if s else None, "last_snapshot_time": s.last_time if s else 0.0,
                "restored": self.restored}

    def stop(self) -> None:
        if self.snapshots is not None:
            self.snapshots.stop()
            try:
                self.snapshots.take()
            except OSError as e:
                _log.error("final snapshot failed: %s", e)
            self.snapshots = None
        with self._svc.lock:
            self._svc.journal = None
            if self.journal is not None:
                self.journal.close()
