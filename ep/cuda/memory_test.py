"""The GPU path's device memory on the platform layer (ep/cuda/memory.py): on the host emulation (allocation,
IPC, copies, and every error as DeviceError / ValueError / TypeError), and on the real cuda platform plugin
against the platform's FAKE libcuda (transfer_engine/platform/cuda/testing), run as libcuda.so.1 by child
processes: one allocates and exports, another maps the handle and copies into it on the stream CudaDevice
picks (the legacy default stream for torch's default stream), not waited for, and the owner sees the bytes.

This file is also the child processes' program (`python memory_test.py owner|peer ...`)."""

import ctypes
import os
import subprocess
import sys

import pytest

from mooncake.ep.cuda import emulation
from mooncake.ep.cuda.memory import DeviceError, PlatformMemory

PLUGIN = "transfer_engine/platform/cuda/libmc_platform_cuda.so"
FAKE_DRIVER = "transfer_engine/platform/cuda/testing/libfake_cuda_driver.so"
SIZE = 1 << 16


def test_host_emulation_memory_maps_and_copies():
    owner, peer = PlatformMemory(emulation._host_emulation(), 0), PlatformMemory(emulation._host_emulation(), 0)
    base = owner.malloc(SIZE)
    from mooncake._native import platform
    assert platform.classify(base + 100) == "cuda:0"
    assert ctypes.string_at(base, SIZE) == bytes(SIZE)  # the emulation's memory is zero-filled
    handle = owner.ipc_handle(base)
    mapped = peer.ipc_open(handle)
    src = ctypes.create_string_buffer(b"mooncake", 8)
    peer.copy(mapped + 100, ctypes.addressof(src), 8, 0, True)
    assert ctypes.string_at(base + 100, 8) == b"mooncake"
    peer.ipc_close(mapped)
    owner.free(base)


def test_memory_errors_are_clear():
    mem = PlatformMemory(emulation._host_emulation(), 0)
    with pytest.raises(TypeError):
        mem.malloc("4096")
    with pytest.raises(TypeError):
        mem.ipc_open("not bytes")
    with pytest.raises(ValueError, match="not a device IPC handle"):
        mem.ipc_open(b"\0" * 64)  # e.g. a handle of the old 64-byte format
    with pytest.raises(ValueError, match="not allocated by malloc"):
        mem.free(4096)
    with pytest.raises(ValueError, match="not a mapping of ipc_open"):
        mem.ipc_close(4096)
    base = mem.malloc(SIZE)
    with pytest.raises(DeviceError, match="copy failed.*not mapped"):
        mem.copy(base, 8, 16, 0, True)  # an unmapped source: the platform's error, no crash
    with pytest.raises(DeviceError, match="no streams"):
        mem.copy(base, base + 64, 16, 5, True)  # the emulation has no streams
    handle = mem.ipc_handle(base)
    mem.free(base)
    with pytest.raises(DeviceError, match="import_ipc failed"):
        PlatformMemory(emulation._host_emulation(), 0).ipc_open(handle)  # the allocation is gone
    with pytest.raises(DeviceError, match="allocate"):
        PlatformMemory(emulation._host_emulation(), 9).malloc(SIZE)  # no such emulated device


def _fake_cuda_env(tmp_path) -> dict:
    plugin, fake = os.path.abspath(PLUGIN), os.path.abspath(FAKE_DRIVER)
    if not os.path.exists(plugin) or not os.path.exists(fake):
        pytest.skip("built without CUDA headers: no cuda platform plugin or fake driver")
    (tmp_path / "libcuda.so.1").symlink_to(os.path.realpath(fake))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "LD_LIBRARY_PATH": str(tmp_path),
            "MC_PLUGIN_DIR": os.path.dirname(plugin)}


def test_cuda_platform_on_the_fake_driver_across_processes(tmp_path):
    env = _fake_cuda_env(tmp_path)
    me = os.path.abspath(__file__)
    owner = subprocess.Popen([sys.executable, me, "owner"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        handle = owner.stdout.readline().strip()
        assert handle, owner.stderr.read()
        peer = subprocess.run([sys.executable, me, "peer", handle], env=env, capture_output=True, text=True,
                              timeout=60)
        assert peer.returncode == 0, peer.stderr
        assert peer.stdout.split() == ["legacy_copies=+1", "legacy_events=+1", "refused_same_process=True"]
        out, err = owner.communicate("written\n", timeout=60)
    finally:
        if owner.poll() is None:
            owner.kill()
    assert owner.returncode == 0, err
    assert out.split() == ["pattern_seen=True", "freed=True"]


# --- the child processes (under the fake libcuda.so.1) ---------------------------------------------------------

def _pattern(n: int) -> bytes:
    return bytes((i * 7 + 3) % 256 for i in range(n))


def _owner() -> int:
    from mooncake.ep.cuda import device as devmod
    reason = devmod.unavailable_reason()  # the platform is usable: what is missing is torch's CUDA or the kernels
    assert "cuda platform" not in (reason or ""), reason
    platform = devmod.cuda_platform()
    probe = platform.probe()
    assert probe["usable"] and probe["device_count"] == 2, probe
    mem = PlatformMemory(platform, 1)
    base = mem.malloc(SIZE)
    print(mem.ipc_handle(base).hex(), flush=True)
    sys.stdin.readline()  # the peer wrote
    print(f"pattern_seen={ctypes.string_at(base + 4096, 1000) == _pattern(1000)}")  # fake device memory is host
    mem.free(base)
    print(f"freed={not mem._allocated}")
    return 0


def _peer(handle_hex: str) -> int:
    from mooncake.ep.cuda import device as devmod
    handle = bytes.fromhex(handle_hex)
    fake = ctypes.CDLL("libcuda.so.1")  # the very driver the plugin loaded
    ops = fake.fake_cuda_stream_ops
    ops.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]

    def legacy_ops():
        copies, events = ctypes.c_int(), ctypes.c_int()
        assert ops(devmod.CU_STREAM_LEGACY, ctypes.byref(copies), ctypes.byref(events)) == 0
        return copies.value, events.value

    # CudaDevice's copy as it runs under torch's default stream (handle 0): its constructor refuses here (torch
    # has no CUDA), so only the fields copy() uses are set.
    dev = devmod.CudaDevice.__new__(devmod.CudaDevice)
    dev.index, dev._memory = 1, PlatformMemory(devmod.cuda_platform(), 1)
    dev.stream = lambda: 0
    mapped = dev.ipc_open(handle)
    src = ctypes.create_string_buffer(_pattern(1000), 1000)
    before = legacy_ops()
    dev.copy(mapped + 4096, ctypes.addressof(src), 1000, devmod.H2D)
    after = legacy_ops()
    print(f"legacy_copies=+{after[0] - before[0]}", f"legacy_events=+{after[1] - before[1]}")
    try:
        dev._memory.ipc_open(dev._memory.ipc_handle(dev._memory.malloc(4096)))
        refused = False
    except DeviceError as e:
        refused = "exported by this process" in str(e)
    print(f"refused_same_process={refused}")
    dev.ipc_close(mapped)
    return 0


if __name__ == "__main__":
    sys.exit(_owner() if sys.argv[1] == "owner" else _peer(sys.argv[2]))
