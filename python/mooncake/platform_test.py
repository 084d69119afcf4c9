"""mooncake._native.platform: the platform list and its reasons, memory classification, and the host emulation's
allocate / IPC (exported here, imported by a child process) / copy calls, with bad input giving clear errors."""

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from mooncake._native import platform


def test_platforms_list_cpu_first_and_say_why_others_cannot_run():
    listed = platform.platforms()
    assert listed[0]["name"] == "cpu" and listed[0]["usable"] and listed[0]["memory_type"] == "host"
    by_name = {p["name"]: p for p in listed}
    emu = by_name["host_emulation"]
    if os.environ.get("MC_PLATFORM_EMULATION") != "1" and not emu["usable"]:
        assert "MC_PLATFORM_EMULATION=1" in emu["reason"]
    for p in listed:
        assert set(p) == {"name", "memory_type", "usable", "reason", "device_count"}
        assert p["usable"] or p["reason"], p  # an unusable platform always says why


def test_classify_host_memory_and_bad_types():
    buf = np.zeros(64, dtype=np.uint8)
    assert platform.classify(buf.ctypes.data) == "host"
    assert platform.classify(0) == "host"
    with pytest.raises(TypeError):
        platform.classify("0x1000")
    with pytest.raises(TypeError):
        platform.classify(-1)
    with pytest.raises(KeyError, match="no platform named 'nope'"):
        platform.get("nope")


def test_cpu_platform_pinned_memory_and_safe_copy():
    cpu = platform.get("cpu")
    assert cpu.name == "cpu" and cpu.memory_type == "host"
    p = cpu.allocate(4096, "pinned_host")
    src = np.arange(4096, dtype=np.uint8)
    cpu.copy(p, src.ctypes.data, 4096)
    assert ctypes.string_at(p, 4096) == src.tobytes()
    with pytest.raises(ValueError, match="not mapped"):
        cpu.copy(p, 8, 16)  # an unmapped source: an error, not a crash
    with pytest.raises(NotImplementedError):
        cpu.allocate(4096, "device")
    with pytest.raises(NotImplementedError):
        cpu.export_ipc(p, 4096)
    with pytest.raises(ValueError, match="kind must be"):
        cpu.allocate(4096, "gpu")
    with pytest.raises(ValueError):
        cpu.free(p, 100, "pinned_host")  # wrong length
    cpu.free(p, 4096, "pinned_host")


def test_copy_streams_and_bad_arguments():
    cpu = platform.get("cpu")
    src, dst = np.arange(64, dtype=np.uint8), np.zeros(64, dtype=np.uint8)
    with pytest.raises(ValueError, match="no streams"):
        cpu.copy(dst.ctypes.data, src.ctypes.data, 64, -1, 0x1234)  # the cpu platform has none
    assert not dst.any()
    cpu.copy(dst.ctypes.data, src.ctypes.data, 64, stream=0, wait=False)  # cpu copies finish at once
    assert (dst == src).all()
    with pytest.raises(TypeError):
        cpu.copy(dst.ctypes.data, src.ctypes.data, 64, -1, "stream")
    with pytest.raises(TypeError):
        cpu.copy(dst.ctypes.data, src.ctypes.data, 64, -1, -1)  # a handle is never negative
    with pytest.raises(TypeError):
        cpu.copy(dst.ctypes.data, src.ctypes.data, 64, wait="yes")


@pytest.fixture()
def emu():
    platform.enable_host_emulation(2)
    p = platform.get("host_emulation")
    assert p.probe()["usable"] and p.probe()["device_count"] == 2
    return p


def test_host_emulation_memory_classifies_as_cuda(emu):
    dev = emu.allocate(1 << 20, "device", 1)
    assert platform.classify(dev + 100) == "cuda:1"
    assert emu.classify(dev) == "cuda:1"
    host = np.full(1 << 20, 7, dtype=np.uint8)
    assert emu.classify(host.ctypes.data) is None
    emu.copy(dev, host.ctypes.data, 1 << 20)
    back = np.zeros(1 << 20, dtype=np.uint8)
    emu.copy(back.ctypes.data, dev, 1 << 20)
    assert (back == 7).all()
    with pytest.raises(RuntimeError, match="DEVICE_NOT_FOUND"):
        emu.allocate(64, "device", 5)
    with pytest.raises(ValueError, match="no streams"):
        emu.copy(dev, host.ctypes.data, 64, 1, stream=1)
    emu.free(dev, 1 << 20, "device")
    assert platform.classify(dev) == "host"


def test_host_emulation_copies_not_waited_for_run_in_order(emu):
    size = 8 << 20
    dev = emu.allocate(size, "device", 0)
    first, second = np.full(size, 1, dtype=np.uint8), np.full(size, 2, dtype=np.uint8)
    emu.copy(dev, first.ctypes.data, size, wait=False)  # returns once queued
    emu.copy(dev, second.ctypes.data, size // 2, wait=False)
    back = np.zeros(size, dtype=np.uint8)
    emu.copy(back.ctypes.data, dev, size)  # runs after both: one worker, submission order
    assert (back[: size // 2] == 2).all() and (back[size // 2:] == 1).all()
    emu.free(dev, size, "device")


def test_host_emulation_ipc_into_a_child_process(emu):
    size, offset, length = 3 * 4096, 4096 + 9, 5000
    dev = emu.allocate(size, "shareable", 0)
    ctypes.memset(dev, 0xEE, size)
    handle = emu.export_ipc(dev + offset, length)
    code = (
        "import ctypes, sys\n"
        "from mooncake._native import platform\n"
        "platform.enable_host_emulation()\n"
        "p = platform.get('host_emulation')\n"
        "handle, pid, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
        "m = p.import_ipc(handle, pid, n)\n"
        "src = bytes((i * 3 + 1) % 256 for i in range(n))\n"
        "buf = ctypes.create_string_buffer(src, n)\n"
        "p.copy(m, ctypes.addressof(buf), n)\n"
        "print(platform.classify(m))\n"
        "p.close_ipc(m, n)\n"
        "try:\n"
        "    p.import_ipc('mc-host-emulation-ipc:v1:garbage', pid, n)\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code, handle, str(os.getpid()), str(length)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "cuda:0"
    assert lines[1].startswith("refused:") and "not a host-emulation IPC handle" in lines[1]
    expected = bytes((i * 3 + 1) % 256 for i in range(length))
    assert ctypes.string_at(dev + offset, length) == expected
    assert ctypes.string_at(dev + offset - 1, 1) == b"\xee"
    assert ctypes.string_at(dev + offset + length, 1) == b"\xee"
    with pytest.raises(ValueError, match="exported by process"):
        emu.import_ipc(handle, 1, length)
    emu.free(dev, size, "shareable")
