"""The nvlink_intra and device-memory part of the GPU check (issue 14): a module of the one GPU check,
tools/gpu_check/gpu_check.py (`bazel run //tools/gpu_check`, or `python3 tools/gpu_check/gpu_check.py` on a GPU
machine without Bazel), which runs these checks with the others, each under a time limit. It still runs alone:
  python3 transfer_engine/transport/nvlink_intra/gpu_check.py [--out DIR] [--mib 256]
Without a usable cuda platform it exits 2 and says why.

Needs, for the GPU machine's Python (built HERE, where Bazel is, and carried there; no Bazel needed there):
  ci/build_native.sh /path/to/python3     # python/mooncake/_native<suffix> + python/mooncake/_plugins/ (cuda
                                          # platform and nvlink_intra, from the same build: build ids)
Checks, one line each ("CHECK <name> PASS|FAIL|SKIP <detail>", "BW <name> <GB/s>"), then a JSON summary (also in
DIR/nvlink_intra_gpu_check.json):
  1. ipc_legacy: cuMemAlloc memory (platform kind "device") exported as a legacy CUDA IPC handle; a second process
     maps it, writes a pattern, this process verifies it;
  2. ipc_posix_fd: the same with shareable memory (cuMemCreate, POSIX-fd handle taken over with pidfd_getfd);
  3. dmabuf_export: cuMemGetHandleForAddressRange(DMA_BUF_FD) of cuMemAlloc memory (what rdma/efa would register);
  4. nvlink_intra: two engine processes, device -> device writes and reads through nvlink_intra (the plugin .so),
     bytes verified, carried by nvlink_intra (not tcp); its bandwidth against a plain device-to-device copy of the
     cuda platform (cuMemcpyAsync, i.e. cudaMemcpy D2D) measured in the same run, and the ratio;
  5. tcp_staging: the same pair with MC_FORCE_TCP=1: cudaMalloc buffers over tcp through pinned host staging, bytes
     verified, and its bandwidth against host memory over tcp in the same run.
The C++ conformance suite is not run here (its binaries need Bazel; tools/gpu_check runs it when they are built);
checks 4 and 5 are its data-integrity core on cudaMalloc buffers across two processes.
MC_GPU_CHECK_PLATFORM names the platform to use as the device (default "cuda"; tools/gpu_check --emulation sets
"host_emulation" with MC_PLATFORM_EMULATION=1, so every check's code runs on the host emulation: not a GPU).
Exit status: 0 when every check that ran passed, 1 otherwise, 2 when there is no usable GPU (with the reason).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The tree whose mooncake package and plugins are used: MC_GPU_CHECK_ROOT (tools/gpu_check sets its own, e.g. its
# Bazel runfiles, for this module and the peers it spawns), else the one holding this file.
ROOT = os.environ.get("MC_GPU_CHECK_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
NVLINK_PLUGIN = "libmc_transport_nvlink_intra.so"
PLUGINS = ("libmc_platform_cuda.so", NVLINK_PLUGIN)
PLATFORM = os.environ.get("MC_GPU_CHECK_PLATFORM", "cuda")  # the platform used as the device


def _setup_paths(names: tuple[str, ...] | None = None) -> str:
    """Puts the source tree's mooncake package on sys.path and the folders holding the plugins `names` (default:
    both, or only nvlink_intra when the device is not the cuda platform) in MC_PLUGIN_DIR (and the path in
    PYTHONPATH, for child processes); a reason string naming what is missing, else ""."""
    if names is None:
        names = PLUGINS if PLATFORM == "cuda" else (NVLINK_PLUGIN,)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    folders = [d for d in os.environ.get("MC_PLUGIN_DIR", "").split(":") if d]
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY", "")  # set by `bazel run`
    folders += [os.path.join(ROOT, "python", "mooncake", "_plugins"), HERE,
                os.path.join(ROOT, "bazel-bin", "transfer_engine", "platform", "cuda"),
                os.path.join(ROOT, "transfer_engine", "platform", "cuda"),  # a Bazel runfiles tree
                os.path.join(ROOT, "bazel-bin", "transfer_engine", "transport", "nvlink_intra")]
    if workspace:
        folders += [os.path.join(workspace, "bazel-bin", "transfer_engine", "transport", "nvlink_intra")]
    found = {}
    for name in names:
        for d in folders:
            if os.path.isfile(os.path.join(d, name)):
                found[name] = d
                break
    given = [d for d in os.environ.get("MC_PLUGIN_DIR", "").split(":") if d]
    os.environ["MC_PLUGIN_DIR"] = ":".join(dict.fromkeys(given + list(found.values())))
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in sys.path if p))
    missing = [n for n in names if n not in found]
    if missing:
        return f"missing {', '.join(missing)} (looked in {', '.join(folders)}; see this file's docstring)"
    return ""


def pattern(n: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _cuda():
    from mooncake._native import platform

    return platform.get(PLATFORM)


def _host_of(cuda, ptr: int, n: int):
    import numpy as np

    out = np.empty(n, dtype=np.uint8)
    cuda.copy(out.ctypes.data, ptr, n)
    return out


def _spawn(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def _ask(proc: subprocess.Popen, req: dict, timeout: float = 120) -> dict:
    proc.stdin.write(json.dumps(req) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"child exited with {proc.wait(timeout=timeout)}")
    return json.loads(line)


# ---- child roles ----

def role_ipc_writer() -> None:
    """Maps each handle it is given, writes pattern(n, seed) into it, unmaps."""
    cuda = _cuda()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            mapped = cuda.import_ipc(req["handle"], req["pid"], req["n"])
            data = pattern(req["n"], req["seed"])
            cuda.copy(mapped, data.ctypes.data, req["n"])
            cuda.close_ipc(mapped, req["n"])
            print(json.dumps({"ok": True}), flush=True)
        except Exception as e:  # reported to the parent, which prints the check line
            print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)


def role_target(size: int) -> None:
    """An engine with one cudaMalloc buffer and one host buffer; answers fill / digest / exit."""
    import numpy as np
    from mooncake.engine import TransferEngine

    cuda = _cuda()
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    dev = cuda.allocate(size, "device", 0)
    host = np.zeros(size, dtype=np.uint8)
    assert engine.register_memory(dev, size) == 0 and engine.register_memory(host.ctypes.data, size) == 0
    print(json.dumps({"segment": engine.get_local_segment_name(), "device": dev, "host": host.ctypes.data}),
          flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "digest":
            data = _host_of(cuda, dev, req["n"])
            print(json.dumps({"sha256": hashlib.sha256(data).hexdigest()}), flush=True)
        elif req["cmd"] == "fill":
            data = pattern(req["n"], req["seed"])
            cuda.copy(dev, data.ctypes.data, req["n"])
            print("{}", flush=True)
        else:
            break
    engine.close()


def role_initiator(transport: str, mib: int) -> None:
    """Device -> device writes and reads into a target child, verified; bandwidth against the baseline; one JSON
    line with the results."""
    import numpy as np
    from mooncake.engine import TransferEngine

    size = mib << 20
    cuda = _cuda()
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    dev = cuda.allocate(size, "device", 0)
    dev2 = cuda.allocate(size, "device", 0)
    host = np.zeros(size, dtype=np.uint8)
    assert engine.register_memory(dev, size) == 0 and engine.register_memory(host.ctypes.data, size) == 0
    target = _spawn("target", str(size))
    out = {"transport": transport}
    try:
        info = json.loads(target.stdout.readline())
        seg = info["segment"]
        data = pattern(size, 1)
        cuda.copy(dev, data.ctypes.data, size)
        out["write_rc"] = engine.transfer_sync_write(seg, dev, info["device"], size)
        out["write_ok"] = _ask(target, {"cmd": "digest", "n": size})["sha256"] == hashlib.sha256(data).hexdigest()
        _ask(target, {"cmd": "fill", "n": size, "seed": 2})
        out["read_rc"] = engine.transfer_sync_read(seg, dev, info["device"], size)
        out["read_ok"] = bool((_host_of(cuda, dev, size) == pattern(size, 2)).all())

        def rate(fn, src, dst, reps=5):
            fn(src, dst)  # warm-up
            t0 = time.perf_counter()
            for _ in range(reps):
                fn(src, dst)
            return reps * size / (time.perf_counter() - t0) / 1e9

        te = rate(lambda s, d: engine.transfer_sync_write(seg, s, d, size), dev, info["device"])
        if transport == "nvlink_intra":
            base = rate(lambda s, d: cuda.copy(d, s, size), dev, dev2)  # cudaMemcpy D2D, same GPU, same run
            out["baseline"] = f"{PLATFORM} platform device-to-device copy"
        else:
            base = rate(lambda s, d: engine.transfer_sync_write(seg, s, d, size), host.ctypes.data, info["host"])
            out["baseline"] = "host memory over tcp"
        out.update(te_gbps=te, baseline_gbps=base, ratio=te / base)
        stats = json.loads(engine.get_stats())
        out["carried"] = {t: sum(p.get("bytes", 0) for p in stats.get(t, {}).values() if isinstance(p, dict))
                          for t in ("nvlink_intra", "tcp", "shm")}
        out["staging"] = stats.get("listeners", {}).get("tcp", {}).get("staging")
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        try:
            _ask(target, {"cmd": "exit"}, 5)
        except Exception:
            target.kill()
        engine.close()
    print(json.dumps(out), flush=True)


# ---- checks (in the main process) ----

def check_ipc(kind: str) -> tuple[str, str]:
    cuda = _cuda()
    n = 64 << 20
    ptr = cuda.allocate(n, kind, 0)
    writer = _spawn("ipc_writer")
    try:
        handle = cuda.export_ipc(ptr, n)
        r = _ask(writer, {"handle": handle, "pid": os.getpid(), "n": n, "seed": 5})
        if not r["ok"]:
            return "FAIL", r["error"]
        ok = bool((_host_of(cuda, ptr, n) == pattern(n, 5)).all())
        return ("PASS" if ok else "FAIL"), f"{n >> 20} MiB written by process {writer.pid} through a {kind} handle"
    finally:
        writer.stdin.close()
        writer.wait(30)
        cuda.free(ptr, n, kind)


def check_dmabuf() -> tuple[str, str]:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return "SKIP", f"libcuda.so.1 does not load ({e}): dma-buf export needs the CUDA driver"
    cuda = _cuda()
    n = 2 << 20
    ptr = cuda.allocate(n, "device", 0)
    try:
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        for call in (lib.cuInit(0), lib.cuDeviceGet(ctypes.byref(dev), 0),
                     lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), lib.cuCtxSetCurrent(ctx)):
            if call != 0:
                return "FAIL", f"driver setup returned CUresult {call}"
        attr = ctypes.c_int()
        CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
        lib.cuDeviceGetAttribute(ctypes.byref(attr), CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev)
        fd = ctypes.c_int(-1)
        fn = lib.cuMemGetHandleForAddressRange
        fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int,
                       ctypes.c_ulonglong]
        rc = fn(ctypes.byref(fd), ptr, n, 1, 0)  # CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
        if rc != 0:
            return "FAIL", f"cuMemGetHandleForAddressRange returned CUresult {rc} (DMA_BUF_SUPPORTED={attr.value})"
        target = os.readlink(f"/proc/self/fd/{fd.value}")
        os.close(fd.value)
        return "PASS", f"dma-buf fd of {n >> 20} MiB cuMemAlloc memory ({target}; DMA_BUF_SUPPORTED={attr.value})"
    finally:
        cuda.free(ptr, n, "device")


def check_pair(transport: str, mib: int, timeout: float = 240) -> tuple[str, str, dict]:
    if transport == "nvlink_intra":
        missing = _setup_paths((NVLINK_PLUGIN,))
        if missing:
            return "SKIP", f"the nvlink_intra plugin is not here: {missing}", {}
    env = {"MC_FORCE_TCP": "1"} if transport == "tcp" else {}
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "initiator", transport, str(mib)],
                       capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return "FAIL", f"exit {p.returncode}: {p.stderr[-400:]}", {}
    r = json.loads(lines[-1])
    if "error" in r:
        return "FAIL", r["error"], r
    carried_ok = r["carried"][transport] >= 2 * (mib << 20) and (transport == "tcp" or r["carried"]["tcp"] == 0)
    ok = r["write_rc"] == 0 and r["read_rc"] == 0 and r["write_ok"] and r["read_ok"] and carried_ok
    detail = (f"write rc {r['write_rc']} intact {r['write_ok']}, read rc {r['read_rc']} intact {r['read_ok']}, "
              f"carried {r['carried']}; {r['te_gbps']:.2f} GB/s vs {r['baseline']} {r['baseline_gbps']:.2f} GB/s "
              f"= {r['ratio']:.2f}x")
    return ("PASS" if ok else "FAIL"), detail, r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    ap.add_argument("--mib", type=int, default=256, help="bytes per transfer in checks 4 and 5 (MiB)")
    args = ap.parse_args()
    missing = _setup_paths()
    if missing:
        print(f"SKIP: {missing}")
        return 2
    try:
        from mooncake._native import platform
    except ImportError as e:
        print(f"SKIP: the Transfer Engine extension does not import in this Python ({e}); see the docstring")
        return 2
    probe = {p["name"]: p for p in platform.platforms()}.get(PLATFORM)
    if probe is None or not probe["usable"]:
        print(f"SKIP: no usable GPU: {probe['reason'] if probe else 'no cuda platform plugin loaded'}")
        return 2
    print(f"cuda platform: {probe['reason']} ({probe['device_count']} device(s))")
    summary, failed = {}, False
    checks = [("ipc_legacy", lambda: check_ipc("device")), ("ipc_posix_fd", lambda: check_ipc("shareable")),
              ("dmabuf_export", check_dmabuf)]
    for name, fn in checks:
        try:
            state, detail = fn()
        except Exception as e:
            state, detail = "FAIL", f"{type(e).__name__}: {e}"
        print(f"CHECK {name} {state} {detail}", flush=True)
        summary[name] = {"state": state, "detail": detail}
        failed |= state == "FAIL"
    for transport in ("nvlink_intra", "tcp"):
        name = "nvlink_intra" if transport == "nvlink_intra" else "tcp_staging"
        try:
            state, detail, r = check_pair(transport, args.mib)
        except Exception as e:
            state, detail, r = "FAIL", f"{type(e).__name__}: {e}", {}
        print(f"CHECK {name} {state} {detail}", flush=True)
        if "te_gbps" in r:
            print(f"BW {name} {r['te_gbps']:.2f}\nBW {name}_baseline {r['baseline_gbps']:.2f}", flush=True)
        summary[name] = {"state": state, "detail": detail, **r}
        failed |= state == "FAIL"
    print(json.dumps(summary))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "nvlink_intra_gpu_check.json"), "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("ipc_writer", "target", "initiator"):
        _setup_paths()
        role = sys.argv[1]
        if role == "ipc_writer":
            role_ipc_writer()
        elif role == "target":
            role_target(int(sys.argv[2]))
        else:
            role_initiator(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
