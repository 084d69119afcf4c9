"""The GPU path of mooncake.ep.Buffer, run on the host EMULATION of a device (MC_EP_EMULATE_GPU=1), so its
orchestration (device staging, same-host device-to-device copies through IPC mappings, metadata and flags
through the host buffers, timeouts) is checked against the plain-torch reference on machines without a GPU."""

import json

import pytest

from mooncake.ep.testing import run_ranks


@pytest.fixture(autouse=True)
def emulated_gpu(monkeypatch):
    monkeypatch.setenv("MC_EP_EMULATE_GPU", "1")


@pytest.mark.parametrize("world,backend,ipc", [(2, "gloo", "1"), (3, "mooncake-cpu", "1"), (3, "gloo", "0"),
                                               (2, "gloo", "open-fails")])
def test_gpu_path_matches_the_reference(world, backend, ipc, monkeypatch):
    """ipc=1: device-to-device copies into mapped peer buffers; ipc=0: rows through the host buffers;
    open-fails: handles are published but cannot be mapped, so each sender falls back to the host route and
    says so in its metadata."""
    if ipc == "open-fails":
        monkeypatch.setenv("MC_EP_EMULATE_IPC_OPEN_FAILS", "1")
    else:
        monkeypatch.setenv("MC_EP_GPU_IPC", ipc)
    for rc, out, err in run_ranks(world, "basic", backend=backend):
        assert rc == 0, err[-3000:]
        report = json.loads(out)
        assert report["active"] == [1] * world and report["path"] == "gpu"


def test_gpu_path_drops_a_killed_rank_within_the_timeout():
    reports = run_ranks(3, "killed")
    for rc, out, err in reports[:2]:
        assert rc == 0, err[-3000:]
        r = json.loads(out)
        assert r["active"] == [1, 1, 0] and r["round1_seconds"] < 6
