"""Data plane of Mooncake PG: registered memory and sequence-numbered channels over the Transfer Engine.

One TransferEngine per process (P2P handshake; same-host peers are reached by memcpy into their memfd
buffers, others over TCP; its own, or the caller's one given to set_transfer_engine) with one registered
arena from which every group carves its region, so a peer's cached segment descriptor stays valid when
later groups are created.

A group region (`Mesh`) holds, per channel (0 = collectives, 1 = point-to-point) and per peer, two
receive slots that the peer writes into, plus 64-byte flag lines the peers write sequence numbers into:

    data[c][src]  last chunk number src has written into my slots of channel c
    ack[c][dst]   last chunk number dst has consumed from its slots for me (I may reuse that slot)

Flag values are (epoch << 40) + chunk number: a membership change starts a new epoch in which every
channel restarts from chunk 1, and whatever a failed operation left behind compares lower.

A chunk goes: wait until the slot is free (ack >= seq - 2), copy it into my staging area (registered;
registering the caller's memory for each operation instead measured slower), write
staging -> peer's slot (header + bytes), then write the sequence number into the peer's data line.
A WRITE completes only once the target has the bytes, so the flag is never seen before the data.
Every wait polls local memory and is bounded by a deadline; a peer that does not deliver in time is
named in the `PeerFailure` raised.
"""

import ctypes
import datetime
import os
import socket
import threading
import time

import numpy as np

LINE = 64  # one flag per cache line
HDR = 64  # chunk header: [total bytes of the message, message kind, epoch]
COLL, P2P = 0, 1
# Waiting (no progress): yield the CPU for SPIN_S, then nap for 1/20 of the time waited so far (at most
# MAX_NAP_S); from PROBE_AFTER_S on, ask the engines of the silent peers whether they are still alive.
SPIN_S, MAX_NAP_S, PROBE_AFTER_S = 2e-4, 5e-4, 0.5
PROBE_TIMEOUT_MS, PROBE_TIMED_OUT = 1000, -400  # the probe's wait, and send_probe's code when it ran out
_ARENA_BYTES = int(os.environ.get("MC_PG_ARENA_BYTES", 1 << 30))  # virtual; memfd pages appear on touch


class PeerFailure(RuntimeError):
    """Ranks (group ranks) that did not deliver or could not be reached within the deadline."""

    def __init__(self, ranks, what):
        self.ranks = sorted(set(ranks))
        super().__init__(f"mooncake pg: {what}: rank(s) {self.ranks} failed or did not deliver in time")


class ResyncRequested(PeerFailure):
    """A peer started a membership resync (it saw a failure); the current operation is abandoned.
    `ranks` are the ones the operation was still waiting for."""

    def __init__(self, ranks, what="a peer started a membership resync"):
        super().__init__(ranks, what)


class _Process:
    """The process-wide engine and arena (set up on first use, or by set_transfer_engine; kept until exit)."""

    lock = threading.Lock()
    engine = None
    segment = None
    arena = 0
    free = None  # sorted list of (offset, length)
    host_ip = os.environ.get("MC_PG_HOST_IP", "127.0.0.1")

    @classmethod
    def get(cls):
        with cls.lock:
            if cls.engine is None:
                from mooncake.engine import TransferEngine

                engine = TransferEngine()
                # MC_PG_PROTOCOL: the preferred protocol; by default none (every usable transport, best per peer).
                # MC_PG_DEVICE: the NIC allow-list (the engine's device_name; "" = all).
                protocol = os.environ.get("MC_PG_PROTOCOL", "")
                if engine.initialize(cls.host_ip, "P2PHANDSHAKE", protocol, os.environ.get("MC_PG_DEVICE", "")) != 0:
                    raise RuntimeError(f"mooncake pg: transfer engine failed to start on {cls.host_ip}")
                cls._start(engine)
            return cls

    @classmethod
    def adopt(cls, engine):
        """Use the caller's engine (see set_transfer_engine)."""
        from mooncake.engine import InnerTransferEngine, TransferEngine

        if not isinstance(engine, TransferEngine):
            hint = (" (pass the TransferEngine itself, not get_engine() / get_engine_ptr())"
                    if isinstance(engine, (InnerTransferEngine, int)) else "")
            raise TypeError(f"mooncake pg: set_transfer_engine takes a mooncake.engine.TransferEngine, got "
                            f"{type(engine).__name__}{hint}")
        with cls.lock:
            if cls.engine is engine:
                return
            if cls.engine is not None:
                raise RuntimeError("mooncake pg: set_transfer_engine must be called before the first Mooncake "
                                   "process group of this process is created (it already uses another engine)")
            if not engine.get_local_segment_name():
                raise ValueError("mooncake pg: set_transfer_engine: the engine is not initialized (call "
                                 'initialize(host, "P2PHANDSHAKE", protocol, device) first) or was closed')
            cls._start(engine)

    @classmethod
    def _start(cls, engine):
        arena = engine.allocate_managed_buffer(_ARENA_BYTES)
        if not arena:
            raise RuntimeError(f"mooncake pg: cannot allocate a {_ARENA_BYTES}-byte registered arena")
        cls.engine, cls.segment, cls.arena = engine, engine.get_local_segment_name(), arena
        cls.free = [(0, _ARENA_BYTES)]

    @classmethod
    def carve(cls, nbytes):
        nbytes = (nbytes + 4095) & ~4095
        with cls.lock:
            for i, (off, length) in enumerate(cls.free):
                if length >= nbytes:
                    cls.free[i] = (off + nbytes, length - nbytes)
                    return cls.arena + off
        raise RuntimeError(f"mooncake pg: registered arena exhausted (need {nbytes} bytes; MC_PG_ARENA_BYTES)")

    @classmethod
    def release(cls, addr, nbytes):
        nbytes = (nbytes + 4095) & ~4095
        with cls.lock:
            cls.free.append((addr - cls.arena, nbytes))
            cls.free.sort()
            merged = []
            for off, length in cls.free:
                if merged and merged[-1][0] + merged[-1][1] == off:
                    merged[-1] = (merged[-1][0], merged[-1][1] + length)
                else:
                    merged.append((off, length))
            cls.free = merged


