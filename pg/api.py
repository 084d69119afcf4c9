"""Public API of Mooncake PG (re-exported by mooncake.pg; see its docstring)."""

import enum
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .backend import TIMEOUTS_US, MooncakeBackend, MooncakeBackendOptions, MooncakeOpError, MooncakeWork
from .transport import set_host_ip, set_transfer_engine

__all__ = [
    "MooncakeBackend", "MooncakeBackendOptions", "MooncakeOpError", "MooncakeWork", "ProposalStatus",
    "ProposeViewUpdateResponse", "SyncAfterFailureStatus", "SyncAfterFailureResponse", "activate_ranks",
    "deactivate_ranks", "get_active_ranks", "get_current_epoch", "get_failed_ranks_hint", "get_local_success",
    "get_num_synced_ranks", "get_peer_state", "join_group", "recover_ranks", "set_collective_timeout_us",
    "set_fault_reconciliation_window_us", "set_host_ip", "set_p2p_timeout_us", "set_transfer_engine",
    "sync_after_failure",
]


class ProposalStatus(enum.Enum):
    Rejected = 0
    Applied = 1
    AppliedWithDroppedRanks = 2


class SyncAfterFailureStatus(enum.Enum):
    Reconciled = 0
    NoPending = 1
    Rejected = 2


@dataclass
class ProposeViewUpdateResponse:
    status: ProposalStatus
    new_epoch: int = 0
    dropped_ranks: list = field(default_factory=list)
    reject_reason: str = ""


@dataclass
class SyncAfterFailureResponse:
    status: SyncAfterFailureStatus
    reject_reason: str = ""


def _register():
    def creator(device):
        return lambda dist_opts, options: MooncakeBackend(dist_opts, options, device)

    for name, device in (("mooncake-cpu", "cpu"), ("mooncake", "cuda")):
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, creator(device), extended_api=True, devices=[device])


_register()


def _backend(backend):
    if isinstance(backend, MooncakeBackend):
        return backend
    if backend is None and dist.is_initialized():
        backend = dist.group.WORLD
    if isinstance(backend, MooncakeBackend):
        return backend
    raise TypeError(f"mooncake pg: expected a Mooncake process group, got {type(backend).__name__}")


# --- timeouts ------------------------------------------------------------------------------------------
def _timeout_us(name, us):
    if isinstance(us, bool) or not isinstance(us, int):
        raise TypeError(f"mooncake pg: {name} takes an int (microseconds), got {type(us).__name__}")
    if us <= 0:
        raise ValueError(f"mooncake pg: {name} takes a positive number of microseconds, got {us}")
    return us


def set_collective_timeout_us(us):
    TIMEOUTS_US["collective"] = _timeout_us("set_collective_timeout_us", us)


def set_p2p_timeout_us(us):
    TIMEOUTS_US["p2p"] = _timeout_us("set_p2p_timeout_us", us)


def set_fault_reconciliation_window_us(us):
    """Kept for compatibility: agreement rounds here are bounded by the collective timeout."""
    TIMEOUTS_US["reconciliation"] = int(us)


# --- reporting -----------------------------------------------------------------------------------------
def get_failed_ranks_hint(work):
    """Group ranks the (finished) operation of `work` found failed or silent; [] if it succeeded."""
    if not isinstance(work, MooncakeWork):
        raise TypeError("mooncake pg: get_failed_ranks_hint takes a work object returned with async_op=True")
    return list(work.failed_ranks)


def get_local_success(work):
    if not isinstance(work, MooncakeWork):
        raise TypeError("mooncake pg: get_local_success takes a work object returned with async_op=True")
    return bool(work.local_success)


def get_active_ranks(backend=None):
    """Sorted group ranks of the current view."""
    return sorted(_backend(backend).members.active)


def get_num_synced_ranks(backend=None):
    return len(_backend(backend).members.active)


def get_current_epoch(backend=None):
    return _backend(backend).members.epoch


