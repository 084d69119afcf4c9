"""The torch.distributed process group of Mooncake PG (registered as "mooncake-cpu" and "mooncake").

Collectives run on the caller's thread and return completed work objects (`async_op=True` gets the same
object; its future is already set). Point-to-point sends and receives run on one worker thread each, in
issue order, so isend/irecv pairs in any order cannot deadlock. Every operation is bounded by the
collective / P2P timeout (default 10 s). A failed operation's work raises `MooncakeOpError` from `wait()`
and records `failed_ranks` and `local_success`; with the default policy the survivors then agree on the
healthy set (membership.py) and later operations run without the failed ranks.
"""

import queue
import threading
import time

import torch
import torch.distributed as dist
from torch.futures import Future

from . import collectives as C
from .membership import Membership
from .transport import P2P, Mesh, PeerFailure, ResyncRequested

K_P2P = 100

TIMEOUTS_US = {"collective": 10_000_000, "p2p": 10_000_000}


class MooncakeOpError(RuntimeError):
    """An operation that did not complete on every involved rank; `failed_ranks` names the culprits."""

    def __init__(self, msg, failed_ranks):
        super().__init__(msg)
        self.failed_ranks = sorted(failed_ranks)


def _flag(name, value):
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"mooncake pg: MooncakeBackendOptions {name} must be a bool, got {value!r}")


def _slots(value):
    """max_group_size / max_world_size: None, or an int (<= 0 means unset, as Mooncake's -1)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"mooncake pg: MooncakeBackendOptions max_group_size must be an int, got {value!r}")
    return value if value > 0 else None


def _mask(t):
    """The 0/1 entries of an active_ranks tensor (validated)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("mooncake pg: MooncakeBackendOptions takes max_group_size (an int) or active_ranks (a "
                        f"torch.int32 tensor with a 0/1 entry per rank), got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"mooncake pg: active_ranks must be a torch.int32 tensor (a 0/1 entry per rank), got "
                        f"{t.dtype}")
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError("mooncake pg: active_ranks must be 1-D with one 0/1 entry per rank slot, got shape "
                         f"{tuple(t.shape)}")
    values = t.detach().cpu().tolist()
    bad = [(i, v) for i, v in enumerate(values) if v not in (0, 1)]
    if bad:
        raise ValueError(f"mooncake pg: active_ranks is a mask (entry r is 1 when rank r is active, else 0), not "
                         f"a list of ranks; (index, value) {bad[:8]} are neither 0 nor 1")
    return values


