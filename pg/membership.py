"""Membership of a Mooncake PG group: who is active, in which epoch, and how survivors agree after a failure.

There is no coordinator process: every member holds the view (epoch, active ranks) and changes it by
writing records into the other members' registered memory (one 64-byte line per writer, see
Mesh.member_line): [session, round word, mask words...]; the round word of a sync proposal is
round | (operation number + OP_BIAS) << ROUND_BITS, that of a commit is COMMIT. Two kinds of change:

- sync (after a failure): each survivor proposes `active - suspects` to every rank it still trusts and
  raises their resync line (which makes any operation they are blocked in stop at once). In rounds, a
  survivor waits (bounded) for every trusted rank's proposal, drops ranks that did not answer and
  intersects the masks; it stops when its mask is unchanged and every received mask equals it, then writes
  one more round so slower survivors finish too. No rank is special, so the death of rank 0 is handled
  like any other. The agreed view gets epoch = session = old epoch + 1.
  A proposal also carries the proposer's operation number: the collectives it has finished (failed ones
  included) in the current epoch, minus those it still owes (below). Survivors take the maximum, M, as they
  intersect the masks (agreement needs equal masks and equal M). M is the last operation of the old view:
  every survivor fails its collectives up to number M (one it has not reached yet fails at once, without
  communicating: `owed`) and all of them run number M + 1 as the first operation of the new view. So a
  survivor that reaches the failed collective late (it syncs on entry) fails that same collective instead
  of running it alone in the new view and timing out on (and dropping) a healthy peer.
- commit (activation of a joiner, or an explicit deactivation): the caller writes (new epoch, COMMIT,
  mask) to every member of the old and new view; members adopt it before their next collective.
  Calling the same change on several members is harmless (they write the same record).
"""

import time

from .transport import PROBE_AFTER_S, PeerFailure

COMMIT = (1 << 62)
MASK_WORDS = 6  # up to 384 ranks
SCRATCH = 4  # Mesh scratch line used for membership writes
ROUND_BITS = 16  # a sync proposal's round word: round in the low bits, then its operation number (biased:
OP_BIAS = 1 << 40  # it is negative while the proposer still owes operations of an earlier view)


