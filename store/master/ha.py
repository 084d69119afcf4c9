"""Master high availability (--enable_ha): election, fencing, the op log in the backend, hot standbys.

Roles. Every master starts as a *standby*: it refuses client calls (UNAVAILABLE, so clients look for the
leader) and applies the leader's op log as it grows (``--oplog_poll_interval_ms``). When no leader holds the
view key, a standby campaigns (coordination.py): the winner reads the log to its end, takes over
(durable.take_over: allocators rebuilt, owners alive, leases floored), publishes its view (address, view
number) and serves. Clients find it through the view key (master_client.py, ``etcd://...``).

Durability. With --enable_oplog (or --enable_ha alone: the log is what makes a standby useful, so it is always
on) the leader's journal (``BackendJournal``) batches every op (at most --oplog_batch_max_entries per record)
and writes it to the backend with a fenced write (only while its view key exists). A call's reply waits until
the ops applied up to its end are written (``Gate.durable``); a call whose ops could not be written is answered
UNAVAILABLE (its writer retries on the next leader, which has the ops or not: put starts and ends are retried
idempotently there, service.py).

Fencing. The leader renews its lease every ttl/4; when no renewal succeeded for ttl/2 (measured from when the
last successful one was sent) it stops serving at once, before the lease (ttl from that send at the earliest)
can expire and another master be elected; its log writes are fenced anyway. A master that lost leadership
drops its state and starts over as a standby from the log (its state may hold ops that never reached it).

Snapshots (--enable_snapshot with HA): a standby writes snapshots of its state (exactly a prefix of the log) to
its --snapshot_dir; a master starting with one bootstraps from the newest and reads only the log after it. A
leader writes none (its state may hold ops its log write has not confirmed yet).

Threading: one control thread per master (``HaController``), one flusher thread (``BackendJournal``). ``Gate``
methods are called by RPC threads and take no service lock.
"""

from __future__ import annotations

import logging
import threading
import time

from mooncake.store.common.coordination import BackendError, backend
from mooncake.store.master import durable, ops

_log = logging.getLogger("mooncake.store.master.ha")
_WRITE_WAIT_SEC = 10.0  # a reply waits at most this long for its ops to be written


class BackendJournal:
    """The leader's op log in the backend: ``append`` (service lock held) queues a record; a flusher thread
    writes batches; ``wait(lsn)`` blocks until every op up to `lsn` is written (False: it never will be: the
    write was fenced or failed, the journal is closed)."""

    def __init__(self, svc, store, batch_max: int) -> None:
        self._svc = svc
        self._store = store
        self._batch_max = batch_max
        self._cond = threading.Condition()
        self._queue: list[dict] = []
        self.written = svc.applied_ops
        self.records = 0
        self.failed = False
        self._thread = threading.Thread(target=self._flush_loop, name="mooncake-master-oplog", daemon=True)
        self._thread.start()

    def append(self, op) -> None:
        svc = self._svc
        off = svc.wall() - svc.now()
        rec = ops.encode(op, lambda t: t + off)
        rec["lsn"] = svc.applied_ops
        with self._cond:
            self._queue.append(rec)
            self._cond.notify_all()

    def wait(self, lsn: int, timeout: float = _WRITE_WAIT_SEC) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.written < lsn and not self.failed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self.written >= lsn

    def close(self) -> None:
        with self._cond:
            self.failed = True
            self._cond.notify_all()

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self.failed:
                    self._cond.wait()
                if self.failed:
                    return
                batch = self._queue[:self._batch_max]
            try:
                ok = self._store.append(batch[0]["lsn"], batch)
            except BackendError as e:
                _log.warning("op log write failed (%s); retrying", e)
                time.sleep(0.05)
                continue
            with self._cond:
                if not ok:
                    _log.error("op log write fenced: this master is no longer the leader")
                    self.failed = True
                else:
                    del self._queue[:len(batch)]
                    self.written = batch[-1]["lsn"]
                    self.records += 1
                self._cond.notify_all()


class Gate:
    """What the RPC layer asks before and after each call (rpc_server._rpc). Serving needs both the leader role
    and a lease renewed recently: ``valid_until`` (monotonic) is half a TTL after the last successful renewal
    was sent, checked at every call, so a leader that was paused or cut off refuses calls the moment it runs
    again, before its control thread notices."""

    def __init__(self) -> None:
        self.journal: BackendJournal | None = None
        self._serving = False
        self.valid_until = 0.0

    def serving(self) -> bool:
        return self._serving and time.monotonic() < self.valid_until

    def open(self, journal: BackendJournal, valid_until: float) -> None:
        self.journal = journal
        self.valid_until = valid_until
        self._serving = True

    def extend(self, valid_until: float) -> None:
        self.valid_until = max(self.valid_until, valid_until)

    def close(self) -> None:
        self._serving = False

    def durable(self, lsn: int) -> bool:
        """Whether the ops up to `lsn` are in the log (waits for the flusher); False: answer UNAVAILABLE."""
        j = self.journal
        return self.serving() and j is not None and j.wait(lsn) and self.serving()


