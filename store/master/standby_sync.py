"""Synchronous op-log replication to standbys' memory: the fast durability path of HA (ha.py).

Without it, every reply of the leader waits for its ops to be committed in the backend (an etcd write: about
2-3 ms with fsync), so a client's puts run at a tenth of a single master's speed. With it
(``--ha_sync_standbys``, the default), the leader streams every op to the standbys over a direct TCP connection
and a call is answered once its ops are either in the backend's log or in the memory of every member of the
*sync set*; the backend log is still written, in batches, behind.

Safety rule: every op acknowledged to a client is in the backend log, or in the memory of every member of the
sync set stored in the backend (``write_sync_set``, fenced like the log) at the moment it was acknowledged.
It holds because
  - the fast path is used only while no change of the set is in progress, and a change (a standby joins, a
    member leaves) is written only after the backend log holds every op acknowledged so far: so the stored set
    never names a member that misses an acknowledged op the log lacks;
  - a standby may campaign only when the stored set is empty or names it (ha.py), so a new leader holds every
    acknowledged op (it catches up from the log, then has the rest in memory); before it serves it writes the
    ops the log lacks to the log, then an empty set (every standby is eligible again).
A member stops acknowledging (closes the stream) before it campaigns, so a deposed leader that has not
noticed yet cannot acknowledge anything through it.

Divergence: a standby may hold ops of a dead leader that the next leader never got (they were never
acknowledged). Records carry the view of the leader that made them (``"v"``). A standby connects a stream only
while its state is a prefix of the log; ops it applied from a stream are compared with the log's records of
the same numbers as the log grows, and a mismatch makes it start over from the log (ha.py).

Wire (little endian): frames are u32 length + UTF-8 JSON. Standby -> leader first: {"from": lsn, "name": name}; leader -> standby: {"ok": true} or {"ok": false, "why": text}, then frames each holding
a JSON list of records (``ops.encode`` plus "lsn" and "v"), contiguous; standby -> leader after each frame: u64
the standby's applied op number. Frames from the leader are at most MAX_FRAME bytes; a malformed frame closes
the connection. Trust: as the master's RPC port (anyone who reaches it is trusted with the metadata).

Threading (leader): one accept thread, one pump thread; RPC threads call ``wait``. Only the holder of the
*driver token* (an RPC thread in ``wait`` or the pump) writes to or reads from the members' sockets; the pump
alone serves standbys that are still catching up. State is guarded by the journal's condition (``cond``).
Standby: one thread (``StandbyStream``) reading, applying and acknowledging frames.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import struct
import threading
import time

_log = logging.getLogger("mooncake.store.master.ha")

FRAME = struct.Struct("<I")
ACK = struct.Struct("<Q")
MAX_FRAME = 64 << 20
MAX_HELLO = 4096
MAX_HELLOS = 16  # connections whose hello is being read at once
RECORDS_PER_FRAME = 2048
RING_MAX = 200_000  # recent records kept for standbys that join, at most
RING_MAX_BYTES = 64 << 20  # and at most this many characters of them (batch commits make large records)
HEARTBEAT_SEC = 1.0  # an idle stream carries an empty frame this often; a standby gives up after STANDBY_SILENCE_SEC
STANDBY_SILENCE_SEC = 5.0
PUMP_SEC = 0.005  # the pump's period: catching-up standbys, idle members' records and acks, set changes
_SLICE_SEC = 0.002  # a driver checks every this long whether the backend log answered its call first


class SyncRefused(ConnectionError):
    """The leader refused a standby's stream: its state does not continue the leader's log."""


def _send_frame(sock: socket.socket, obj) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(FRAME.pack(len(data)) + data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("connection closed")
        got += k
    return bytes(buf)


def _recv_frame(sock: socket.socket, limit: int):
    (n,) = FRAME.unpack(_recv_exactly(sock, FRAME.size))
    if n > limit:
        raise ConnectionError(f"frame of {n} bytes exceeds the limit of {limit}")
    return json.loads(_recv_exactly(sock, n))


class _Standby:
    """One standby's stream, seen from the leader."""

    __slots__ = ("sock", "poller", "name", "sent", "acked", "pending", "in_sync", "broken", "waiting_since",
                 "last_sent", "_part")

    def __init__(self, sock: socket.socket, name: str, from_lsn: int) -> None:
        self.sock = sock
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.last_sent = time.monotonic()
        self.name = name
        self.sent = from_lsn - 1  # last op sent
        self.acked = from_lsn - 1  # last op the standby applied
        self.pending = 0  # frames sent and not acknowledged
        self.in_sync = False  # a member of the stored sync set
        self.broken = ""  # why the stream failed ("" while it works)
        self.waiting_since = 0.0  # monotonic time of the oldest unacknowledged frame
        self._part = b""

    def take_acks(self, data: bytes) -> None:
        data = self._part + data
        whole = len(data) - len(data) % ACK.size
        for off in range(0, whole, ACK.size):
            self.acked = max(self.acked, min(self.sent, ACK.unpack_from(data, off)[0]))
            self.pending -= 1
        self._part = data[whole:]
        if self.pending <= 0:
            self.pending = 0
            self.waiting_since = 0.0
        else:
            self.waiting_since = time.monotonic()


