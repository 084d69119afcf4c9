"""Master high availability (--enable_ha): election, fencing, the op log in the backend, hot standbys.

Roles. Every master starts as a *standby*: it refuses client calls (UNAVAILABLE, so clients look for the
leader) and applies the leader's op log as it grows (``--oplog_poll_interval_ms``). When no leader holds the
view key, a standby campaigns (coordination.py): the winner reads the log to its end, takes over
(durable.take_over: allocators rebuilt, owners alive, leases floored), publishes its view (address, view
number) and serves. Clients find it through the view key (master_client.py, ``etcd://...``).

Durability. With --enable_oplog (or --enable_ha alone: the log is what makes a standby useful, so it is always
on) the leader's journal (``BackendJournal``) batches every op (at most --oplog_batch_max_entries per record)
and writes it to the backend with a fenced write (only while its view key exists). A call's reply waits until
the ops applied up to its end are durable (``Gate.durable``): written to the log, or, with --ha_sync_standbys
(the default), held in the memory of every member of the sync set (standby_sync.py: the leader streams every op
to the standbys; the log is then written behind, in larger batches). A call whose ops could not be made
durable is answered UNAVAILABLE (its writer retries on the next leader, which has the ops or not: put starts
and ends are retried idempotently there, service.py). While the sync set is not empty only its members may
campaign; a new leader first writes to the log the ops only its memory held.

Compaction. Every --oplog_compact_interval_sec the leader deletes the log's batches before the newest
--oplog_retain_ops ops that no standby's stream still needs; a standby whose state is older than the log's
start takes a snapshot from the leader over the stream port (the state once the log holds all of it).

Fencing. The leader renews its lease every ttl/4; when no renewal succeeded for ttl/2 (measured from when the
last successful one was sent) it stops serving at once, before the lease (ttl from that send at the earliest)
can expire and another master be elected; its log writes are fenced anyway. A master that lost leadership
drops its state and starts over as a standby from the log (its state may hold ops that never reached it).

Snapshots (--enable_snapshot with HA): a standby writes snapshots of its state (exactly a prefix of the log) to
its --snapshot_dir; a master starting with one bootstraps from the newest and reads only the log after it. A
leader writes none (its state may hold ops its log write has not confirmed yet).

Threading: one control thread per master (``HaController``), one presence thread (a standby's presence key,
``_presence_loop``), one flusher thread (``BackendJournal``), the stream threads of standby_sync.py. ``Gate`` methods are called by RPC threads and take no service lock.
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import threading
import time

from mooncake.store.common.coordination import BackendError, backend
from mooncake.store.master import durable, ops
from mooncake.store.master.standby_sync import LeaderSync, StandbyStream, SyncRefused, fetch_snapshot

_log = logging.getLogger("mooncake.store.master.ha")
_WRITE_WAIT_SEC = 10.0  # a reply waits at most this long for its ops to be written
PRESENCE_TTLS = 4  # a sync-set member's presence key outlives this many lease TTLs without renewal
RING_KEEP = 4096  # newest records a leader keeps for standbys that connect (their state is a prefix of the log)
RELAXED_FLUSH_SEC = 0.02  # with a sync set, the log flusher gathers ops this long before a write
RING_TRIM_MIN = 1024  # the ring is trimmed in steps at least this large (deleting a list's head is O(n))


class BackendJournal:
    """The leader's op log in the backend: ``append`` (service lock held) queues a record; a flusher thread
    writes batches; ``wait(lsn)`` blocks until every op up to `lsn` is written (False: it never will be: the
    write was fenced or failed, the journal is closed). Records also go to ``ring``, the recent records the
    standbys' streams are fed from (standby_sync.py), which shares ``cond``. ``preload`` queues records the
    previous leader acknowledged through its standbys and the log lacks (a new leader writes them first)."""

    def __init__(self, svc, store, batch_max: int, view: int, written: int | None = None) -> None:
        self._svc = svc
        self._store = store
        self._batch_max = batch_max
        self._view = view
        self.cond = threading.Condition()
        # Records are JSON-encoded once, here: the log and the standbys' streams send the same text.
        self._queue: list[tuple[int, str]] = []  # (lsn, record as JSON) not written yet
        self.written = svc.applied_ops if written is None else written
        self.records = 0
        self.failed = False
        self.ring: list[str] = []  # records as JSON, ring[0] is op ring_first
        self.ring_bytes = 0  # characters held by ring (a batch commit's record can be large)
        self.ring_first = self.written + 1  # lsn of ring[0]
        self.relaxed = None  # callable, cond held: whether calls are answered without the log (standby_sync)
        self._work = threading.Event()  # wakes the flusher (appends do not notify `cond`: nobody waits for them)
        self.batch_starts: list[int] = []  # first op numbers of the batches this journal wrote (compaction points)
        self._thread = threading.Thread(target=self._flush_loop, name="mooncake-master-oplog", daemon=True)
        self._thread.start()

    def preload(self, records: list[dict]) -> None:
        with self.cond:
            for rec in records:
                if rec["lsn"] == self.ring_first + len(self.ring):
                    text = json.dumps(rec, separators=(",", ":"))
                    self._queue.append((rec["lsn"], text))
                    self.ring.append(text)
                    self.ring_bytes += len(text)
        self._work.set()

    def append(self, op) -> None:
        svc = self._svc
        off = svc.wall() - svc.now()
        rec = ops.encode(op, lambda t: t + off)
        rec["lsn"] = svc.applied_ops
        rec["v"] = self._view
        text = json.dumps(rec, separators=(",", ":"))
        with self.cond:
            q = self._queue
            q.append((rec["lsn"], text))
            self.ring.append(text)
            self.ring_bytes += len(text)
            # A relaxed flusher is woken only by the first record (it then gathers more) or a full batch.
            wake = len(q) == 1 or len(q) >= self._batch_max or self.relaxed is None or not self.relaxed()
        if wake:
            self._work.set()

    # -- the ring (cond held by the caller) ------------------------------------------------------------------
    def last_lsn(self) -> int:
        return self.ring_first + len(self.ring) - 1

    def ring_slice(self, first: int, last: int) -> list[str] | None:
        """Records first..last as JSON (clipped to the newest); None when `first` is no longer kept."""
        if first < self.ring_first:
            return None
        return self.ring[first - self.ring_first:last - self.ring_first + 1]

    def trim_ring(self, needed_from: int | None, keep_max: int, keep_bytes: int) -> None:
        """Forgets records before `needed_from` (the oldest a stream still needs; None: no stream) that the
        log holds, keeping the newest RING_KEEP for standbys about to connect, and never more than keep_max
        records or (beyond the newest one) keep_bytes characters. A stream that needed a record dropped for
        the bounds falls behind and catches up from the log or a snapshot (standby_sync.py)."""
        first = min(self.written + 1, self.last_lsn() + 1 - RING_KEEP)
        if needed_from is not None:
            first = min(first, needed_from)
        first = max(first, self.last_lsn() + 1 - keep_max)
        drop = max(0, first - self.ring_first)
        over = self.ring_bytes - sum(map(len, self.ring[:drop])) - keep_bytes
        while over > 0 and drop < len(self.ring) - 1:  # oldest first, until the rest fits
            over -= len(self.ring[drop])
            drop += 1
        if drop >= RING_TRIM_MIN or len(self.ring) > keep_max or self.ring_bytes > keep_bytes:
            self.ring_bytes -= sum(map(len, self.ring[:drop]))
            del self.ring[:drop]
            self.ring_first += drop

    def wait(self, lsn: int, timeout: float = _WRITE_WAIT_SEC) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.written < lsn and not self.failed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return self.written >= lsn

    def close(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()
        self._work.set()

    def _flush_loop(self) -> None:
        while True:
            with self.cond:
                if self.failed:
                    return
                pending = bool(self._queue)
                relaxed = self.relaxed is not None and self.relaxed()
            if not pending:
                self._work.wait()
                self._work.clear()
                continue
            if relaxed:
                # While standbys' memory answers calls, the log is written behind in fewer, larger batches: its
                # latency no longer matters, the backend's load does. A full batch or close wakes it early.
                self._work.wait(RELAXED_FLUSH_SEC)
            self._work.clear()
            with self.cond:
                if self.failed:
                    return
                batch = self._queue[:self._batch_max]
            try:
                ok = self._store.append_encoded(batch[0][0], "[" + ",".join(t for _, t in batch) + "]")
            except BackendError as e:
                _log.warning("op log write failed (%s); retrying", e)
                time.sleep(0.05)
                continue
            with self.cond:
                if not ok:
                    _log.error("op log write fenced: this master is no longer the leader")
                    self.failed = True
                else:
                    del self._queue[:len(batch)]
                    self.written = batch[-1][0]
                    self.records += 1
                    self.batch_starts.append(batch[0][0])
                self.cond.notify_all()


class Gate:
    """What the RPC layer asks before and after each call (rpc_server._rpc). Serving needs both the leader role
    and a lease renewed recently: ``valid_until`` (monotonic) is half a TTL after the last successful renewal
    was sent, checked at every call, so a leader that was paused or cut off refuses calls the moment it runs
    again, before its control thread notices."""

    def __init__(self) -> None:
        self.journal: BackendJournal | None = None
        self.sync = None  # standby_sync.LeaderSync while standbys' memory may make ops durable
        self._serving = False
        self.valid_until = 0.0

    def serving(self) -> bool:
        return self._serving and time.monotonic() < self.valid_until

    def open(self, journal: BackendJournal, valid_until: float, sync=None) -> None:
        self.journal = journal
        self.sync = sync
        self.valid_until = valid_until
        self._serving = True

    def extend(self, valid_until: float) -> None:
        self.valid_until = max(self.valid_until, valid_until)

    def close(self) -> None:
        self._serving = False

    def durable(self, lsn: int) -> bool:
        """Whether the ops up to `lsn` are durable: in the log (waits for the flusher) or, with a sync set, in
        every member's memory (standby_sync.py); False: answer UNAVAILABLE."""
        j, sync = self.journal, self.sync
        if not self.serving() or j is None:
            return False
        ok = sync.wait(lsn, _WRITE_WAIT_SEC) if sync is not None else j.wait(lsn)
        return ok and self.serving()