def _mask_words(ranks):
    words = [0] * MASK_WORDS
    for r in ranks:
        words[r // 64] |= 1 << (r % 64)
    return words


def _ranks(words):
    return {w * 64 + b for w in range(MASK_WORDS) for b in range(64) if int(words[w]) >> b & 1}


class Membership:
    """View of one group member. `active` is a set of group ranks; `epoch` increases with each change."""

    def __init__(self, mesh, active, timeout_s):
        """timeout_s: a callable giving the bounded wait (seconds) for each agreement round."""
        if mesh.size > 64 * MASK_WORDS:
            raise ValueError(f"mooncake pg: at most {64 * MASK_WORDS} ranks per group")
        self.mesh = mesh
        self.rank = mesh.rank
        self.active = set(active)
        self.epoch = 0
        self.timeout_s = timeout_s
        self.pending_failure = False  # a failure was seen and not yet synced (auto_sync off)
        self.replaced = set()  # ranks that rejoined as fresh processes (their addresses are looked up again)
        self.done = 0  # collectives finished (failed ones included) in this epoch; counted by the backend
        self.owed = 0  # collectives the last sync failed that this rank has not reached yet (they fail at once)
        self.dropped = set()  # ranks the last sync dropped
        self.was_active = self.rank in self.active  # false only for an extension not activated yet
        self.on_change = None  # called with the new active set after each view change (the backend's hook)

    # --- reading the others' records --------------------------------------------------------------
    def _record(self, src):
        """(session, round, operation number or None for a commit, mask) of src's record."""
        w = self.mesh.read_line(self.mesh.member_line(src))
        word = int(w[1])
        if word & COMMIT:
            rnd, op = COMMIT, None
        else:
            rnd, op = word & ((1 << ROUND_BITS) - 1), (word >> ROUND_BITS) - OP_BIAS
        return int(w[0]), rnd, op, _ranks(w[2:2 + MASK_WORDS])

    def resync_requested(self):
        return int(self.mesh.flags[self.mesh.RESYNC * 8]) > self.epoch

    def proposers_passed(self, op):
        """Whether every sync proposal received for the requested session comes from a rank that finished
        operation number `op` and failed a later one: the operation in progress here is then not the one
        the survivors fail, and its data from them has arrived or is arriving."""
        session = int(self.mesh.flags[self.mesh.RESYNC * 8])
        seen = False
        for p in self.active - {self.rank}:
            s, _, q, _ = self._record(p)
            if s == session:
                if q is None or q <= op:
                    return False
                seen = True
        return seen

    def _apply(self, epoch, active):
        joined = set(active) - self.active
        self.replaced |= joined
        self.epoch, self.active = epoch, set(active)
        self.done = 0  # operation numbers restart with the view (`owed` stays: it is counted before it)
        self.was_active = self.was_active or self.rank in self.active
        self.mesh.new_epoch(epoch, replaced=joined)
        if self.on_change is not None:
            self.on_change(self.active)

    def adopt_commits(self):
        """Adopt the newest committed view written by any rank (called before each collective)."""
        best = None
        flags, size = self.mesh.flags, self.mesh.size
        for src in range(size):
            line = self.mesh.member_line(src) * 8
            session, rnd = int(flags[line]), int(flags[line + 1])
            if rnd == COMMIT and session > self.epoch and (best is None or session > best[0]):
                best = (session, _ranks(flags[line + 2:line + 2 + MASK_WORDS]))
        if best is not None:
            self._apply(*best)
            return True
        return False

    # --- changes ----------------------------------------------------------------------------------
    def _send(self, ranks, session, rnd, mask, raise_resync, op=None):
        """Write our record (a commit, or a sync proposal with operation number `op`) to `ranks`; returns
        the ranks that could not be reached."""
        words = [session, rnd if op is None else rnd | (op + OP_BIAS) << ROUND_BITS] + _mask_words(mask)
        unreachable = set()
        for p in sorted(ranks - {self.rank}):
            try:
                # The record before the resync line: a peer that sees the line and starts its own sync
                # reads this record at once and adopts its evidence (a record not there yet would make it
                # wait a full round on a rank this proposal already dropped).
                self.mesh.write_record(p, self.mesh.member_line(self.rank), words, SCRATCH)
                if raise_resync:
                    self.mesh.write_flag(p, self.mesh.RESYNC, session, SCRATCH + 1)
            except PeerFailure:
                unreachable.add(p)
            except Exception:  # its address is unknown (the store is gone): same as unreachable
                unreachable.add(p)
        return unreachable

    def commit(self, new_active, extra_targets=()):
        """Install view `new_active` in a new epoch on every old and new member (see module doc)."""
        session = self.epoch + 1
        for r in set(new_active) - self.active:  # possibly a fresh process: look its address up again
            self.mesh.forget_peer(r)
        targets = (self.active | set(new_active) | set(extra_targets)) - {self.rank}
        self._send(targets, session, COMMIT, new_active, raise_resync=False)
        self._apply(session, new_active)
        return session

    def sync(self, suspects=()):
        """Agree with the other survivors on the healthy set and on the last operation of the old view
        (module doc); returns the ranks dropped. Afterwards `owed` collectives fail at once."""
        session = max(self.epoch, int(self.mesh.flags[self.mesh.RESYNC * 8]) - 1) + 1
        before = set(self.active)
        mine = op = self.done - self.owed
        mask = (self.active - set(suspects)) | {self.rank}
        for p in before - {self.rank}:  # proposals already made for this session carry their evidence
            s, _, q, m = self._record(p)
            if s == session and self.rank in m:
                mask &= m | {self.rank}
                op = op if q is None else max(op, q)
        for rnd in range(1, len(before) + 3):
            mask -= self._send(mask, session, rnd, mask, raise_resync=True, op=op)
            got = self._collect(mask, session, rnd, op)
            new, new_op = set(mask) & set(got) | {self.rank}, op
            for m, q in got.values():
                new &= m | {self.rank}
                new_op = new_op if q is None else max(new_op, q)
            excluded_me = [p for p, (m, _) in got.items() if self.rank not in m]
            if excluded_me:
                raise RuntimeError(f"mooncake pg: rank(s) {excluded_me} consider rank {self.rank} failed; "
                                   "this rank is no longer part of the group (rejoin with is_extension=True)")
            if new == mask and new_op == op and all(m == mask and q in (None, op) for m, q in got.values()):
                self._send(mask, session, rnd + 1, mask, raise_resync=False, op=op)
                break
            mask, op = new, new_op
        else:
            raise RuntimeError("mooncake pg: survivors did not agree on the healthy set")
        self._apply(session, mask)
        self.owed = op - mine  # operations up to number `op` of the old view fail; op + 1 is the new view's 1
        self.dropped = before - mask
        self.pending_failure = False
        return before - mask

    def _collect(self, mask, session, rnd, op):
        """{rank: (mask, operation number)} proposed by the ranks in `mask` for this session at round >= rnd
        (bounded wait); for a rank already in a later session: (our mask, None) if its view has us.

        A silent rank is waited for `timeout_s()`, except that one whose process is gone (its engine no
        longer answers probes, asked every PROBE_AFTER_S) is given up at once, and one already taking part
        in this session at an earlier round gets twice as long: it may itself be waiting out a silent rank,
        and both waits are the same length, so the usual wait would drop a healthy survivor by a race."""
        got = {self.rank: (set(mask), op)}
        start = time.monotonic()
        wait = self.timeout_s()
        next_probe = start + PROBE_AFTER_S
        waiting = set(mask) - {self.rank}
        behind = set()  # in this session, at an earlier round
        while waiting:
            now = time.monotonic()
            for p in list(waiting):
                s, r, q, m = self._record(p)
                if s == session and r >= rnd:
                    got[p] = (m, q)
                    waiting.discard(p)
                elif s > session:
                    # It finished this session and moved on: a commit (e.g. a rejoin) or the sync of a later
                    # failure replaced its record. If its new view has us, it agreed with our mask and count
                    # (it saw every mask equal to ours); the later change is adopted after this one. If not,
                    # the survivors dropped us.
                    got[p] = (set(mask) if self.rank in m else m, None)
                    waiting.discard(p)
                elif s == session:
                    behind.add(p)
            waiting = {p for p in waiting if now < start + (2 * wait if p in behind else wait)}
            if waiting and now >= next_probe:
                next_probe = now + PROBE_AFTER_S
                waiting = {p for p in waiting if self.mesh.alive(p)}
            if waiting:
                time.sleep(2e-4)
        return got

    def wait_for_activation(self, deadline):
        """Block (a joiner) until a committed view containing this rank arrives."""
        while time.monotonic() < deadline:
            if self.adopt_commits() and self.rank in self.active:
                return
            time.sleep(1e-3)
        raise TimeoutError(f"mooncake pg: rank {self.rank} was not activated in time (call recover_ranks "
                           "on a healthy rank)")