def get_peer_state(backend, ranks):
    """Per rank of `ranks`, whether it is ready to take part (Mooncake's activation readiness): True for an
    active rank not seen failing, and for an inactive one whose process created the group with
    is_extension=True and answers a probe now (recover_ranks can activate it); False otherwise (a failed or
    dead rank, an empty slot). ValueError for a rank outside the group's slots. Probes only inactive ranks."""
    b = _backend(backend)
    ranks, err = _check_ranks(b, ranks)
    if err:
        raise ValueError(f"mooncake pg: get_peer_state: {err}")
    with b._lock:
        b.members.adopt_commits()
        active, suspects = set(b.members.active), set(b.suspects)
    return [r not in suspects if r in active else b.mesh.joiner_waiting(r) for r in ranks]


# --- membership changes --------------------------------------------------------------------------------
def _check_ranks(b, ranks):
    ranks = [int(r) for r in (ranks.tolist() if isinstance(ranks, torch.Tensor) else ranks)]
    bad = [r for r in ranks if not 0 <= r < b.mesh.size]
    return ranks, (f"invalid rank(s) {bad} (group has {b.mesh.size} rank slots)" if bad else "")


def deactivate_ranks(backend, ranks):
    b = _backend(backend)
    ranks, err = _check_ranks(b, ranks)
    if err or b._rank in ranks:
        return ProposeViewUpdateResponse(ProposalStatus.Rejected, b.members.epoch, [],
                                         err or "a rank cannot deactivate itself")
    with b._lock:
        epoch = b.members.commit(b.members.active - set(ranks))
        b.suspects -= set(ranks)
    return ProposeViewUpdateResponse(ProposalStatus.Applied, epoch)


def activate_ranks(backend, ranks):
    """Activate ranks (replacement processes waiting in join_group); call on a healthy member."""
    b = _backend(backend)
    ranks, err = _check_ranks(b, ranks)
    beyond = [r for r in ranks if r >= b.size()]
    if beyond and not err:  # the torch group's size is fixed when it is created
        err = (f"rank(s) {beyond} are reserved slots beyond this group's {b.size()} ranks: only ranks of the "
               "group can be activated")
    if err or b._rank not in b.members.active:
        return ProposeViewUpdateResponse(ProposalStatus.Rejected, b.members.epoch, [],
                                         err or "only an active rank can activate others")
    with b._lock:
        b.members.adopt_commits()
        if set(ranks) <= b.members.active:
            return ProposeViewUpdateResponse(ProposalStatus.Applied, b.members.epoch)
        epoch = b.members.commit(b.members.active | set(ranks))
    return ProposeViewUpdateResponse(ProposalStatus.Applied, epoch)


recover_ranks = activate_ranks


def join_group(backend=None, timeout_s=None):
    """A replacement process (is_extension=True) blocks here until a healthy rank activates it."""
    b = _backend(backend)
    if not b.options.is_extension:
        raise RuntimeError("mooncake pg: join_group is for processes created with is_extension=True")
    wait = timeout_s if timeout_s is not None else max(60.0, 6 * TIMEOUTS_US["collective"] / 1e6)
    with b._lock:
        b.members.wait_for_activation(time.monotonic() + wait)


def sync_after_failure(backend=None):
    """Agree with the survivors on the healthy set after a failure (when auto_sync_on_failure is off)."""
    b = _backend(backend)
    if not b.options.auto_deactivate_on_failure:
        return SyncAfterFailureResponse(SyncAfterFailureStatus.Rejected,
                                        "auto_deactivate_on_failure is off: use deactivate_ranks")
    if not b.members.pending_failure and not b.members.resync_requested():
        return SyncAfterFailureResponse(SyncAfterFailureStatus.NoPending)
    with b._lock:
        b.members.sync(b.suspects)
        b.suspects = set()
    return SyncAfterFailureResponse(SyncAfterFailureStatus.Reconciled)