class MooncakeBackendOptions:
    """pg_options of a Mooncake group, in Mooncake's two forms:

        MooncakeBackendOptions(max_group_size[, is_extension[, auto_deactivate_on_failure=True,
                               auto_sync_on_failure=True]])
        MooncakeBackendOptions(active_ranks[, is_extension[, max_group_size]])

    active_ranks: a 1-D torch.int32 tensor (any device), one entry per rank slot: 1 = the rank is active from
    the start, 0 = a slot a process fills later (is_extension=True, join_group, then recover_ranks on a
    healthy rank). Its length is the group size, or max_group_size when that is given; every non-extension
    member must pass the same mask and be 1 in it. The group writes its view back into this tensor at each
    change (entry r is 1 exactly while rank r is active), as Mooncake does.
    max_group_size (keyword alias max_world_size): rank slots to reserve, at least the group size; <= 0 or
    None means the group size. is_extension: this process joins an existing group; its collectives are local
    only until join_group returns. auto_sync_on_failure needs auto_deactivate_on_failure.
    Wrong types raise TypeError and bad values ValueError: here, or when the group is created for what
    depends on the group size (the mask's length, this rank's entry)."""

    def __init__(self, first=None, is_extension=False, *rest, max_group_size=None, max_world_size=None,
                 active_ranks=None, auto_deactivate_on_failure=True, auto_sync_on_failure=True):
        if isinstance(first, torch.Tensor) or (first is None and active_ranks is not None):
            if first is not None and active_ranks is not None:
                raise TypeError("mooncake pg: MooncakeBackendOptions got active_ranks twice")
            active_ranks = first if first is not None else active_ranks
            if len(rest) > 1:
                raise TypeError("mooncake pg: MooncakeBackendOptions(active_ranks, is_extension, max_group_size) "
                                f"takes at most 3 positional arguments, got {2 + len(rest)}")
            if rest:
                max_group_size = rest[0]
        else:
            if first is not None and (isinstance(first, bool) or not isinstance(first, int)):
                _mask(first)  # raises the TypeError naming both forms
            max_group_size = first if first is not None else max_group_size
            if len(rest) > 2:
                raise TypeError("mooncake pg: MooncakeBackendOptions(max_group_size, is_extension, "
                                "auto_deactivate_on_failure, auto_sync_on_failure) takes at most 4 positional "
                                f"arguments, got {2 + len(rest)}")
            if rest:
                auto_deactivate_on_failure = rest[0]
            if len(rest) > 1:
                auto_sync_on_failure = rest[1]
        if max_world_size is not None:
            if max_group_size is not None and max_group_size != max_world_size:
                raise TypeError("mooncake pg: MooncakeBackendOptions got both max_group_size and max_world_size")
            max_group_size = max_world_size
        self.is_extension = _flag("is_extension", is_extension)
        self.auto_deactivate_on_failure = _flag("auto_deactivate_on_failure", auto_deactivate_on_failure)
        self.auto_sync_on_failure = _flag("auto_sync_on_failure", auto_sync_on_failure)
        if self.auto_sync_on_failure and not self.auto_deactivate_on_failure:
            raise ValueError("mooncake pg: MooncakeBackendOptions: auto_sync_on_failure requires "
                             "auto_deactivate_on_failure")
        self.max_group_size = _slots(max_group_size)
        self.active_ranks = active_ranks  # the caller's tensor (kept: the view is written back into it)
        self._mask = None if active_ranks is None else _mask(active_ranks)
        if self._mask is not None and self.max_group_size is not None and len(self._mask) != self.max_group_size:
            raise ValueError(f"mooncake pg: active_ranks has {len(self._mask)} entries but max_group_size is "
                             f"{self.max_group_size}: with max_group_size the mask has one entry per slot")

    def initial_view(self, rank, size):
        """(rank slots, active group ranks at creation) for group rank `rank` of a group of `size` ranks;
        ValueError for options that do not fit this group."""
        slots = self.max_group_size or size
        if slots < size:
            raise ValueError(f"mooncake pg: max_group_size {slots} is smaller than the group ({size} ranks)")
        if self._mask is None:
            active = set(range(size))
        else:
            if len(self._mask) != slots:
                raise ValueError(f"mooncake pg: active_ranks has {len(self._mask)} entries; this group has {size} "
                                 f"ranks{f' and {slots} slots' if slots != size else ''}, so it needs {slots} "
                                 "(one 0/1 entry per rank; pass max_group_size to reserve more slots)")
            active = {r for r, v in enumerate(self._mask) if v}
            beyond = sorted(r for r in active if r >= size)
            if beyond:
                raise ValueError(f"mooncake pg: active_ranks marks slot(s) {beyond} active, but this group has "
                                 f"{size} ranks: reserved slots start inactive")
        if self.is_extension:
            return slots, {rank}
        if rank not in active:
            raise ValueError(f"mooncake pg: rank {rank} is 0 in active_ranks {self._mask}; a process that joins "
                             "the group later is created with is_extension=True")
        return slots, active


class MooncakeWork(dist._Work):
    """A work object over a torch Future; `wait()` re-raises the operation's error."""

    def __init__(self, fut, op):
        super().__init__()
        self._fut = fut
        self.op = op
        self.failed_ranks = []
        self.local_success = True

    def wait(self, timeout=None):
        self._fut.wait()
        return True

    def get_future(self):
        return self._fut

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        return self._fut.done() and self.local_success

    def exception(self):
        try:
            self._fut.value() if self._fut.done() else None
        except Exception as e:  # noqa: BLE001 - reported, not handled
            return e
        return None

    def result(self):
        return self._fut.value()


def _done(result, op, error=None, failed=()):
    fut = Future()
    work = MooncakeWork(fut, op)
    if error is None:
        fut.set_result(result)
    else:
        work.failed_ranks, work.local_success = sorted(failed), False
        fut.set_exception(error)
    return work


class _Worker:
    """One thread running submitted jobs in order (point-to-point sends or receives of one group)."""

    def __init__(self, name):
        self.jobs = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def submit(self, job, work):
        self.jobs.put((job, work))

    def _loop(self):
        while True:
            item = self.jobs.get()
            if item is None:
                return
            job, work = item
            try:
                work._fut.set_result(job())
            except PeerFailure as e:
                work.failed_ranks, work.local_success = e.ranks, False
                work._fut.set_exception(MooncakeOpError(str(e), e.ranks))
            except Exception as e:  # noqa: BLE001 - handed to the waiter
                work.local_success = False
                work._fut.set_exception(e)

    def stop(self):
        self.jobs.put(None)