class LeaderSync:
    """The leader's side (module docstring). Created by ha.py when a master becomes leader, closed when it
    stops leading. ``journal`` is the ha.BackendJournal: its ``cond`` guards this object too, its ``append``
    feeds ``ring`` and ``written`` says how far the backend log is."""

    def __init__(self, journal, store, view: int, listener: socket.socket, timeout: float, snapshot=None) -> None:
        self.journal = journal
        self.cond = journal.cond
        self._store = store
        self.view = view
        self.timeout = timeout
        self._snapshot = snapshot  # () -> the durable state (durable.snapshot_state), for standbys the log left
        self.conns: list[_Standby] = []
        self.members: list[_Standby] = []
        self.changing = False  # a change of the stored set is in progress: acknowledge through the log only
        self.fast_acked = 0  # highest op acknowledged through the sync set alone
        self.fast_acks = 0  # calls answered through the sync set (for /health)
        self._driving = False
        self._closed = False
        self._hellos = threading.BoundedSemaphore(MAX_HELLOS)
        self._change_retry_at = 0.0
        self._kick = threading.Event()  # wakes the pump early (a new stream, close); it runs every PUMP_SEC anyway
        journal.relaxed = self._fast
        self._sock = listener  # owned by the caller (ha.py), who keeps it for the process's life
        self.port = listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, name="mooncake-master-sync-accept", daemon=True),
                         threading.Thread(target=self._pump, name="mooncake-master-sync", daemon=True)]
        for t in self._threads:
            t.start()

    # -- status ----------------------------------------------------------------------------------------------
    def info(self) -> dict:
        with self.cond:
            return {"sync_port": self.port, "sync_members": [c.name for c in self.members],
                    "sync_catching_up": [c.name for c in self.conns if not c.in_sync],
                    "sync_acked": min((c.acked for c in self.members), default=0), "sync_fast_acks": self.fast_acks}

    def oldest_needed(self) -> int | None:
        """The oldest op a connected standby has not acknowledged (None: no stream): compaction keeps it."""
        with self.cond:
            return min((c.acked + 1 for c in self.conns if not c.broken), default=None)

    # -- the RPC threads' side -------------------------------------------------------------------------------
    def _fast(self) -> bool:
        return bool(self.members) and not self.changing and not any(c.broken for c in self.members)

    def wait(self, lsn: int, timeout: float) -> bool:
        """Whether the ops up to `lsn` are durable (module docstring); waits at most `timeout` s. False: they
        will not be (the log write was fenced or failed, or the time ran out)."""
        j = self.journal
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if j.written >= lsn:
                    return True
                if j.failed or self._closed:
                    return False
                if self._fast() and min(c.acked for c in self.members) >= lsn:
                    self.fast_acked = max(self.fast_acked, lsn)
                    self.fast_acks += 1
                    return True
                if self._fast() and not self._driving:
                    self._driving = True
                    members = list(self.members)
                    upto = j.last_lsn()
                    self.cond.release()
                    try:
                        self._drive(members, upto, lsn)
                    finally:
                        self.cond.acquire()
                        self._driving = False
                        self.cond.notify_all()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)

    def _drive(self, members: list[_Standby], upto: int, lsn: int) -> None:
        """Driver token held, cond not held: sends the members what they lack up to `upto`, then reads acks
        until every member has `lsn` (or the backend log has it, or a member fails)."""
        for c in members:
            self._send_upto(c, upto)
        j = self.journal
        for c in members:
            while c.acked < lsn and not c.broken and j.written < lsn:
                self._read_acks(c, _SLICE_SEC)

    def _send_upto(self, c: _Standby, upto: int) -> None:
        """Token held: sends records (c.sent, upto] in frames; marks `c` broken on an error."""
        j = self.journal
        while c.sent < upto and not c.broken:
            with self.cond:
                recs = j.ring_slice(c.sent + 1, min(upto, c.sent + RECORDS_PER_FRAME))
            if recs is None:
                c.broken = "it fell behind the records kept in memory"
                return
            data = ('{"w":%d,"r":[%s]}' % (j.written, ",".join(recs))).encode()  # records are JSON already
            try:
                c.sock.sendall(FRAME.pack(len(data)) + data)
            except OSError as e:
                c.broken = f"send failed: {e}"
                return
            c.last_sent = time.monotonic()
            if c.pending == 0:
                c.waiting_since = c.last_sent
            c.pending += 1
            c.sent += len(recs)

    def _heartbeat(self, c: _Standby) -> None:
        """Token held (or a catching-up stream): an empty frame after HEARTBEAT_SEC of silence, so the standby
        knows the stream lives and how far the log is (it forgets the records the log holds)."""
        if time.monotonic() - c.last_sent < HEARTBEAT_SEC or c.broken:
            return
        try:
            _send_frame(c.sock, {"w": self.journal.written, "r": []})
            c.last_sent = time.monotonic()
        except OSError as e:
            c.broken = f"send failed: {e}"

    def _read_acks(self, c: _Standby, wait: float) -> None:
        """Token held: reads the acks that arrive within `wait` s (0: only those already there)."""
        try:
            ready = c.poller.poll(wait * 1000.0)  # poll, not select: descriptors may be >= FD_SETSIZE
            if not ready:
                if c.pending and time.monotonic() - c.waiting_since > self.timeout:
                    c.broken = f"no acknowledgement for {self.timeout:.1f} s"
                return
            data = c.sock.recv(65536)
        except (OSError, ValueError) as e:
            c.broken = f"receive failed: {e}"
            return
        if not data:
            c.broken = "the standby closed the stream"
            return
        c.take_acks(data)

    # -- the pump: catching-up standbys, idle members, set changes -------------------------------------------
    def _pump(self) -> None:
        while True:
            # Its own event, not `cond`: cond is notified on every call's completion, the pump needs no such pace.
            self._kick.wait(PUMP_SEC)
            self._kick.clear()
            with self.cond:
                if self._closed:
                    return
                token = not self._driving
                if token:
                    self._driving = True
                upto = self.journal.last_lsn()
                conns = list(self.conns)
            try:
                for c in conns:
                    if c.in_sync and not token:
                        continue
                    self._send_upto(c, upto)
                    self._heartbeat(c)
                    self._read_acks(c, 0)
            finally:
                if token:
                    with self.cond:
                        self._driving = False
                        self.cond.notify_all()
            self._maintain()

    def _maintain(self) -> None:
        """Drops broken streams (leaving the set first) and lets caught-up standbys join the set."""
        with self.cond:
            broken = [c for c in self.conns if c.broken]
            # Joining needs no catching up for safety (the change waits until the log holds every op acknowledged
            # so far); a standby close behind just keeps the fast path from waiting long for it.
            joining = next((c for c in self.conns if not c.in_sync and not c.broken
                            and self.journal.last_lsn() - c.acked <= RECORDS_PER_FRAME), None)
            trim_to = min((c.acked + 1 for c in self.conns if not c.broken), default=None)
            self.journal.trim_ring(trim_to, RING_MAX, RING_MAX_BYTES)
        if time.monotonic() < self._change_retry_at:
            return
        for c in broken:
            if c.in_sync:
                if not self._change([m for m in self.members if m is not c]):
                    self._change_retry_at = time.monotonic() + 0.2  # calls go through the log meanwhile
                    return
                _log.warning("standby %s left the sync set: %s", c.name, c.broken)
            else:
                _log.info("stream to standby %s closed: %s", c.name, c.broken)
            with self.cond:
                if c in self.conns:
                    self.conns.remove(c)
            c.sock.close()
        if joining is not None and not joining.broken:
            if self._change(self.members + [joining]):
                _log.info("standby %s joined the sync set at op %d", joining.name, joining.acked)
            else:
                self._change_retry_at = time.monotonic() + 0.2

    def _change(self, new_members: list[_Standby]) -> bool:
        """Stores `new_members` as the sync set (module docstring: only once the log holds every op
        acknowledged through the old set). False when it could not be written (the set stays as it was, the
        fast path off until a later try works; a fenced write ends the leadership through the journal)."""
        j = self.journal
        with self.cond:
            self.changing = True
            while j.written < self.fast_acked and not j.failed and not self._closed:
                self.cond.wait(0.05)
            if j.failed or self._closed:
                return False
        names = [c.name for c in new_members]
        try:
            ok = self._store.write_sync_set(names)
        except OSError as e:
            _log.warning("could not store the sync set %s: %s", names, e)
            ok = False
        with self.cond:
            if ok:
                for c in self.members:
                    c.in_sync = False
                self.members = list(new_members)
                for c in self.members:
                    c.in_sync = True
            self.changing = not ok and bool(self.members)
            self.cond.notify_all()
        return ok

    # -- standbys connecting ---------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self._closed:
                sock.close()
                return
            if not self._hellos.acquire(blocking=False):
                sock.close()  # a flood of connections: the standbys retry
                continue
            threading.Thread(target=self._hello, args=(sock,), name="mooncake-master-sync-hello",
                             daemon=True).start()

    def _hello(self, sock: socket.socket) -> None:
        try:
            self._hello_locked(sock)
        finally:
            self._hellos.release()

    def _hello_locked(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(5.0)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = _recv_frame(sock, MAX_HELLO)
            if not isinstance(hello, dict):
                raise ValueError("hello is not an object")
            if hello.get("snapshot") is True:
                self._send_snapshot(sock, str(hello.get("name", "")))
                return
            from_lsn, name = int(hello["from"]), str(hello["name"])
        except Exception as e:  # noqa: BLE001  (anything a peer can make json/int raise: closed, never fatal)
            _log.warning("sync stream: bad hello (%s); closed", e)
            sock.close()
            return
        with self.cond:
            why = self._refusal(from_lsn, name)
        try:
            _send_frame(sock, {"ok": not why, "why": why})
        except OSError:
            why = why or "the standby went away"
        if not why:
            with self.cond:  # answered first: no record frame may precede the answer
                why = self._refusal(from_lsn, name)
                if not why:
                    sock.settimeout(self.timeout)  # a standby that stops reading breaks its stream, never the sender
                    self.conns.append(_Standby(sock, name, from_lsn))
            self._kick.set()
        if why:
            _log.info("sync stream from %s refused: %s", name, why)
            sock.close()

    def _send_snapshot(self, sock: socket.socket, name: str) -> None:
        """Answers a snapshot request: the state once the log holds all of it (so it is a prefix of the log),
        as {"ok": true, "size": n} and n bytes of JSON."""
        try:
            state = self._snapshot() if self._snapshot is not None and not self._closed else None
            if state is None:
                _send_frame(sock, {"ok": False, "why": "this master no longer leads"})
            elif not self.journal.wait(state["seq"], 10.0):
                _send_frame(sock, {"ok": False, "why": "the log could not be written up to the snapshot"})
            else:
                data = json.dumps(state, separators=(",", ":")).encode()
                sock.settimeout(60.0)
                _send_frame(sock, {"ok": True, "size": len(data)})
                sock.sendall(data)
                _log.info("sent a snapshot (op %d, %d bytes) to standby %s", state["seq"], len(data), name)
        except OSError as e:
            _log.info("snapshot for standby %s not sent: %s", name, e)
        finally:
            sock.close()

    def _refusal(self, from_lsn: int, name: str) -> str:
        """cond held: why a standby asking for records from `from_lsn` cannot stream ("" if it can). A standby
        connects only with a state that is a prefix of the log (it checked), so its last op must be one the log
        holds, and the records after it must still be in memory."""
        if self._closed:
            return "this master no longer leads"
        for c in self.conns:
            if c.name == name and not c.broken:
                c.broken = "the standby reconnected"
        j = self.journal
        last = j.last_lsn()
        if from_lsn - 1 > last:
            return f"its state is ahead of this leader's log ({from_lsn - 1} > {last}): it must start over"
        if from_lsn < j.ring_first:
            return f"op {from_lsn} is no longer in memory: catch up from the log first"
        if from_lsn - 1 > j.written:
            return f"its op {from_lsn - 1} is not in the log yet: catch up from the log first"
        return ""

    def close(self) -> None:
        with self.cond:
            self.journal.relaxed = None
            self._closed = True
            self.cond.notify_all()
            conns = list(self.conns)
        self._kick.set()
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.sock.close()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)


