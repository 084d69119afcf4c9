"""The GPU check (issue 14): one script that runs every device check on a machine with an NVIDIA GPU, each in a
child process under its own time limit (the whole run under 10 minutes), and prints one line per check
("CHECK <name> PASS|FAIL|SKIP <detail>"), bandwidth lines ("BW <name> <GB/s>") and a JSON summary (the last line;
also DIR/gpu_check.json with --out DIR).

Run: `bazel run //tools/gpu_check` (a machine with Bazel), or, on a GPU machine without Bazel, from the repository
root: `python3 tools/gpu_check/gpu_check.py [--out DIR]` after carrying the natives built HERE with
`ci/build_native.sh /path/to/the/gpu/machines/python3` (python/mooncake/_native<suffix> and python/mooncake/_plugins/:
the cuda platform and nvlink_intra plugins, from the same build). The GPU machine's Python needs numpy, and torch
with CUDA for the store and EP checks (the user's torch is used; a CPU-only torch makes those checks SKIP, saying so).

Checks (the first five and their code are transfer_engine/transport/nvlink_intra/gpu_check.py's, the EP ones
ep/cuda/gpu_check.py's: both are modules of this script and still run alone):
  ipc_legacy, ipc_posix_fd   two-process IPC: legacy CUDA IPC handle of cuMemAlloc memory; POSIX-fd VMM handle
  fabric_export              cuMemCreate(CU_MEM_HANDLE_TYPE_FABRIC) + cuMemExportToShareableHandle through libcuda
                             (ctypes): SKIP, with the driver's reason, where there is no NVSwitch / IMEX channel
  dmabuf_export              cuMemGetHandleForAddressRange(DMA_BUF_FD) of cuMemAlloc memory
  nvlink_intra               two engines, device -> device through nvlink_intra, bytes verified; BW against the
                             cuda platform's device-to-device copy (cudaMemcpy D2D) in the same run
  tcp_staging                the same pair over tcp (pinned host staging), BW against host memory over tcp
  conformance                the C++ conformance suite (tcp_conformance_test: its device-memory case on the cuda
                             platform, host memory across two processes); it needs its Bazel binaries
                             (ci/build_native.sh installs them in python/mooncake/_plugins/conformance/; or
                             `bazel build //transfer_engine/transport/tcp:tcp_conformance_test`, or
                             MC_GPU_CHECK_CONFORMANCE=<binary>); without them it SKIPs and nvlink_intra and
                             tcp_staging (cudaMalloc buffers across two processes, bytes verified) stand in
  store_zero_copy            a master, a holder client (host segment) and a client of this process: register_buffer
                             of CUDA tensors' data_ptr(), put_from / get_into and batch_put_from / batch_get_into,
                             bytes verified against a CPU copy
  ep_kernels                 EP's pack / unpack / combine on the GPU bit for bit against the CPU formats
  ep_copies, ep_ipc          EP's copies on torch's streams; EP's CUDA IPC between two processes
  ep_timing                  each EP kernel's time and bandwidth against a device-to-device copy (BW lines)
  ep_end_to_end              2 processes run Buffer.dispatch/combine with CUDA tensors against the CPU reference
--emulation treats the host emulation (MC_PLATFORM_EMULATION=1: memfd "cuda" memory, real cross-process IPC; not
a GPU) as the device, so each check's code runs where it can without a GPU (CI); the checks that need the CUDA
driver or torch CUDA SKIP, saying so. Exit status: 0 when every check that ran passed (SKIPs allowed), 1 when one
failed, 2 when there is no usable GPU (the reason printed, every check SKIP).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NVLINK_DIR = os.path.join(ROOT, "transfer_engine", "transport", "nvlink_intra")
EP_DIR = os.path.join(ROOT, "ep", "cuda")
TOTAL_LIMIT_S = 570  # under 10 minutes, with room for the start and the summary
EMULATION = "host_emulation"

# name -> time limit (s); in this order.
LIMITS = {
    "ipc_legacy": 60, "ipc_posix_fd": 60, "fabric_export": 30, "dmabuf_export": 30, "nvlink_intra": 120,
    "tcp_staging": 120, "conformance": 120, "store_zero_copy": 90, "ep_kernels": 180, "ep_copies": 60,
    "ep_ipc": 60, "ep_timing": 60, "ep_end_to_end": 240,
}


def _nvlink():
    """transfer_engine/transport/nvlink_intra/gpu_check.py as a module (it spawns itself by path for its peers),
    using this tree (ROOT: MC_GPU_CHECK_ROOT) for the mooncake package and plugins. Where ROOT lacks the file (a partial
    copy of the tree) it is read from the source tree this file links to."""
    name = "nvlink_intra_gpu_check"
    if name not in sys.modules:
        path = os.path.join(NVLINK_DIR, "gpu_check.py")
        if not os.path.isfile(path):
            source_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
            path = os.path.join(source_root, "transfer_engine", "transport", "nvlink_intra", "gpu_check.py")
        os.environ["MC_GPU_CHECK_ROOT"] = ROOT
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _ep():
    """ep/cuda/gpu_check.py as the module `gpu_check` (its IPC check's spawned process imports it by that name, so
    its folder goes first on sys.path; only in the EP checks' child processes)."""
    if EP_DIR not in sys.path[:1]:
        sys.path.insert(0, EP_DIR)
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in sys.path if p))
    return importlib.import_module("gpu_check")