def set_host_ip(ip):
    """Address the engine advertises (before the first group is created; default 127.0.0.1)."""
    socket.inet_aton(ip)
    _Process.host_ip = ip


def set_transfer_engine(engine):
    """Run every Mooncake group of this process on `engine` (an initialized mooncake.engine.TransferEngine,
    shared with the caller, e.g. SGLang's) instead of an engine of its own; call it before the first group is
    created (again with the same engine: no-op). The registered arena (MC_PG_ARENA_BYTES) is allocated from
    it. The caller keeps ownership: the engine must stay open while any group lives, and all members' engines
    must reach each other (same metadata mode). TypeError for another object, ValueError for an engine that is
    not initialized, RuntimeError once the groups already use another engine."""
    _Process.adopt(engine)


def np_view(addr, nbytes, dtype=np.uint8):
    """A numpy array over raw memory (no copy; the memory must outlive the array)."""
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=dtype)


class Mesh:
    """The registered region of one group member and its channels to the other members.

    Contract: one thread at a time per (channel, direction): collectives run on the caller's thread,
    point-to-point sends on one worker and receives on another. `size` is the number of rank slots.
    """

    N_FLAG_KINDS = 4  # data[COLL], ack[COLL], data[P2P], ack[P2P]; then per src a membership record
    # (membership.py), one resync-request line and 8 scratch lines (local sources of flag writes)

    def __init__(self, store, rank, size, coll_slot, p2p_slot, lookup_timeout_s):
        """lookup_timeout_s: callable giving the bounded wait (seconds) for a peer's address."""
        self.proc = _Process.get()
        self.engine = self.proc.engine
        self.rank, self.size = rank, size
        self.slot = [coll_slot, p2p_slot]
        n = size
        self.flag_lines = (self.N_FLAG_KINDS + 1) * n + 1 + 8
        self.flag_bytes = self.flag_lines * LINE
        self.stage_off = [self.flag_bytes, self.flag_bytes + HDR + coll_slot]
        self.slots_off = [self.stage_off[1] + HDR + p2p_slot]
        self.slots_off.append(self.slots_off[0] + n * 2 * (HDR + coll_slot))
        self.nbytes = self.slots_off[1] + n * 2 * (HDR + p2p_slot)
        self.base = self.proc.carve(self.nbytes)
        self.flags = np.frombuffer((ctypes.c_uint64 * (self.flag_bytes // 8)).from_address(self.base),
                                   dtype=np.uint64)
        self.flags[:] = 0
        self.stage = [np_view(self.base + off, HDR + s) for off, s in zip(self.stage_off, self.slot)]
        self.send_seq = [[0] * n, [0] * n]
        self.recv_seq = [[0] * n, [0] * n]
        self.store = store
        self.lookup_timeout_s = lookup_timeout_s
        self.peers = {}  # rank -> (segment, base address)
        self.peer_lock = threading.Lock()
        self.closed = False
        self.epoch = 0  # flag values are (epoch << 40) + chunk number: a new epoch restarts every channel
        self.publish()

    # --- addressing ------------------------------------------------------------------------------
    def data_line(self, chan, src):
        return (chan * 2) * self.size + src

    def ack_line(self, chan, dst):
        return (chan * 2 + 1) * self.size + dst

    def member_line(self, src):
        return self.N_FLAG_KINDS * self.size + src

    @property
    def RESYNC(self):  # noqa: N802 - a line number, like the constants
        """The line peers raise (to the new session number) when they start a membership resync."""
        return (self.N_FLAG_KINDS + 1) * self.size

    def scratch_line(self, k):
        """Local source lines for flag writes (k < 8; one per writing thread/role)."""
        return self.RESYNC + 1 + k

    def slot_off(self, chan, src, k):
        return self.slots_off[chan] + (src * 2 + k) * (HDR + self.slot[chan])

    def publish(self):
        self.store.set(f"mcpg/seg/{self.rank}", f"{self.proc.segment}@{self.base}")

    def peer(self, r):
        """(segment, region address) of rank r, looked up in the group's store once (bounded wait)."""
        with self.peer_lock:
            if r not in self.peers:
                key = f"mcpg/seg/{r}"
                try:
                    self.store.wait([key], datetime.timedelta(seconds=self.lookup_timeout_s()))
                    segment, base = self.store.get(key).decode().rsplit("@", 1)
                except Exception as e:  # noqa: BLE001 - a store timeout, or the store is gone
                    raise PeerFailure([r], f"address lookup failed ({type(e).__name__}: {e})") from None
                self.peers[r] = (segment, int(base))
            return self.peers[r]

    def joiner_waiting(self, r):
        """Whether a process that created this group as an extension (is_extension=True) has published rank
        r's region and answers a probe now: it can be activated. Reads the store afresh (the cached address
        may be a dead predecessor's); False when the store or the process cannot be reached."""
        try:
            if not self.store.check([f"mcpg/join/{r}"]):
                return False
            joiner = self.store.get(f"mcpg/join/{r}")
            if joiner != self.store.get(f"mcpg/seg/{r}"):
                return False  # a later process took the rank without joining
            segment = joiner.decode().rsplit("@", 1)[0]
        except Exception:  # noqa: BLE001 - the store is gone: nobody can join
            return False
        return self.engine.send_probe(segment, PROBE_TIMEOUT_MS) == 0

    def announce_joiner(self):
        """Mark this process as an extension waiting to be activated (see joiner_waiting)."""
        self.store.set(f"mcpg/join/{self.rank}", f"{self.proc.segment}@{self.base}")

    def forget_peer(self, r):
        with self.peer_lock:
            self.peers.pop(r, None)

    def new_epoch(self, epoch, replaced=()):
        """Restart every channel in `epoch` (older flag values compare lower and are ignored);
        `replaced` ranks are fresh processes whose addresses are looked up again."""
        self.epoch = epoch
        self.send_seq = [[0] * self.size, [0] * self.size]
        self.recv_seq = [[0] * self.size, [0] * self.size]
        for r in replaced:
            self.forget_peer(r)

    # --- raw writes ------------------------------------------------------------------------------
    def write(self, r, local_addr, remote_off, nbytes):
        segment, base = self.peer(r)
        if self.engine.transfer_sync_write(segment, local_addr, base + remote_off, nbytes) != 0:
            raise PeerFailure([r], "transfer to peer failed")

    def write_flag(self, r, line, value, scratch):
        """Write `value` into flag line `line` of rank r, from local scratch line `scratch`."""
        self.flags[self.scratch_line(scratch) * 8] = value
        self.write(r, self.base + self.scratch_line(scratch) * LINE, line * LINE, 8)

    def write_record(self, r, line, words, scratch):
        """Write up to 8 uint64 words into line `line` of rank r (word 0 last: it marks the record valid)."""
        s = self.scratch_line(scratch) * 8
        self.flags[s:s + 8] = 0
        self.flags[s + 1:s + len(words)] = words[1:]
        self.write(r, self.base + s * 8 + 8, line * LINE + 8, LINE - 8)
        self.flags[s] = words[0]
        self.write(r, self.base + s * 8, line * LINE, 8)

    def read_line(self, line):
        return self.flags[line * 8:line * 8 + 8].copy()

    def alive(self, r):
        """False only when rank r's process is certainly gone: its engine refuses the probe (an RPC; used
        only once a wait is already late). A probe with no answer within PROBE_TIMEOUT_MS is no evidence (a
        starved or stopped process): the operation's own deadline deals with such a peer."""
        try:
            segment, _ = self.peer(r)
        except Exception:
            return False
        return self.engine.send_probe(segment, PROBE_TIMEOUT_MS) in (0, PROBE_TIMED_OUT)

    def close(self):
        if not self.closed:
            self.closed = True
            self.proc.release(self.base, self.nbytes)

    # --- chunked exchange ------------------------------------------------------------------------
    def _chunks(self, chan, nbytes):
        return max(1, -(-nbytes // self.slot[chan]))

    def exchange(self, chan, sends, recvs, kind, deadline, abort=None):
        """Deliver every send and consume every receive of one message per peer.

        sends: {peer: contiguous uint8 tensor or array}; recvs: {peer: (nbytes, consume)} where
        consume(offset, uint8 numpy view) (not None) is called for each received chunk in order (the
        view is only valid during the call). `kind` is an integer both sides must agree on (the
        collective type); a peer whose message has another size or kind raises ValueError (after its
        message was drained, so the channel stays usable). `abort()` is polled while waiting and may
        raise to abandon the operation. Raises PeerFailure when the deadline passes.
        """
        slot = self.slot[chan]
        sends = {p: [np.asarray(t), 0, self._chunks(chan, t.numel())] for p, t in sends.items()}
        recvs = {p: [n, 0, self._chunks(chan, n), fn] for p, (n, fn) in recvs.items()}
        stage, stage_addr = self.stage[chan], self.base + self.stage_off[chan]
        header = stage[:24].view(np.int64)
        base = self.epoch << 40
        flags = self.flags
        idle_since = next_probe = None
        mismatch = staged = None
        while sends or recvs:
            progress = False
            for p in list(sends):
                t, done, total = sends[p]
                seq = self.send_seq[chan][p] + 1
                if seq > 2 and int(flags[self.ack_line(chan, p) * 8]) < base + seq - 2:  # slot still busy
                    continue
                off = done * slot
                n = min(slot, t.size - off)
                header[0], header[1], header[2] = t.size, kind, self.epoch
                source = (t.ctypes.data + off, n)
                if n > 0 and staged != source:  # the same bytes for several peers are staged once
                    np.copyto(stage[HDR:HDR + n], t[off:off + n])
                    staged = source
                self.write(p, stage_addr, self.slot_off(chan, self.rank, seq % 2), HDR + n)
                self.write_flag(p, self.data_line(chan, self.rank), base + seq, chan * 2)
                self.send_seq[chan][p] = seq
                progress = True
                if done + 1 == total:
                    del sends[p]
                else:
                    sends[p][1] = done + 1
            for p in list(recvs):
                nbytes, done, total, consume = recvs[p]
                seq = self.recv_seq[chan][p] + 1
                if int(flags[self.data_line(chan, p) * 8]) < base + seq:
                    continue
                addr = self.base + self.slot_off(chan, p, seq % 2)
                got_n, got_kind, got_epoch = (int(v) for v in np_view(addr, 24, np.int64))
                if consume is not None and (got_n != nbytes or got_kind != kind or got_epoch != self.epoch):
                    # Drain the peer's whole message (so both channels stay aligned), then report.
                    mismatch = mismatch or ValueError(
                        f"mooncake pg: rank {p} sent a {got_n}-byte message of kind {got_kind} "
                        f"(epoch {got_epoch}), rank {self.rank} expected {nbytes} bytes of kind {kind} "
                        f"(epoch {self.epoch}): mismatched collectives, shapes, dtypes or splits across ranks?")
                    nbytes, total, consume = got_n, self._chunks(chan, got_n), None
                    recvs[p] = [nbytes, done, total, None]
                off = done * slot
                n = min(slot, nbytes - off)
                if n > 0 and consume is not None:
                    consume(off, np_view(addr + HDR, n))
                self.recv_seq[chan][p] = seq
                self.write_flag(p, self.ack_line(chan, self.rank), base + seq, chan * 2 + 1)
                progress = True
                if done + 1 == total:
                    del recvs[p]
                else:
                    recvs[p][1] = done + 1
                    recvs[p][3] = consume
            if progress:
                idle_since = None
                continue
            now = time.monotonic()
            if idle_since is None:
                idle_since, next_probe = now, now + PROBE_AFTER_S
                continue
            waited = now - idle_since
            if waited < SPIN_S:  # the peer is probably just behind: give it the CPU, stay hot
                os.sched_yield()
                continue
            if abort is not None:
                try:
                    abort()
                except ResyncRequested:  # name the ranks this operation still waited for
                    raise ResyncRequested(set(sends) | set(recvs)) from None
            if now > deadline:
                raise PeerFailure(set(sends) | set(recvs), "operation timed out")
            if now > next_probe:
                next_probe = now + PROBE_AFTER_S
                dead = [p for p in set(sends) | set(recvs) if not self.alive(p)]
                if dead:
                    raise PeerFailure(dead, "peer process is gone")
            time.sleep(min(MAX_NAP_S, waited / 20))
        if mismatch is not None:
            raise mismatch