def _contiguous(tensors):
    """(contiguous host versions, write-back function for those that were copies: non-contiguous or
    device tensors, which are staged through host memory)."""
    cont = [t if t.is_contiguous() and t.device.type == "cpu" else t.detach().to("cpu").contiguous()
            for t in tensors]

    def write_back():
        for orig, c in zip(tensors, cont):
            if c is not orig:
                orig.copy_(c)

    return cont, write_back


class MooncakeBackend(dist.ProcessGroup):
    """One group member. `device` is "cpu" or "cuda" (the latter refused without CUDA)."""

    COLL_SLOT = 4 << 20
    P2P_SLOT = 1 << 20

    def __init__(self, dist_opts, options, device):
        store, rank, size = dist_opts.store, dist_opts.group_rank, dist_opts.group_size
        super().__init__(rank, size)
        self._rank = rank
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("mooncake pg: backend 'mooncake' needs CUDA, which is not available on this "
                               "machine (torch.cuda.is_available() is False); use backend='mooncake-cpu'")
        if options is None:
            options = MooncakeBackendOptions(size)
        elif not isinstance(options, MooncakeBackendOptions):
            raise TypeError(f"mooncake pg: pg_options must be a mooncake.pg.MooncakeBackendOptions, got "
                            f"{type(options).__name__}")
        self.options = options
        self.device = device
        slots, active = options.initial_view(rank, size)
        view = f"{slots}:{sorted(active)}"
        if not options.is_extension:  # before the region is published: a peer that sees one sees the other
            store.set(f"mcpg/view/{rank}", view)
        coll_slot = max(256 << 10, min(self.COLL_SLOT, (64 << 20) // (2 * slots)) & ~4095)
        timeout_s = lambda: TIMEOUTS_US["collective"] / 1e6  # noqa: E731 (read at each wait)
        self.mesh = Mesh(store, rank, slots, coll_slot, self.P2P_SLOT, timeout_s)
        self.members = Membership(self.mesh, active, timeout_s)
        self.members.on_change = self._write_view
        if options.is_extension:
            self.mesh.announce_joiner()
        else:  # look the peers up now, while the store (in rank 0) surely lives; they must share our view
            try:
                for r in sorted(active - {rank}):
                    self.mesh.peer(r)
                    theirs = store.get(f"mcpg/view/{r}").decode()
                    if theirs != view:
                        raise ValueError(f"mooncake pg: rank {rank} created the group with {view} (rank slots: "
                                         f"active ranks), rank {r} with {theirs}: every member must pass the same "
                                         "active_ranks / max_group_size")
            except PeerFailure as e:
                self.mesh.close()
                raise RuntimeError(f"mooncake pg: init of rank {rank}: {e}") from None
            except ValueError:
                self.mesh.close()
                raise
        self.suspects = set()
        self._lock = threading.Lock()
        self._senders = None
        self._receivers = None

    def getBackendName(self):
        return "mooncake"

    def _write_view(self, active):
        """Membership hook: mirror the view into the caller's active_ranks tensor (1 = active)."""
        t = self.options.active_ranks
        if t is not None:
            t.copy_(torch.tensor([int(r in active) for r in range(t.numel())], dtype=torch.int32))

    # --- running operations ---------------------------------------------------------------------
    def _check(self, tensors):
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"mooncake pg: expected a tensor, got {type(t).__name__}")
            if t.device.type not in ("cpu", self.device):
                raise ValueError(f"mooncake pg: this {self.device} group got a tensor on {t.device}")

    def _abort(self):
        """Polled while an operation waits: a resync request stops it, unless every proposer has finished it
        (then it completes here too; a dead peer it still waits for is found by probing)."""
        m = self.members
        if m.resync_requested() and not m.proposers_passed(m.done - m.owed + 1):
            raise ResyncRequested([])

    def _members(self):
        self.members.adopt_commits()
        if self.members.resync_requested() and self.options.auto_sync_on_failure:
            self.members.sync(self.suspects)
            self.suspects = set()
        if self._rank not in self.members.active:
            if self.members.was_active:
                raise RuntimeError(f"mooncake pg: rank {self._rank} is not active in epoch {self.members.epoch} "
                                   f"(active: {sorted(self.members.active)}): the group deactivated it, so its "
                                   "collectives cannot run until a healthy rank activates it again")
            return [self._rank]  # an extension before join_group: local-only collectives
        return sorted(self.members.active)

    def _collective(self, op, tensors, fn, result, root=None):
        """Run fn(ctx, contiguous tensors) now; `tensors` are written back if they were copies."""
        self._check(tensors)
        cont, write_back = _contiguous(tensors)
        with self._lock:
            members = self._members()
            if self.members.owed:  # the survivors' last sync failed this operation: fail it here too
                self.members.owed -= 1
                return self._abandoned(op)
            if root is not None and root not in members:
                raise ValueError(f"mooncake pg: {op} root rank {root} is not active (active: {members})")
            ctx = C.Ctx(self.mesh, self._rank, members,
                        time.monotonic() + TIMEOUTS_US["collective"] / 1e6, self._abort)
            try:
                fn(ctx, cont)
            except PeerFailure as e:
                self.members.done += 1  # counted before the sync: it carries the operation number
                return self._failed(op, e)
            except BaseException:
                self.members.done += 1
                raise
            self.members.done += 1
        write_back()
        return _done(result, op)

    def _failed(self, op, err):
        """The work of an operation that failed because of `err`; applies the failure policy."""
        failed = set(err.ranks)
        # A resync request is no evidence against the ranks the operation still waited for (they may just
        # have stopped too): the requester's proposal carries the evidence.
        self.suspects |= set() if isinstance(err, ResyncRequested) else failed
        dropped = set()
        if self.options.auto_sync_on_failure:
            dropped = self.members.sync(self.suspects)
            self.suspects = set()
            failed = (set() if isinstance(err, ResyncRequested) else failed) | dropped
        elif self.options.auto_deactivate_on_failure:
            self.members.pending_failure = True
        msg = (f"mooncake pg: {op} failed on rank {self._rank}: {err}; "
               + (f"deactivated rank(s) {sorted(dropped)} (epoch {self.members.epoch})" if dropped else
                  "no rank deactivated"))
        return _done(None, op, MooncakeOpError(msg, failed), failed)

    def _abandoned(self, op):
        """The work of an operation that the survivors' last sync failed before this rank reached it."""
        dropped = self.members.dropped
        msg = (f"mooncake pg: {op} failed on rank {self._rank}: the survivors failed this operation when they "
               f"agreed on a new view without rank(s) {sorted(dropped)} (epoch {self.members.epoch}); the "
               "next operation runs in that view")
        return _done(None, op, MooncakeOpError(msg, dropped), dropped)

    # --- collectives (signatures as torch's ProcessGroup calls them) ----------------------------
    def broadcast(self, tensors, opts):
        root = opts.rootRank
        return self._collective("broadcast", tensors, lambda ctx, ts: C.broadcast(ctx, ts[0], root), tensors,
                                root)

    def allreduce(self, tensors, opts):
        op = opts.reduceOp
        return self._collective("all_reduce", tensors, lambda ctx, ts: C.all_reduce(ctx, ts[0], op), tensors)

    def allgather(self, output_tensors, input_tensors, opts):
        outs = output_tensors[0]
        self._need(len(outs) == self.size(), f"all_gather needs {self.size()} output tensors, got {len(outs)}")
        return self._collective(
            "all_gather", outs + input_tensors,
            lambda ctx, ts: C.all_gather(ctx, dict(enumerate(ts[:-1])), ts[-1]), output_tensors)

    def all_gather_single(self, output, input, opts):
        self._need(output.numel() == input.numel() * self.size(),
                   f"all_gather_into_tensor output has {output.numel()} elements, needs "
                   f"{input.numel() * self.size()}")
        return self._collective(
            "all_gather_into_tensor", [output, input],
            lambda ctx, ts: C.all_gather(ctx, dict(enumerate(ts[0].view(self.size(), -1))), ts[1]), [output])

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        ins, op = input_tensors[0], opts.reduceOp
        self._need(len(ins) == self.size(), f"reduce_scatter needs {self.size()} inputs, got {len(ins)}")
        return self._collective(
            "reduce_scatter", output_tensors + ins,
            lambda ctx, ts: C.reduce_scatter(ctx, ts[0], dict(enumerate(ts[1:])), op), output_tensors)

    def reduce_scatter_single(self, output, input, opts):
        op = opts.reduceOp
        self._need(input.numel() == output.numel() * self.size(),
                   f"reduce_scatter_tensor input has {input.numel()} elements, needs "
                   f"{output.numel() * self.size()}")
        return self._collective(
            "reduce_scatter_tensor", [output, input],
            lambda ctx, ts: C.reduce_scatter(ctx, ts[0], dict(enumerate(ts[1].view(self.size(), -1))), op),
            [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce(self, tensors, opts):
        root, op = opts.rootRank, opts.reduceOp
        return self._collective("reduce", tensors, lambda ctx, ts: C.reduce(ctx, ts[0], root, op), tensors,
                                root)

    def gather(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        outs = output_tensors[0] if self.rank() == root else []
        if self.rank() == root:
            self._need(len(outs) == self.size(), f"gather needs {self.size()} outputs on the root")
        return self._collective(
            "gather", list(outs) + input_tensors,
            lambda ctx, ts: C.gather(ctx, dict(enumerate(ts[:-1])), ts[-1], root), output_tensors, root)

    def scatter(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        ins = input_tensors[0] if self.rank() == root else []
        if self.rank() == root:
            self._need(len(ins) == self.size(), f"scatter needs {self.size()} inputs on the root")
        return self._collective(
            "scatter", output_tensors + list(ins),
            lambda ctx, ts: C.scatter(ctx, ts[0], dict(enumerate(ts[1:])), root), output_tensors, root)

    def alltoall(self, output_tensors, input_tensors, opts):
        n = self.size()
        self._need(len(output_tensors) == n and len(input_tensors) == n, f"all_to_all needs {n} inputs and outputs")
        return self._collective(
            "all_to_all", output_tensors + input_tensors,
            lambda ctx, ts: C.all_to_all(ctx, dict(enumerate(ts[:n])), dict(enumerate(ts[n:]))), output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        out_splits = self._splits(output, output_split_sizes, "output")
        in_splits = self._splits(input, input_split_sizes, "input")

        def run(ctx, ts):
            outs, ins = ts[0].split(out_splits), ts[1].split(in_splits)
            C.all_to_all(ctx, dict(enumerate(outs)), dict(enumerate(ins)))

        return self._collective("all_to_all_single", [output, input], run, [output])

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._collective("barrier", [], lambda ctx, ts: C.barrier(ctx), [])

    def _splits(self, t, splits, what):
        n = self.size()
        if not splits:
            self._need(t.size(0) % n == 0, f"all_to_all_single {what} dim 0 ({t.size(0)}) not divisible by {n}")
            return [t.size(0) // n] * n
        splits = [int(s) for s in splits]
        self._need(len(splits) == n and sum(splits) == t.size(0) and min(splits) >= 0,
                   f"all_to_all_single {what} splits {splits} do not split dim 0 ({t.size(0)}) into {n} parts")
        return splits

    @staticmethod
    def _need(cond, msg):
        if not cond:
            raise ValueError(f"mooncake pg: {msg}")

    # --- point-to-point --------------------------------------------------------------------------
    def _peer_check(self, peer):
        if not 0 <= peer < self.size() or peer == self._rank:
            raise ValueError(f"mooncake pg: invalid peer rank {peer} (group size {self.size()}, rank {self._rank})")
        self.members.adopt_commits()
        if peer not in self.members.active or self._rank not in self.members.active:
            raise ValueError(f"mooncake pg: rank {peer if peer not in self.members.active else self._rank} is "
                             f"inactive in epoch {self.members.epoch} (active: {sorted(self.members.active)})")

    def _p2p(self, op, tensors, job):
        with self._lock:
            if self._senders is None:
                self._senders = _Worker(f"mcpg-send-{self.rank()}")
                self._receivers = _Worker(f"mcpg-recv-{self.rank()}")
        work = MooncakeWork(Future(), op)
        (self._senders if op == "send" else self._receivers).submit(job, work)
        return work

    def _deadline_p2p(self):
        return time.monotonic() + TIMEOUTS_US["p2p"] / 1e6

    def send(self, tensors, dst, tag=0):
        self._check(tensors)
        self._peer_check(dst)
        (t,), _ = _contiguous(tensors[:1])  # a host copy if needed, taken now
        data = C.as_bytes(t)
        return self._p2p("send", tensors, lambda: self.mesh.exchange(
            P2P, {dst: data}, {}, K_P2P, self._deadline_p2p()) or tensors)

    def recv(self, tensors, src, tag=0):
        self._check(tensors)
        self._peer_check(src)
        t = tensors[0]

        def job():
            (c,), write_back = _contiguous([t])
            self.mesh.exchange(P2P, {}, {src: (c.numel() * c.element_size(), C.copy_into(c))}, K_P2P,
                               self._deadline_p2p())
            write_back()
            return tensors

        return self._p2p("recv", tensors, job)

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("mooncake pg: recv from any source is not supported; name the source rank")

    # --- lifecycle ---------------------------------------------------------------------------------
    def shutdown(self):
        for w in (self._senders, self._receivers):
            if w is not None:
                w.stop()
        self._senders = self._receivers = None
        self.mesh.close()

    def abort(self):
        self.shutdown()