class HaController:
    """Runs one master's role (module docstring). ``start`` returns at once (as a standby)."""

    def __init__(self, server, config, advertised: str) -> None:
        self._server = server
        self._svc = server.service
        self._cfg = config
        self._address = advertised
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
        self._snapshots: durable.Snapshotter | None = None
        self.restored: dict = {}

    # -- status ----------------------------------------------------------------------------------------------
    def info(self) -> dict:
        j = self._journal
        s = self._snapshots
        return {"backend": self.store.kind, "leader": self.leader, "leader_view": self.view,
                "last_snapshot_seq": s.last_seq if s else None, "last_snapshot_time": s.last_time if s else 0.0,
                "restored": self.restored,
                "oplog_lag": self.lag, "applied_ops": self._svc.applied_ops, "elections": self.elections,
                "log_records_written": j.records if j else 0, "log_written_lsn": j.written if j else 0}

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> "HaController":
        self._become_standby(reset=False)
        if self._cfg.enable_snapshot:
            directory = self._cfg.snapshot_path()
            self.restored = durable.recover(self._svc, directory, oplogs=False)
            self._snapshots = durable.Snapshotter(self._svc, directory, self._cfg.snapshot_interval_seconds,
                                                  self._cfg.snapshot_retention_count, None,
                                                  when=lambda: self._svc.role == "standby")
            self._snapshots.start()
        self._thread = threading.Thread(target=self._run, name="mooncake-master-ha", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._snapshots is not None:
            self._snapshots.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.gate.close()
        if self._journal is not None:
            self._journal.close()
        if self._svc.role == "leader":
            self.store.resign()

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
            except Exception:  # a bug: keep the process, leave the leader role (safe side)
                _log.exception("HA round failed")
                if self._svc.role == "leader":
                    self._fence("internal error")
                self._stop.wait(poll)

    # -- standby ---------------------------------------------------------------------------------------------
    def _catch_up(self) -> int:
        """Applies every log batch after the ops applied so far; returns how many ops were applied."""
        svc, n = self._svc, 0
        # Batches are keyed by their first op number and contiguous: the next one starts after the last seen.
        start = self._log_cursor or max(0, svc.applied_ops + 1 - self._cfg.oplog_batch_max_entries)
        while True:
            batches = self.store.read_log(start, 256)
            if not batches:
                return n
            records = [r for b in batches for r in b if r["lsn"] > svc.applied_ops]
            if records:
                n += durable.replay(svc, records)
            start = self._log_cursor = batches[-1][0]["lsn"] + 1

    def _standby_round(self, ttl: float) -> None:
        self._catch_up()
        view = self.store.read_view()
        if view is not None:
            self.leader, self.view = view
            self.lag = 0  # the poll just read the log to its end
            return
        sent = time.monotonic()
        won = self.store.campaign(self._address, ttl)
        if won is None:
            return
        self._last_renew_ok = sent
        self._catch_up()  # everything the previous leader wrote
        self._become_leader(won)

    def _become_standby(self, reset: bool) -> None:
        svc = self._svc
        self.gate.close()
        svc.stop_monitor()
        with svc.lock:
            if reset:
                svc.reset_state()
                self._log_cursor = 0
            svc.journal = None
            svc.allocators_live = False
            svc.role = "standby"

    # -- leader ----------------------------------------------------------------------------------------------
    def _become_leader(self, view: int) -> None:
        svc = self._svc
        durable.take_over(svc)
        with svc.lock:
            svc.view_version = view
            self._journal = BackendJournal(svc, self.store, self._cfg.oplog_batch_max_entries)
            svc.journal = self._journal
            svc.role = "leader"
        self.view, self.leader = view, self._address
        self.elections += 1
        svc.start_monitor()
        self.gate.open(self._journal, self._last_renew_ok + self._cfg.ha_lease_ttl_sec / 2)
        t = svc.table
        _log.warning("leader now (view %d) at %s: %d objects, %d segments, %d ops applied", view, self._address,
                     len(t.objects), len(svc.segments), svc.applied_ops)

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

    def _fence(self, why: str) -> None:
        _log.error("leaving the leader role (view %d): %s", self.view, why)
        self.gate.close()
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self.store.resign()
        self._become_standby(reset=True)