def fetch_snapshot(address: str, name: str, timeout: float = 60.0) -> dict:
    """The leader's durable state (durable.snapshot_state) from its stream port at `address`; SyncRefused with
    its reason, OSError / ValueError for a connection or data problem."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
        _send_frame(sock, {"snapshot": True, "name": name})
        answer = _recv_frame(sock, MAX_HELLO)
        if not isinstance(answer, dict) or not answer.get("ok"):
            raise SyncRefused(str(answer.get("why") if isinstance(answer, dict) else answer))
        state = json.loads(_recv_exactly(sock, int(answer["size"])))
    if not isinstance(state, dict) or "seq" not in state:
        raise ValueError("the snapshot is not a state")
    return state


class StandbyStream:
    """A standby's stream from the leader at `address` ("host:port"). Each frame goes to
    ``on_frame(records, written, ack, stopping)`` (ha.py): it keeps the records a takeover may need, calls
    ``ack()`` (the acknowledgement says "in this standby's memory"), applies them, and forgets what the log
    holds (`written`, the leader's log position). Connect only with a state that is a prefix of the log.
    ``stop`` closes it and waits for the thread; ``on_frame`` sees ``stopping()`` true from then on, and no
    acknowledgement is sent after it returns. A stream silent for STANDBY_SILENCE_SEC (the leader sends
    heartbeats) ends. Raises SyncRefused (the leader's reason) or OSError."""

    def __init__(self, svc, address: str, name: str, on_frame) -> None:
        self._on_frame = on_frame
        host, _, port = address.rpartition(":")
        self.address = address
        self.error = ""
        self._stopping = False
        self._from = svc.applied_ops + 1
        self._sock = socket.create_connection((host.strip("[]"), int(port)), timeout=2.0)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _send_frame(self._sock, {"from": self._from, "name": name})
            answer = _recv_frame(self._sock, MAX_HELLO)
            if not isinstance(answer, dict) or not answer.get("ok"):
                raise SyncRefused(str(answer.get("why") if isinstance(answer, dict) else answer))
            self._sock.settimeout(STANDBY_SILENCE_SEC)
        except BaseException:
            self._sock.close()
            raise
        self._thread = threading.Thread(target=self._run, name="mooncake-master-sync-standby", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        expected = self._from  # the stream is contiguous from the hello's "from"
        sock = self._sock
        try:
            while True:
                frame = _recv_frame(sock, MAX_FRAME)
                if not isinstance(frame, dict) or not isinstance(frame.get("r"), list):
                    raise ValueError("a frame is not {w, r}")
                recs, written = frame["r"], int(frame.get("w", 0))
                if not all(isinstance(r, dict) for r in recs):
                    raise ValueError("a record is not an object")
                if recs:
                    lsns = [r.get("lsn") for r in recs]
                    if lsns != list(range(expected, expected + len(recs))):
                        raise ValueError(f"records {lsns[0]}..{lsns[-1]} do not follow op {expected - 1}")
                    expected += len(recs)
                last = recs[-1]["lsn"] if recs else 0
                self._on_frame(recs, written, lambda: sock.sendall(ACK.pack(last)), lambda: self._stopping)
                if self._stopping:
                    return
        except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as e:
            if not self._stopping:
                self.error = str(e) or type(e).__name__
                _log.warning("sync stream from the leader %s ended: %s", self.address, self.error)
        finally:
            sock.close()

    def stop(self) -> None:
        self._stopping = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=10)
