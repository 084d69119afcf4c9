"""The GPU check of mooncake.ep's CUDA path, for a machine with a GPU: builds, checks against the CPU path, times.

A module of the one GPU check, tools/gpu_check/gpu_check.py (`bazel run //tools/gpu_check`), which runs its
check_kernels, check_copies, check_ipc, time_kernels and end_to_end (as ep_kernels, ep_copies, ep_ipc, ep_timing,
ep_end_to_end, each in its own process under a time limit) with the transport and store checks; it imports this
file as the module `gpu_check` (its folder first on sys.path), so the IPC check's spawned process finds
_ipc_owner. It still runs alone, as below.

It needs the Transfer Engine extension for the GPU machine's Python, since device memory, CUDA IPC and copies
go through the platform layer's cuda platform (mooncake._native.platform): build both HERE, where Bazel is, and
carry them there (no Bazel needed there):
  ci/build_native.sh /path/to/python3.12    # writes python/mooncake/_native.cpython-312-*.so (git-ignored)
  bazel build //transfer_engine/platform/cuda:libmc_platform_cuda.so
then carry python/mooncake/_native.cpython-312-x86_64-linux-gnu.so and
bazel-bin/transfer_engine/platform/cuda/libmc_platform_cuda.so (and ep/cuda/libmooncake_ep_cuda.so, when built
here) and run from the repository root: `python3 ep/cuda/gpu_check.py [--out DIR]` (under Bazel,
`bazel run //ep/cuda:gpu_check`, which has both in its runfiles). The cuda platform plugin is looked for in
MC_PLUGIN_DIR, python/mooncake/_plugins/ (the wheel's layout), bazel-bin/transfer_engine/platform/cuda/ and the
runfiles' transfer_engine/platform/cuda/; MC_PLUGIN_DIR is set for the checks (and their child processes) to
the folder found. Steps:
  1. build: libmooncake_ep_cuda.so next to ep/cuda/device.py with nvcc, unless it is there already; the
     extension must import and the plugin be found (else exit status 1, saying which is missing);
  2. kernels: pack (bf16 and fp8 quantization), unpack and combine on the GPU equal the host emulation, which
     computes the CPU path's formats (fp8 data and scales bit for bit; combine to bf16 rounding);
  3. copies: CudaDevice.copy through the cuda platform runs on torch's current stream (the default stream and a
     side stream), after the work queued there before it (a sleep kernel and a fill), without waiting;
  4. CUDA IPC: a second process allocates device memory and hands over its IPC handle; this process maps it,
     copies into it device-to-device and the owner verifies the bytes;
  5. timing, DeepEP's low-latency shape (128 tokens, hidden 7168, top-8): each kernel's time and bandwidth
     against a device-to-device copy of the same bytes measured in the same run (the ratio is printed);
  6. end to end: 2 processes on this GPU run Buffer.dispatch/combine with CUDA tensors against the CPU
     reference (needs mooncake.pg and pytest in this Python; otherwise the step says why it was skipped).
Prints one line per check and a JSON summary (also written to DIR/gpu_check.json); exit status 0 when every
check that ran passed, 1 otherwise, 2 when there is no usable GPU (with the reason).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the source tree's mooncake package (joins ep/ as mooncake.ep)

import torch  # noqa: E402

from mooncake.ep import layout  # noqa: E402
from mooncake.ep.cuda import device as devmod  # noqa: E402
from mooncake.ep.cuda.emulation import HostEmulatedDevice  # noqa: E402

ARCH = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]"]


def _nvcc() -> str:
    home = os.environ.get("CUDA_HOME")
    for candidate in ([os.path.join(home, "bin", "nvcc")] if home else []) + ["/usr/local/cuda/bin/nvcc"]:
        if os.path.exists(candidate):
            return candidate
    return "nvcc"  # from PATH


def build() -> str:
    lib, src = os.path.join(HERE, devmod.LIBRARY), os.path.join(HERE, "ep_kernels.cu")
    if os.path.exists(lib) and (not os.path.exists(src) or os.path.getmtime(lib) >= os.path.getmtime(src)):
        return f"using {lib} (newer than its source, or built by Bazel)"
    cmd = [_nvcc(), "-shared", "-O3", "-std=c++17", "-Xcompiler", "-fPIC,-fvisibility=hidden", *ARCH,
           os.path.join(HERE, "ep_kernels.cu"), "-o", lib]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    return f"built {lib} in {time.monotonic() - t0:.1f} s"


PLUGIN = "libmc_platform_cuda.so"


def find_cuda_plugin() -> str:
    """Makes the cuda platform plugin findable by mooncake._native (MC_PLUGIN_DIR, set before the extension's
    first platform call) and says where it is; OSError naming what is missing."""
    try:
        from mooncake._native import platform  # noqa: F401  (python/mooncake/_native/ alone is only its sources)
    except ImportError as e:
        raise OSError(f"the Transfer Engine extension does not import in Python {sys.version.split()[0]} ({e}): "
                      f"build it with ci/build_native.sh (see this file's docstring) and carry it here") from e
    given = [d for d in os.environ.get("MC_PLUGIN_DIR", "").split(":") if d]
    candidates = given + [os.path.join(ROOT, "python", "mooncake", "_plugins"),
                          os.path.join(ROOT, "bazel-bin", "transfer_engine", "platform", "cuda"),
                          os.path.join(ROOT, "transfer_engine", "platform", "cuda")]
    for folder in candidates:
        path = os.path.join(folder, PLUGIN)
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            if folder not in given:
                os.environ["MC_PLUGIN_DIR"] = ":".join(given + [folder])
            return f"cuda platform plugin {path}"
    raise OSError(f"no {PLUGIN} in {', '.join(candidates)}: build it with `bazel build "
                  f"//transfer_engine/platform/cuda:{PLUGIN}` and carry bazel-bin/transfer_engine/platform/cuda/{PLUGIN}")


def check_kernels(gpu) -> dict:
    emu = HostEmulatedDevice()
    hidden, n, topk = 7168, 96, 8
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(200, hidden, generator=g) * torch.logspace(-2, 2, hidden)).to(torch.bfloat16)
    rows = torch.randperm(200, generator=g)[:n]
    row_bytes = 2 * hidden
    offsets = 64 + torch.arange(n, dtype=torch.int64) * 2 * row_bytes  # gaps between rows
    size = 64 + 2 * n * row_bytes
    dst = torch.randperm(n, generator=g)
    slots = torch.randint(-1, n, (n // topk * 2, topk), generator=g)
    slot_offsets = torch.where(slots >= 0, offsets[slots.clamp(min=0)], torch.tensor(-1)).reshape(-1)
    weights = torch.rand(slots.shape, generator=g)
    results = {}
    for fp8 in (False, True):
        outs = []
        for dev in (gpu, emu):
            d = dev.torch_device
            base = dev.malloc(size)
            dev.pack_rows(x.to(d), rows.to(d), offsets.to(d), hidden, base, fp8)
            data = torch.empty(n, hidden, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, device=d)
            scales = torch.empty(n, hidden // 128, dtype=torch.float32, device=d) if fp8 else None
            dev.unpack_rows(base, offsets.to(d), dst.to(d), hidden, data, scales, fp8)
            combined = torch.empty(slots.shape[0], hidden, dtype=torch.bfloat16, device=d)
            if not fp8:
                dev.combine_tokens(base, slot_offsets.to(d), weights.to(d), hidden, combined)
            dev.synchronize()
            outs.append((data.cpu(), scales.cpu() if fp8 else None, combined.cpu()))
            dev.free(base)
        (gd, gs, gc), (ed, es, ec) = outs
        name = "fp8" if fp8 else "bf16"
        results[f"pack_unpack_{name}"] = bool(torch.equal(gd.view(torch.uint8), ed.view(torch.uint8)))
        if fp8:
            results["fp8_scales"] = bool(torch.equal(gs, es))
            ref_data, ref_scales = layout.quantize_fp8(x[rows])
            back = torch.empty_like(ref_data)
            back[dst] = ref_data
            results["fp8_matches_cpu_quantize"] = bool(torch.equal(gd.view(torch.uint8), back.view(torch.uint8)))
        else:
            diff = (gc.float() - ec.float()).abs().max().item()
            results["combine_max_abs_diff"] = diff
            results["combine"] = diff <= 0.01 * max(1.0, ec.float().abs().max().item())
    return results


def check_copies(gpu) -> dict:
    """CudaDevice.copy is ordered on torch's current stream: queued behind a sleep kernel and a fill there, a
    device-to-device and a device-to-host copy see the filled bytes; on another stream they would not."""
    n = 64 << 20
    sleep = getattr(torch.cuda, "_sleep", None)  # torch's busy-wait kernel, in cycles
    results = {}
    for name, stream in (("default_stream", torch.cuda.default_stream()), ("side_stream", torch.cuda.Stream())):
        src = torch.zeros(n, dtype=torch.uint8, device="cuda")
        dst = torch.zeros_like(src)
        host = torch.zeros(n, dtype=torch.uint8).pin_memory()
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            if sleep is not None:
                sleep(100_000_000)  # about 50 ms of GPU time before the fill
            src.fill_(7)
            t0 = time.monotonic()
            gpu.copy(dst.data_ptr(), src.data_ptr(), n, devmod.D2D)
            gpu.copy(host.data_ptr(), dst.data_ptr(), n, devmod.D2H)
            results[f"{name}_copy_calls_ms"] = round((time.monotonic() - t0) * 1e3, 3)  # not waited for
        stream.synchronize()
        results[name] = bool((host == 7).all())
    results["sleep_kernel"] = "torch.cuda._sleep" if sleep is not None else "none: torch has no torch.cuda._sleep"
    return results


def _ipc_owner(conn) -> None:
    gpu = devmod.CudaDevice(torch.device("cuda:0"))
    base = gpu.malloc(1 << 20)
    conn.send(gpu.ipc_handle(base))
    conn.recv()  # the peer wrote
    got = gpu.as_tensor(base, 1 << 20).cpu()
    conn.send(bool(torch.equal(got, torch.arange(1 << 20, dtype=torch.int64).remainder(251).to(torch.uint8))))


def check_ipc(gpu) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_ipc_owner, args=(child,))
    proc.start()
    child.close()  # so a dead owner reads as EOF here, not as a silent wait

    def receive():
        if not parent.poll(60):
            raise TimeoutError("the IPC owner process did not answer within 60 s")
        return parent.recv()

    try:
        handle = receive()
        mapped = gpu.ipc_open(handle)
        src = torch.arange(1 << 20, dtype=torch.int64, device="cuda").remainder(251).to(torch.uint8)
        gpu.copy(mapped, src.data_ptr(), 1 << 20, devmod.D2D)
        gpu.synchronize()
        parent.send("written")
        ok = receive()
        gpu.ipc_close(mapped)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return {"ipc_write_visible_to_owner": ok}


def _time(fn, iters=50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # microseconds


def time_kernels(gpu) -> dict:
    tokens, hidden, topk = 128, 7168, 8
    n = tokens * topk
    x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
    rows = torch.arange(n, device="cuda") % tokens
    row_bytes = 2 * hidden
    offsets = torch.arange(n, dtype=torch.int64, device="cuda") * row_bytes
    base = gpu.malloc(n * row_bytes)
    dst = torch.arange(n, dtype=torch.int64, device="cuda")
    data = torch.empty(n, hidden, dtype=torch.bfloat16, device="cuda")
    data8 = torch.empty(n, hidden, dtype=torch.float8_e4m3fn, device="cuda")
    scales = torch.empty(n, hidden // 128, dtype=torch.float32, device="cuda")
    slot_offsets = offsets.view(tokens, topk).reshape(-1)
    weights = torch.rand(tokens, topk, device="cuda")
    out = torch.empty(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    payload = n * row_bytes
    copy_src = torch.empty(payload, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    times = {
        "d2d_copy": _time(lambda: copy_dst.copy_(copy_src)),
        "pack_bf16": _time(lambda: gpu.pack_rows(x, rows, offsets, hidden, base, False)),
        "pack_fp8": _time(lambda: gpu.pack_rows(x, rows, offsets, hidden, base, True)),
        "unpack_bf16": _time(lambda: gpu.unpack_rows(base, offsets, dst, hidden, data, None, False)),
        "unpack_fp8": _time(lambda: gpu.unpack_rows(base, offsets, dst, hidden, data8, scales, True)),
        "combine": _time(lambda: gpu.combine_tokens(base, slot_offsets, weights, hidden, out)),
    }
    gpu.free(base)
    moved = {"d2d_copy": payload, "pack_bf16": payload, "pack_fp8": payload // 2 + n * hidden // 32,
             "unpack_bf16": payload, "unpack_fp8": payload // 2 + n * hidden // 32, "combine": payload}
    report = {}
    copy_rate = 2 * payload / times["d2d_copy"] / 1e3  # GB/s, read + write
    for name, us in times.items():
        rate = (moved[name] + min(moved[name], payload)) / us / 1e3
        report[name] = {"us": round(us, 2), "GB/s": round(rate, 1), "vs_d2d_copy": round(rate / copy_rate, 3)}
    return report


def end_to_end() -> dict:
    try:
        import mooncake.engine  # noqa: F401
        import mooncake.pg  # noqa: F401
        import pytest  # noqa: F401
    except ImportError as e:
        return {"skipped": f"{e.name or e} does not import in this Python ({e}); the 2-process check needs "
                           f"mooncake.engine, mooncake.pg and pytest"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MC_EP_TEST_DEVICE": "cuda"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(ROOT, "ep", "buffer_test.py"),
           "-k", "match_the_reference"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the workers too: none may keep the GPU
        out, _ = proc.communicate()
        return {"passed": False, "output": "timed out after 300 s\n" + out[-4000:]}
    return {"passed": proc.returncode == 0, "output": out[-4000:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for gpu_check.json")
    args = parser.parse_args()
    summary = {}
    try:
        summary["build"] = build()
        summary["plugin"] = find_cuda_plugin()
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"build failed: {e}")
        return 1
    reason = devmod.unavailable_reason()
    if reason:
        print(f"no usable GPU: {reason}")
        if torch.cuda.is_available():
            print(f"torch sees {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}): the kernels were "
                  "probably built with a toolkit newer than this driver supports; rebuild them with a matching "
                  "nvcc (delete ep/cuda/libmooncake_ep_cuda.so, set CUDA_HOME)")
        return 2
    gpu = devmod.CudaDevice(torch.device("cuda:0"))
    summary["device"] = torch.cuda.get_device_name(0)
    ok = True
    for name, step in (("kernels", lambda: check_kernels(gpu)), ("copies", lambda: check_copies(gpu)),
                       ("ipc", lambda: check_ipc(gpu)), ("timing", lambda: time_kernels(gpu)),
                       ("end_to_end", end_to_end)):
        try:
            summary[name] = step()
        except Exception:  # a failed step is reported and the others still run
            summary[name] = {"error": traceback.format_exc()}
        result = summary[name]
        passed = "error" not in result and all(v is not False for v in result.values()) and \
            result.get("passed", True) is not False
        ok &= passed
        print(f"{name}: {'ok' if passed else 'FAILED'} {json.dumps(result)[:1500]}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