class _Diverged(Exception):
    """This standby applied ops (from a dead leader's stream) that the log now contradicts."""


class _LogCompacted(Exception):
    """The log no longer holds the ops after this master's state: it needs a snapshot from the leader."""


class HaController:
    """Runs one master's role (module docstring). ``start`` returns at once (as a standby)."""

    def __init__(self, server, config, advertised: str) -> None:
        self._server = server
        self._svc = server.service
        self._cfg = config
        self._address = advertised
        # The name in the sync set: unique per process, so a restarted master (empty memory) is never taken
        # for the member it was.
        self.name = f"{advertised}#{secrets.token_hex(6)}"
        self.store = backend(config.ha_backend_type, config.ha_backend_connstring, config.cluster_id)
        self.gate = Gate()
        self._svc.gate = self.gate
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.view = 0
        self.leader = ""
        self.lag = 0
        self.elections = 0
        self._last_renew_ok = 0.0
        self._journal: BackendJournal | None = None
        self._log_cursor = 0  # first op number of the next log batch to read
        self._log_tail = 0  # the highest op number seen in the log
        self._snapshots: durable.Snapshotter | None = None
        self.restored: dict = {}
        # Synchronous replication (standby_sync.py): the listener a leader streams from, the stream a standby
        # follows, and the records it applied from a stream that the log may not hold yet.
        self._listener: socket.socket | None = None
        self.sync_address = ""
        self._leader_sync: LeaderSync | None = None
        self._stream: StandbyStream | None = None
        self._stream_view = 0
        self._stream_retry_at = 0.0
        self._unlogged: list[dict] = []
        self._before_takeover: tuple | None = None  # (t.held, view) before a takeover not yet served
        self._unlogged_lock = threading.Lock()
        self._not_eligible_logged = ""
        self._next_compact = 0.0
        self._presence_wake = threading.Event()  # set: announce the (new) name at once
        self._presence_thread: threading.Thread | None = None
        self._campaign_after = 0.0  # a master that could not take over waits a little before trying again
        self.compacted_to = 0  # the log's batches before this op number were deleted by this leader

    # -- status ----------------------------------------------------------------------------------------------
    def info(self) -> dict:
        j = self._journal
        s = self._snapshots
        out = {"backend": self.store.kind, "leader": self.leader, "leader_view": self.view,
               "last_snapshot_seq": s.last_seq if s else None, "last_snapshot_time": s.last_time if s else 0.0,
               "restored": self.restored,
               "oplog_lag": self.lag, "applied_ops": self._svc.applied_ops, "elections": self.elections,
               "log_records_written": j.records if j else 0, "log_written_lsn": j.written if j else 0,
               "name": self.name, "log_tail_seen": self._log_tail}
        ls, st = self._leader_sync, self._stream
        if ls is not None:
            out.update(ls.info())
        out["sync_stream"] = st.address if st is not None and st.alive() else ""
        out["sync_unlogged"] = len(self._unlogged)
        return out

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> "HaController":
        if self._cfg.ha_sync_standbys:
            bind = self._cfg.rpc_address or "0.0.0.0"
            self._listener = socket.create_server((bind, self._cfg.ha_sync_port),
                                                  family=socket.AF_INET6 if ":" in bind else socket.AF_INET)
            self._listener.settimeout(0.2)
            host = self._address.rpartition(":")[0]
            self.sync_address = f"{host}:{self._listener.getsockname()[1]}"
        self._become_standby(reset=False)
        if self._cfg.enable_snapshot:
            directory = self._cfg.snapshot_path()
            self.restored = durable.recover(self._svc, directory, oplogs=False)
            self._log_tail = self._svc.applied_ops  # a standby's snapshot is a prefix of the log
            # A standby snapshots only a state that is a prefix of the log (not ops a stream gave it ahead).
            self._snapshots = durable.Snapshotter(
                self._svc, directory, self._cfg.snapshot_interval_seconds, self._cfg.snapshot_retention_count,
                None, when=lambda: self._svc.role == "standby" and self._svc.applied_ops <= self._log_tail)
            self._snapshots.start()
        if self._listener is not None:
            self._presence_thread = threading.Thread(target=self._presence_loop, name="mooncake-master-presence",
                                                     daemon=True)
            self._presence_thread.start()
        self._thread = threading.Thread(target=self._run, name="mooncake-master-ha", daemon=True)
        self._thread.start()
        return self

    def _presence_loop(self) -> None:
        """Keeps this standby's presence key (its sync-set name, PRESENCE_TTLS leases long) renewed every ttl/2
        on a thread of its own, so a control thread stalled (a long snapshot fetch, a slow log read) never makes
        a live member look dead. Each renewal is bounded by the backend's request timeout; a failed one is
        retried at the next tick. Ends when ``stop`` sets ``_stop``."""
        ttl = self._cfg.ha_lease_ttl_sec
        while not self._stop.is_set():
            # Cleared before the name is read: a rename (reset) during the renewal wakes the next one at once,
            # which replaces the old name's key (the old name never stays announced for a whole period).
            self._presence_wake.clear()
            if self._svc.role == "standby":
                try:
                    self.store.announce(self.name, PRESENCE_TTLS * ttl)
                except BackendError as e:
                    _log.warning("presence not renewed: %s", e)
            self._presence_wake.wait(ttl / 2)

    def stop(self) -> None:
        self._stop.set()
        self._presence_wake.set()
        if self._presence_thread is not None:
            self._presence_thread.join(timeout=10)
        if self._snapshots is not None:
            self._snapshots.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._stop_stream()
        self.gate.close()
        if self._svc.role == "leader" and self._journal is not None:
            # A clean stop leaves nothing only in standbys' memory: the log gets all, the sync set is emptied.
            try:
                if self._journal.wait(self._svc.applied_ops, 5.0):
                    self.store.write_sync_set([])
            except Exception as e:  # noqa: BLE001
                _log.warning("stopping: the sync set was not emptied (%s)", e)
        self._close_leader_sync()
        if self._journal is not None:
            self._journal.close()
        if self._svc.role == "leader":
            self.store.resign()
        if self._listener is not None:
            self._listener.close()

    def _run(self) -> None:
        poll = self._cfg.oplog_poll_interval_ms / 1000.0
        ttl = self._cfg.ha_lease_ttl_sec
        while not self._stop.is_set():
            try:
                if self._svc.role == "leader":
                    self._lead_round(ttl)
                    self._stop.wait(ttl / 4)
                else:
                    self._standby_round(ttl)
                    self._stop.wait(poll)
            except BackendError as e:
                _log.warning("HA backend: %s", e)
                if self._svc.role == "leader" and time.monotonic() - self._last_renew_ok > ttl / 2:
                    self._fence("the backend is unreachable")
                self._stop.wait(min(poll, ttl / 8))
            except _Diverged as e:
                _log.warning("starting over from the log: %s", e)
                self._stop_stream()
                with self._unlogged_lock:
                    self._unlogged = []
                self._become_standby(reset=True)
            except Exception:  # a bug: keep the process, leave the leader role (safe side)
                _log.exception("HA round failed")
                if self._svc.role == "leader":
                    self._fence("internal error")
                self._stop.wait(poll)

    # -- standby ---------------------------------------------------------------------------------------------
    def _catch_up(self) -> int:
        """Applies every log batch after the ops applied so far; returns how many ops were applied. Raises
        _Diverged when the log contradicts ops this standby applied from a stream."""
        svc, n = self._svc, 0
        # Batches are keyed by their first op number, contiguous and at most oplog_batch_max_entries long: the
        # next one starts after the last seen; the first read starts where a batch past the log's end seen so
        # far may start (not from the ops applied: a stream may have applied ops the log holds unseen).
        start = self._log_cursor or max(0, self._log_tail + 1 - self._cfg.oplog_batch_max_entries)
        while True:
            batches = self.store.read_log(start, 256)
            if not batches:
                return n
            flat = [r for b in batches for r in b]
            with self._unlogged_lock:
                if flat[0]["lsn"] > svc.applied_ops + 1:
                    raise _LogCompacted(f"the log starts at op {flat[0]['lsn']}, this master has {svc.applied_ops}")
                self._check_unlogged(flat)
                records = [r for r in flat if r["lsn"] > svc.applied_ops]
                if records:
                    n += durable.replay(svc, records)
                self._log_tail = max(self._log_tail, flat[-1]["lsn"])
            start = self._log_cursor = batches[-1][0]["lsn"] + 1

    def _check_unlogged(self, logged: list[dict]) -> None:
        """Compares log records with the stream's records of the same numbers (the view that made them), then
        forgets the stream's records the log now holds. _unlogged_lock held by the caller."""
        if not self._unlogged:
            return
        mine = {r["lsn"]: r.get("v", 0) for r in self._unlogged}
        for r in logged:
            v = mine.get(r["lsn"])
            if v is not None and v != r.get("v", 0):
                raise _Diverged(f"op {r['lsn']} came from view {v}, the log has it from view {r.get('v', 0)}")
        tail = logged[-1]["lsn"]
        self._unlogged = [r for r in self._unlogged if r["lsn"] > tail]

    def _on_stream_frame(self, records: list[dict], written: int, ack, stopping) -> None:
        """A frame of the leader's stream (standby_sync.StandbyStream): held, acknowledged, applied, under the
        lock _catch_up compares and applies the log with, so a record of the log and one of a (deposed)
        leader's stream for the same op number are never both applied. Records the log already showed are
        the log's: the stream's are dropped."""
        with self._unlogged_lock:
            if stopping():
                return
            fresh = [r for r in records if r["lsn"] > self._log_tail]
            self._unlogged.extend(fresh)
            if records:
                ack()
            if fresh:
                durable.replay(self._svc, fresh)
            if written and self._unlogged and self._unlogged[0]["lsn"] <= written:
                # The leader's log holds these (the leader wrote them): a takeover would not need them.
                self._unlogged = [r for r in self._unlogged if r["lsn"] > written]

    def _standby_round(self, ttl: float) -> None:
        # Presence (this process's memory under its sync-set name) is renewed by _presence_loop.
        try:
            self._catch_up()
        except _LogCompacted as e:
            self._bootstrap(str(e))
            return
        info = self.store.view_info()
        if info is not None:
            self.leader, self.view = info["address"], info["view"]
            self.lag = 0  # the poll just read the log to its end
            self._follow(info)
            return
        self._stop_stream()  # no acknowledgement for a deposed leader once this master may campaign
        if time.monotonic() < self._campaign_after or not self._eligible():
            return
        sent = time.monotonic()
        won = self.store.campaign(self._address, ttl, self.sync_address)
        if won is None:
            return
        self._last_renew_ok = sent
        try:
            # The set cannot change now (its writes are fenced on the view just won): decide once more.
            if not self._eligible():
                self.store.resign()
                return
            self._catch_up()  # everything the previous leader wrote
        except BaseException:
            self.store.resign()  # never hold the lease without serving
            raise
        self._become_leader(won)

    def _eligible(self) -> bool:
        """Whether this master may campaign: the stored sync set is empty or names it, or every member it
        names is gone (no presence key: their memory, and the ops only it held, are lost anyway)."""
        members = self.store.read_sync_set()
        if not members or self.name in members:
            return True
        alive = self.store.present() & set(members)
        if not alive:
            _log.error("every member of the sync set %s is gone: campaigning; calls acknowledged through their "
                       "memory alone and missing from the log are lost", members)
            return True
        if self._not_eligible_logged != repr(members):
            self._not_eligible_logged = repr(members)
            _log.warning("not campaigning: only the sync set %s may lead while one of them lives (they hold "
                         "acknowledged ops the log may lack); this master waits", members)
        return False

    def _bootstrap(self, why: str) -> None:
        """Replaces this standby's state with a snapshot from the leader (the log was compacted past it)."""
        info = self.store.view_info()
        if info is None or not info["sync"]:
            if self._not_eligible_logged != why:
                self._not_eligible_logged = why
                _log.warning("%s; waiting for a leader to take a snapshot from", why)
            return
        self._stop_stream()
        try:
            state = fetch_snapshot(info["sync"], self.name)
        except (OSError, ValueError) as e:  # SyncRefused is an OSError
            _log.warning("%s; no snapshot from the leader at %s yet: %s", why, info["sync"], e)
            return
        svc = self._svc
        # One hold of the service lock from the reset to the loaded state: the snapshotter (and the admin
        # pages) see the old state or the new one, never an empty or half-loaded one.
        with self._unlogged_lock, svc.lock:
            svc.reset_state()
            svc.journal = None
            self._unlogged = []
            self._log_cursor = 0
            try:
                durable.load_state_locked(svc, state)
            except (ValueError, KeyError, TypeError, IndexError) as e:
                svc.reset_state()  # start over from the log's start (or the next snapshot)
                svc.allocators_live = False
                self._log_tail = 0
                _log.error("%s: the leader's snapshot does not load (%r); starting over", why, e)
                return
            self._log_tail = max(self._log_tail, svc.applied_ops)  # the snapshot is a prefix of the leader's log
        _log.warning("%s: took a snapshot from the leader %s (op %d, %d objects)", why, info["address"],
                     svc.applied_ops, len(svc.table.objects))

    def _follow(self, info: dict) -> None:
        """Keeps a stream from the leader (with --ha_sync_standbys) once this standby's state is a prefix of
        the log."""
        s = self._stream
        if s is not None and (s.address != info["sync"] or self._stream_view != info["view"] or not s.alive()):
            self._stop_stream()
            s = None
        if s is not None or not self._listener or not info["sync"] or time.monotonic() < self._stream_retry_at:
            return
        if self._svc.applied_ops > self._log_tail:
            return  # ops from a previous stream the log does not show yet: wait for it (or for a divergence)
        try:
            self._stream = StandbyStream(self._svc, info["sync"], self.name, self._on_stream_frame)
            self._stream_view = info["view"]
        except SyncRefused as e:
            _log.info("the leader refused this standby's stream: %s", e)
            self._stream_retry_at = time.monotonic() + 1.0
            if "start over" in str(e):
                raise _Diverged(str(e)) from None
        except (OSError, ValueError) as e:
            self._stream_retry_at = time.monotonic() + 0.5
            _log.info("no stream from the leader at %s yet: %s", info["sync"], e)

    def _stop_stream(self) -> None:
        s, self._stream = self._stream, None
        if s is not None:
            s.stop()

    def _become_standby(self, reset: bool) -> None:
        svc = self._svc
        self.gate.close()
        self._close_leader_sync()
        svc.stop_monitor()
        with svc.lock:
            if reset:
                svc.reset_state()
                self._log_cursor = 0
                self._log_tail = 0
                # The memory this name stood for in a sync set is gone: never answer to it again.
                self.name = f"{self._address}#{secrets.token_hex(6)}"
                self._presence_wake.set()
            svc.journal = None
            svc.allocators_live = False
            svc.role = "standby"

    # -- leader ----------------------------------------------------------------------------------------------
    def _become_leader(self, view: int) -> None:
        svc = self._svc
        with self._unlogged_lock:
            # Records held and acknowledged, not applied yet (a stream stopped between the two): apply them.
            pending = [r for r in self._unlogged if r["lsn"] > svc.applied_ops]
            if pending and pending[0]["lsn"] == svc.applied_ops + 1:
                durable.replay(svc, pending)
            ahead = [r for r in self._unlogged if r["lsn"] > self._log_tail]
        if [r["lsn"] for r in ahead] != list(range(self._log_tail + 1, svc.applied_ops + 1)):
            self._step_down(f"the ops after the log's end ({self._log_tail}) up to {svc.applied_ops} are not all in "
                            f"memory")
            return
        try:
            with svc.lock:
                # take_over drops held buffers that overlap live data (a change no log record makes) and the
                # view changes: a step-down before serving puts both back, so a state kept as "the log plus the
                # held records" is exactly that (the rest take_over touches is derived or timing state).
                self._before_takeover = (list(svc.table.held), svc.view_version)
            durable.take_over(svc)
            with svc.lock:
                svc.view_version = view
                self._journal = BackendJournal(svc, self.store, self._cfg.oplog_batch_max_entries, view,
                                               written=self._log_tail if ahead else None)
                self._journal.preload(ahead)
                svc.journal = self._journal
                svc.role = "leader"
            self.view, self.leader = view, self._address
            self.elections += 1
            # Before serving: the log holds what the previous leader acknowledged through this standby's
            # memory (the lease renewed meanwhile), and the sync set is empty (every standby may campaign).
            if ahead and not self._wait_written(svc.applied_ops):
                self._step_down("the ops acknowledged by the previous leader could not be written to the log")
                return
            if not self.store.write_sync_set([]):
                self._step_down("the sync set could not be reset (fenced)")
                return
            with self._unlogged_lock:
                self._unlogged = []
            if self._listener is not None:
                self._leader_sync = LeaderSync(self._journal, self.store, view, self._listener,
                                               self._cfg.ha_sync_timeout_ms / 1000.0,
                                               snapshot=lambda: durable.snapshot_state(svc))
            svc.start_monitor()
            self._before_takeover = None
            self.gate.open(self._journal, self._last_renew_ok + self._cfg.ha_lease_ttl_sec / 2, self._leader_sync)
        except Exception as e:  # noqa: BLE001  (a backend error, a bug): never hold the lease without serving
            # take_over (or what followed) stopped part way: the state is not known to match the log.
            self._step_down(f"taking over failed: {type(e).__name__}: {e}", discard=True)
            return
        t = svc.table
        _log.warning("leader now (view %d) at %s: %d objects, %d segments, %d ops applied (%d written for the "
                     "previous leader)", view, self._address, len(t.objects), len(svc.segments), svc.applied_ops,
                     len(ahead))

    def _wait_written(self, lsn: int) -> bool:
        """Waits until the journal wrote up to `lsn`, renewing the lease meanwhile; False: it will not."""
        ttl = self._cfg.ha_lease_ttl_sec
        deadline = time.monotonic() + 10 * ttl
        while not self._journal.wait(lsn, ttl / 4):
            if self._journal.failed or time.monotonic() > deadline:
                return False
            sent = time.monotonic()
            if not self.store.renew():
                return False
            self._last_renew_ok = sent
        return True

    def _step_down(self, why: str, discard: bool = False) -> None:
        """Leaves a leadership not yet served: lease resigned, back to standby. The state and the records only
        this memory holds are kept (so a sync-set member that cannot take over now can later) only while the
        state is exactly the log's ops up to ``_log_tail`` plus those held records, in order; otherwise
        (`discard`: take_over stopped part way; ops this leadership made itself; a gap) the state is dropped
        and this master starts over from the log under a new name, so it never serves, snapshots or hands on
        a state the log does not hold."""
        self._campaign_after = time.monotonic() + 1.0
        self.gate.close()
        self._close_leader_sync()
        j, self._journal = self._journal, None
        svc = self._svc
        with self._unlogged_lock:
            if j is not None:
                j.close()
                with j.cond:
                    extra = [json.loads(t) for t in j.ring]
                # What the journal held beyond the log stays held, unless this leadership made it: never
                # acknowledged nor streamed, those ops exist in this memory only.
                own = [r for r in extra if r.get("v", 0) == j._view and r["lsn"] > self._log_tail]
                if own:
                    discard, why = True, f"{why}; {len(own)} ops of this view exist only in this memory"
                held = {r["lsn"] for r in self._unlogged}
                self._unlogged = sorted(self._unlogged + [r for r in extra if r["lsn"] > self._log_tail
                                                          and r["lsn"] not in held], key=lambda r: r["lsn"])
            with svc.lock:
                applied = svc.applied_ops
            # Held records after `applied` (acknowledged, not applied yet) stay held; the applied ones must be
            # exactly the log's end plus held records.
            ahead = [r["lsn"] for r in self._unlogged if self._log_tail < r["lsn"] <= applied]
            if not discard and ahead != list(range(self._log_tail + 1, applied + 1)):
                discard, why = True, f"{why}; the state (op {applied}) is not the log plus the held ops"
            if discard:
                self._unlogged = []
            before, self._before_takeover = self._before_takeover, None
            if not discard and before is not None:
                with svc.lock:
                    svc.table.held, svc.view_version = before
        if discard:
            _log.error("not taking over (view %d): %s; dropping this master's state (ops only it held are lost) "
                       "and starting over from the log", self.view, why)
        else:
            _log.error("not taking over (view %d): %s; standing by with this master's state", self.view, why)
        try:
            self.store.resign()
        except Exception:  # noqa: BLE001  (the lease then runs out)
            pass
        self._become_standby(reset=discard)

    def _close_leader_sync(self) -> None:
        ls, self._leader_sync = self._leader_sync, None
        self.gate.sync = None
        if ls is not None:
            ls.close()

    def _lead_round(self, ttl: float) -> None:
        sent = time.monotonic()
        try:
            ok = self.store.renew()
        except BackendError:
            ok = None
        if ok:
            self._last_renew_ok = sent
            self.gate.extend(sent + ttl / 2)
        elif ok is False:
            self._fence("the lease was lost")
            return
        if time.monotonic() - self._last_renew_ok > ttl / 2:
            self._fence("no lease renewal for half the TTL")
        elif self._journal is not None and self._journal.failed:
            self._fence("an op log write was fenced")
        else:
            self._compact()

    def _compact(self) -> None:
        """Deletes the log's oldest batches (every --oplog_compact_interval_sec): those before the newest
        --oplog_retain_ops ops, and never one a standby's stream has not acknowledged yet. A standby whose
        state is older than the log's start takes a snapshot from the leader (``_bootstrap``)."""
        j, now = self._journal, time.monotonic()
        if j is None or now < self._next_compact:
            return
        self._next_compact = now + self._cfg.oplog_compact_interval_sec
        target = j.written + 1 - self._cfg.oplog_retain_ops
        ls = self._leader_sync
        needed = ls.oldest_needed() if ls is not None else None
        if needed is not None:
            target = min(target, needed)
        with j.cond:
            starts = [b for b in j.batch_starts if b <= target]
        if not starts or starts[-1] <= self.compacted_to:
            return
        if self.store.compact_log(starts[-1]):
            self.compacted_to = starts[-1]
            with j.cond:
                j.batch_starts = [b for b in j.batch_starts if b >= starts[-1]]
            _log.info("op log compacted: ops before %d deleted", starts[-1])

    def _fence(self, why: str) -> None:
        _log.error("leaving the leader role (view %d): %s", self.view, why)
        self.gate.close()
        self._close_leader_sync()
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self.store.resign()
        self._become_standby(reset=True)