def _result(state: str, detail: str, **extra) -> dict:
    return {"state": state, "detail": detail, **extra}


# ---- checks (each runs in a child process; returns {"state", "detail", optional "bw": {name: GB/s}, "data"}) ----

def check_ipc(kind: str) -> dict:
    state, detail = _nvlink().check_ipc(kind)
    return _result(state, detail)


def _cu_error(lib, rc: int) -> str:
    name = ctypes.c_char_p()
    text = ctypes.c_char_p()
    lib.cuGetErrorName(rc, ctypes.byref(name))
    lib.cuGetErrorString(rc, ctypes.byref(text))
    return f"{(name.value or b'?').decode()} ({rc}): {(text.value or b'').decode()}"


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp (cuda.h, CUDA 12 and 13)
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


CU_MEM_HANDLE_TYPE_FABRIC = 0x8
CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128
# What a driver says when the fabric is not there (no NVSwitch / IMEX channel, or no permission to one).
_NO_FABRIC = {"CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_NOT_PERMITTED", "CUDA_ERROR_INVALID_VALUE",
              "CUDA_ERROR_INVALID_DEVICE"}


def check_fabric() -> dict:
    """cuMemCreate with the fabric handle type, then cuMemExportToShareableHandle (a 64-byte CUmemFabricHandle).
    Without NVSwitch / IMEX the driver refuses: SKIP, with its reason and the device's attribute."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return _result("SKIP", f"libcuda.so.1 does not load ({e}): fabric handles need the CUDA driver")
    for fn in (lib.cuMemExportToShareableHandle, lib.cuMemCreate, lib.cuMemRelease):
        fn.restype = ctypes.c_int
    lib.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.POINTER(_AllocationProp),
                                ctypes.c_ulonglong]
    lib.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_ulonglong]
    lib.cuMemRelease.argtypes = [ctypes.c_uint64]
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for what, rc in (("cuInit", lib.cuInit(0)), ("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), 0)),
                     ("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
                     ("cuCtxSetCurrent", lib.cuCtxSetCurrent(ctx))):
        if rc != 0:
            return _result("FAIL", f"driver setup: {what} returned {_cu_error(lib, rc)}")
    supported = ctypes.c_int(-1)
    lib.cuDeviceGetAttribute(ctypes.byref(supported), CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev)
    prop = _AllocationProp(type=1, requestedHandleTypes=CU_MEM_HANDLE_TYPE_FABRIC,  # CU_MEM_ALLOCATION_TYPE_PINNED
                           location=_Location(type=1, id=dev.value))  # CU_MEM_LOCATION_TYPE_DEVICE
    granularity = ctypes.c_size_t(0)
    rc = lib.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 0)
    size = granularity.value if rc == 0 and granularity.value else 2 << 20
    handle = ctypes.c_uint64(0)
    attr = f"HANDLE_TYPE_FABRIC_SUPPORTED={supported.value}"
    rc = lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0)
    if rc != 0:
        why = _cu_error(lib, rc)
        state = "SKIP" if why.split(" ")[0] in _NO_FABRIC or supported.value == 0 else "FAIL"
        return _result(state, f"cuMemCreate(FABRIC, {size} bytes): {why}; {attr} (expected without NVSwitch/IMEX)")
    try:
        fabric = (ctypes.c_ubyte * 64)()
        rc = lib.cuMemExportToShareableHandle(ctypes.addressof(fabric), handle.value, CU_MEM_HANDLE_TYPE_FABRIC, 0)
        if rc != 0:
            why = _cu_error(lib, rc)
            state = "SKIP" if why.split(" ")[0] in _NO_FABRIC or supported.value == 0 else "FAIL"
            return _result(state, f"cuMemExportToShareableHandle(FABRIC): {why}; {attr} "
                                  "(expected without NVSwitch/IMEX)")
        nonzero = any(fabric)
        return _result("PASS" if nonzero else "FAIL",
                       f"exported a {size}-byte allocation as a fabric handle ({'non-zero' if nonzero else 'all zero'}"
                       f" 64 bytes); {attr}")
    finally:
        lib.cuMemRelease(handle.value)


def check_dmabuf() -> dict:
    state, detail = _nvlink().check_dmabuf()
    return _result(state, detail)


def check_pair(transport: str, mib: int, limit: float) -> dict:
    name = "nvlink_intra" if transport == "nvlink_intra" else "tcp_staging"
    nv = _nvlink()
    if transport == "nvlink_intra" and not nv._setup_paths((nv.NVLINK_PLUGIN,)):
        from mooncake import _native

        states = [p for p in _native.plugin_states() if p["name"] == "nvlink_intra" and p["kind"] == "transport"]
        if not states or states[0]["state"] != "loaded":  # else the pair would quietly go over tcp
            why = f"{states[0]['origin']} is {states[0]['state']}: {states[0]['reason']}" if states else "not listed"
            return _result("FAIL", f"the nvlink_intra plugin does not load: {why}")
    state, detail, r = nv.check_pair(transport, mib, timeout=max(10.0, limit - 5))
    bw = {}
    if "te_gbps" in r:
        bw = {name: r["te_gbps"], f"{name}_baseline": r["baseline_gbps"]}
    return _result(state, detail, bw=bw, data=r)


# Where ci/build_native.sh installs tcp_conformance_test and conformance_peer (statically linked, so they run
# outside Bazel's tree), relative to ROOT; the plugins beside them (the cuda platform) are one level up.
INSTALLED_CONFORMANCE = os.path.join("python", "mooncake", "_plugins", "conformance")


def _conformance_binary() -> tuple[str, str]:
    """(tcp_conformance_test, conformance_peer) as MC_GPU_CHECK_CONFORMANCE names it, ci/build_native.sh
    installed them, or Bazel built them; or ("", where it looked). The peer is beside the binary or where Bazel
    puts it."""
    given = os.environ.get("MC_GPU_CHECK_CONFORMANCE", "")
    bins = [os.path.join(ROOT, "bazel-bin")]
    if os.environ.get("BUILD_WORKSPACE_DIRECTORY"):
        bins.insert(0, os.path.join(os.environ["BUILD_WORKSPACE_DIRECTORY"], "bazel-bin"))
    candidates = ([given] if given else []) + [os.path.join(ROOT, INSTALLED_CONFORMANCE, "tcp_conformance_test")]
    candidates += [os.path.join(b, "transfer_engine", "transport", "tcp", "tcp_conformance_test") for b in bins]
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            peer = os.path.join(os.path.dirname(c), "conformance_peer")
            if not os.path.isfile(peer):
                peer = os.path.join(os.path.dirname(os.path.dirname(c)), "conformance", "conformance_peer")
            runfiles = c + ".runfiles"
            if not os.path.isfile(peer) and os.path.isdir(runfiles):
                peer = os.path.join(runfiles, "_main", "transfer_engine", "transport", "conformance",
                                    "conformance_peer")
            return c, peer if os.path.isfile(peer) else ""
    return "", ", ".join(candidates)


def check_conformance(emulation: bool, limit: float) -> dict:
    binary, peer = _conformance_binary()
    if not binary:
        return _result("SKIP", "the C++ conformance suite needs its Bazel binaries (bazel build "
                               "//transfer_engine/transport/tcp:tcp_conformance_test, or MC_GPU_CHECK_CONFORMANCE; "
                               f"looked for {peer}); nvlink_intra and tcp_staging stand in (cudaMalloc buffers "
                               "across two processes, bytes verified)")
    env = dict(os.environ)
    env.pop("MC_PLATFORM_EMULATION", None)
    if emulation:
        env["MC_PLATFORM_EMULATION"] = "1"
    if peer:
        env["MC_CONFORMANCE_PEER"] = peer
    plugins = os.path.join(ROOT, "python", "mooncake", "_plugins")
    if not emulation and "MC_PLUGIN_DIR" not in env and os.path.isdir(plugins):
        env["MC_PLUGIN_DIR"] = plugins  # the cuda platform plugin ci/build_native.sh installed
    try:
        p = subprocess.run([binary, "--gtest_brief=0"], capture_output=True, text=True, timeout=max(10, limit - 5),
                           env=env)
    except subprocess.TimeoutExpired:
        return _result("FAIL", f"{binary} ran past {limit - 5:.0f} s")
    out = p.stdout + p.stderr

    def count(tag: str) -> int:  # gtest's summary: "[  PASSED  ] 17 tests." / "[  SKIPPED ] 11 tests, listed below:"
        m = re.search(r"^\[  " + tag + r" *\] (\d+) tests?[,.]", out, re.M)
        return int(m.group(1)) if m else 0

    passed, skipped = count("PASSED"), count("SKIPPED")
    failed = sorted(set(re.findall(r"^\[  FAILED  \] (\w+/?\w*\.\S+)", out, re.M)))
    device = [line for line in out.splitlines() if "DeviceMemoryArrivesIntact" in line and line.startswith("[")]
    device_ok = any(line.startswith("[       OK ]") for line in device)
    detail = (f"{binary}: exit {p.returncode}, {passed} passed, {skipped} skipped, failed {failed or 'none'}; "
              f"device-memory case {'passed' if device_ok else 'did not pass: ' + (device[-1] if device else '?')}")
    if p.returncode != 0 or failed:
        return _result("FAIL", detail, data={"tail": out[-3000:]})
    return _result("PASS" if device_ok else "SKIP", detail)


def _device_buffers(emulation: bool, size: int):
    """(ptr, write(offset, numpy uint8), read(offset, n) -> numpy, release, what): a CUDA tensor of `size` bytes,
    or on the emulation a host_emulation "device" allocation; (None, reason) when there is neither."""
    import numpy as np

    if emulation:
        from mooncake._native import platform

        emu = platform.get(EMULATION)
        ptr = emu.allocate(size, "device", 0)

        def read(off, n):
            out = np.empty(n, dtype=np.uint8)
            emu.copy(out.ctypes.data, ptr + off, n)
            return out

        return (ptr, lambda off, a: emu.copy(ptr + off, a.ctypes.data, a.size), read,
                lambda: emu.free(ptr, size, "device"), f"host_emulation device memory ({platform.classify(ptr)})")
    try:
        import torch
    except ImportError as e:
        return None, f"torch does not import ({e})"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} has no CUDA (CUDA tensors are what this check stores)"
    t = torch.zeros(size, dtype=torch.uint8, device="cuda")

    def write(off, a):
        t[off:off + a.size].copy_(torch.from_numpy(a))
        torch.cuda.synchronize()

    return (t.data_ptr(), write, lambda off, n: t[off:off + n].cpu().numpy(), lambda: None,
            f"a CUDA tensor on {torch.cuda.get_device_name(0)}")


def check_store(emulation: bool, mib: int) -> dict:
    import numpy as np

    try:
        from mooncake.store.client.testing import StoreWorker, local_store
        from mooncake.store.master.testing import MasterProcess
    except ImportError as e:
        return _result("SKIP", f"the store does not import in this Python ({e})")
    size = max(4, mib) << 20
    got = _device_buffers(emulation, size)
    if got[0] is None:
        return _result("SKIP", got[1])
    ptr, write, read, release, what = got
    rng = np.random.default_rng(11)
    master = holder = None
    try:
        master = MasterProcess("--default_kv_lease_ttl=300")
        holder = StoreWorker(master.address, segment=f"{4 * size >> 20}MB", buffer="16MB")  # where objects land
        with local_store(master.address, segment="0") as s:
            if s.register_buffer(ptr, size) != 0:
                return _result("FAIL", f"register_buffer of {what} failed")
            half, n = size // 2, size // 2 - 4093  # an odd length
            data = rng.integers(0, 256, n, dtype=np.uint8)
            write(0, data)
            write(half, np.zeros(n, dtype=np.uint8))
            checks = {"put_from": s.put_from("gpucheck/one", ptr, n) == 0}
            checks["get_into"] = s.get_into("gpucheck/one", ptr + half, n) == n
            checks["single_bytes"] = bool((read(half, n) == data).all())
            k, block = 8, half // 8
            batch = rng.integers(0, 256, k * block, dtype=np.uint8)
            write(0, batch)
            write(half, np.zeros(k * block, dtype=np.uint8))
            keys = [f"gpucheck/batch{i}" for i in range(k)]
            checks["batch_put_from"] = s.batch_put_from(keys, [ptr + i * block for i in range(k)], [block] * k) \
                == [0] * k
            checks["batch_get_into"] = s.batch_get_into(keys, [ptr + half + i * block for i in range(k)],
                                                        [block] * k) == [block] * k
            checks["batch_bytes"] = bool((read(half, k * block) == batch).all())
            checks["unregister_buffer"] = s.unregister_buffer(ptr) == 0
        ok = all(checks.values())
        bad = [c for c, v in checks.items() if not v]
        return _result("PASS" if ok else "FAIL", f"{what}: put_from/get_into of {n} bytes and batch forms of {k} x "
                       f"{block} bytes through another client's segment, bytes verified against a CPU copy"
                       + ("" if ok else f"; failed: {bad}"), data=checks)
    finally:
        if holder is not None:
            holder.stop()
        if master is not None:
            master.stop()
        release()


def _ep_outcome(result: dict) -> str:
    if "skipped" in result:
        return "SKIP"
    passed = "error" not in result and all(v is not False for v in result.values()) and \
        result.get("passed", True) is not False
    return "PASS" if passed else "FAIL"


def check_ep(which: str, emulation: bool) -> dict:
    try:
        import torch  # noqa: F401  (ep/cuda/gpu_check.py needs it at import)
    except ImportError as e:
        return _result("SKIP", f"torch does not import in this Python ({e}): EP's checks need torch with CUDA")
    ep = _ep()
    if emulation:
        if which != "ep_kernels":
            return _result("SKIP", "needs torch CUDA (streams, events, CUDA tensors); not on the host emulation")
        from mooncake.ep.cuda.emulation import HostEmulatedDevice

        r = ep.check_kernels(HostEmulatedDevice())  # the emulation against itself and the CPU quantizer
        return _result(_ep_outcome(r), "host emulation (not a GPU): " + json.dumps(r), data=r)
    build = ep.build()
    ep.find_cuda_plugin()
    reason = ep.devmod.unavailable_reason()
    if reason:
        return _result("SKIP", f"no usable GPU for EP: {reason}")
    if which == "ep_end_to_end":
        r = ep.end_to_end()
        return _result(_ep_outcome(r), r.get("skipped") or r.get("output", "")[-300:].replace("\n", " | "), data=r)
    import torch

    gpu = ep.devmod.CudaDevice(torch.device("cuda:0"))
    fn = {"ep_kernels": ep.check_kernels, "ep_copies": ep.check_copies, "ep_ipc": ep.check_ipc,
          "ep_timing": ep.time_kernels}[which]
    r = fn(gpu)
    if which == "ep_timing":
        bw = {f"ep_{k}": v["GB/s"] for k, v in r.items()}
        detail = ", ".join(f"{k} {v['us']} us {v['GB/s']} GB/s ({v['vs_d2d_copy']}x copy)" for k, v in r.items())
        return _result("PASS", detail, bw=bw, data=r)
    return _result(_ep_outcome(r), f"{torch.cuda.get_device_name(0)}; {build}: " + json.dumps(r), data=r)


def run_one(name: str, emulation: bool, mib: int, limit: float) -> dict:
    if name in ("ipc_legacy", "ipc_posix_fd"):
        return check_ipc("device" if name == "ipc_legacy" else "shareable")
    if name == "fabric_export":
        return check_fabric()
    if name == "dmabuf_export":
        return check_dmabuf()
    if name in ("nvlink_intra", "tcp_staging"):
        return check_pair("nvlink_intra" if name == "nvlink_intra" else "tcp", mib, limit)
    if name == "conformance":
        return check_conformance(emulation, limit)
    if name == "store_zero_copy":
        return check_store(emulation, mib)
    return check_ep(name, emulation)


# ---- the parent: preflight, one child per check, lines, summary ----

def preflight(emulation: bool) -> tuple[str, str]:
    """("", what the device is) when the checks can run; (reason, "") when there is no usable GPU. Sets up the
    environment the children inherit (MC_PLUGIN_DIR, PYTHONPATH, the platform to use)."""
    if emulation:
        os.environ["MC_PLATFORM_EMULATION"] = "1"
        os.environ["MC_GPU_CHECK_PLATFORM"] = EMULATION
    else:
        os.environ.pop("MC_PLATFORM_EMULATION", None)  # the emulation would claim cuda memory too
        os.environ["MC_GPU_CHECK_PLATFORM"] = "cuda"
    nv = _nvlink()
    missing = "" if emulation else nv._setup_paths(("libmc_platform_cuda.so",))
    nv._setup_paths((nv.NVLINK_PLUGIN,))  # optional: the nvlink_intra check SKIPs, naming it, without it
    if missing:
        return f"the cuda platform plugin is not here: {missing}", ""
    try:
        from mooncake._native import platform
    except ImportError as e:
        return (f"the Transfer Engine extension does not import in Python {sys.version.split()[0]} ({e}): build it "
                "for this Python with ci/build_native.sh and carry it here"), ""
    name = nv.PLATFORM
    probe = {p["name"]: p for p in platform.platforms()}.get(name)
    if probe is None or not probe["usable"]:
        return f"no usable GPU: {probe['reason'] if probe else f'no {name} platform loaded'}", ""
    return "", f"{name} platform: {probe['reason']} ({probe['device_count']} device(s))"


def run_child(name: str, args, limit: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--mib", str(args.mib)]
    if args.emulation:
        cmd.append("--emulation")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: a timeout kills its peers too
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return _result("FAIL", f"timed out after {limit:.0f} s (its time limit)", seconds=round(limit, 1),
                       output=out[-2000:])
    seconds = round(time.monotonic() - t0, 1)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return _result("FAIL", f"the check's process exited {proc.returncode} without a result: {out[-600:]}",
                       seconds=seconds)
    r = json.loads(lines[-1][len("RESULT "):])
    r["seconds"] = seconds
    return r


def child_main(name: str, emulation: bool, mib: int) -> int:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        r = run_one(name, emulation, mib, LIMITS[name])
    except Exception as e:  # reported as the check's FAIL; the other checks still run
        import traceback

        r = _result("FAIL", f"{type(e).__name__}: {e}", data={"traceback": traceback.format_exc()[-3000:]})
    print("RESULT " + json.dumps(r, default=str), flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for gpu_check.json")
    ap.add_argument("--mib", type=int, default=256, help="MiB per transfer in nvlink_intra and tcp_staging "
                                                         "(the store check uses at most 32)")
    ap.add_argument("--only", default="", help="comma-separated checks to run (default: all)")
    ap.add_argument("--emulation", action="store_true", help="the host emulation as the device (not a GPU)")
    ap.add_argument("--total-limit", type=float, default=TOTAL_LIMIT_S, help="seconds for all checks together")
    ap.add_argument("--limit", action="append", default=[], metavar="CHECK=SECONDS",
                    help="another time limit for one check (repeatable)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args.child, args.emulation, args.mib if args.child != "store_zero_copy"
                          else min(args.mib, 32))
    names = [n for n in args.only.split(",") if n] or list(LIMITS)
    unknown = [n for n in names if n not in LIMITS]
    if unknown:
        ap.error(f"unknown checks {unknown}; known: {', '.join(LIMITS)}")
    limits = dict(LIMITS)
    for item in args.limit:
        check, _, seconds = item.partition("=")
        if check not in LIMITS:
            ap.error(f"--limit {item}: no check {check!r}")
        limits[check] = float(seconds)
    t0 = time.monotonic()
    reason, device = preflight(args.emulation)
    summary = {"mode": "emulation" if args.emulation else "gpu", "device": device, "reason": reason, "checks": {}}
    if reason:
        print(f"SKIP: {reason}", flush=True)
        for n in names:
            summary["checks"][n] = _result("SKIP", "no usable GPU")
            print(f"CHECK {n} SKIP no usable GPU", flush=True)
        code = 2
    else:
        print(f"GPU-CHECK {summary['mode']}: {device}", flush=True)
        for n in names:
            left = args.total_limit - (time.monotonic() - t0)
            if left < 5:
                r = _result("FAIL", f"not run: the total limit of {args.total_limit:.0f} s was used up")
            else:
                r = run_child(n, args, min(limits[n], left))
            summary["checks"][n] = r
            print(f"CHECK {n} {r['state']} {r['detail']}", flush=True)
            for bw_name, gbps in r.get("bw", {}).items():
                print(f"BW {bw_name} {gbps:.2f}", flush=True)
        code = 1 if any(r["state"] == "FAIL" for r in summary["checks"].values()) else 0
    summary["exit"] = code
    summary["total_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(summary, default=str), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return code


if __name__ == "__main__":
    sys.exit(main())
