"""tools/gpu_check/gpu_check.py here (no GPU): it exits 2 with the reason and a SKIP line for every check; with
--emulation (the host emulation as the device: not a GPU) each check's code runs in its own process and reports
what it can (PASS) or why it cannot without the CUDA driver / torch CUDA (SKIP, naming it); a check past its time
limit is killed and reported as FAIL."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gpu_check.py")
sys.path.insert(0, HERE)
import gpu_check  # noqa: E402  (this folder's script: its list of checks)


def run(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("MC_PLATFORM_EMULATION", "MC_PLUGIN_DIR", "OUT")}
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout, env=env)
    lines = p.stdout.splitlines()
    checks = {}
    for line in lines:
        if line.startswith("CHECK "):
            _, name, state, detail = (line.split(" ", 3) + [""])[:4]
            checks[name] = (state, detail)
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return p, checks, summary


def test_exits_2_saying_why_without_a_gpu():
    p, checks, summary = run()
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    reason = [line for line in p.stdout.splitlines() if line.startswith("SKIP: no usable GPU")]
    assert reason and "libcuda" in reason[0], p.stdout  # the cuda platform's probe: its driver does not load
    assert list(checks) == list(gpu_check.LIMITS), p.stdout
    assert all(state == "SKIP" for state, _ in checks.values()), checks
    assert summary["exit"] == 2 and "libcuda" in summary["reason"] and summary["mode"] == "gpu", summary
    assert set(summary["checks"]) == set(gpu_check.LIMITS)
    assert gpu_check.TOTAL_LIMIT_S < 600  # every check together, each also under its own limit


def test_emulation_reaches_every_check(tmp_path):
    p, checks, summary = run("--emulation", "--mib", "8", "--out", str(tmp_path))
    print("\n".join(line for line in p.stdout.splitlines() if not line.startswith("{")))  # in the test log
    assert p.returncode == 0, (p.returncode, p.stdout[-6000:], p.stderr[-3000:])
    assert list(checks) == list(gpu_check.LIMITS), p.stdout
    expect_pass = ["ipc_legacy", "ipc_posix_fd", "tcp_staging", "store_zero_copy", "ep_kernels"]
    for name in expect_pass:
        assert checks[name][0] == "PASS", (name, checks[name], summary["checks"][name])
    # Reached, and saying why they cannot go further without the driver or torch CUDA.
    assert checks["fabric_export"][0] == "SKIP" and "libcuda.so.1" in checks["fabric_export"][1]
    assert checks["dmabuf_export"][0] == "SKIP" and "libcuda.so.1" in checks["dmabuf_export"][1]
    assert checks["conformance"][0] == "SKIP" and "Bazel binaries" in checks["conformance"][1]
    assert "stand in" in checks["conformance"][1]
    for name in ("ep_copies", "ep_ipc", "ep_timing", "ep_end_to_end"):
        assert checks[name][0] == "SKIP" and "torch CUDA" in checks[name][1], (name, checks[name])
    # nvlink_intra's plugin is not in these runfiles (its package keeps it to //transfer_engine and //python):
    # the check then says so; where it is found it must pass.
    state, detail = checks["nvlink_intra"]
    assert (state, "nvlink_intra plugin is not here" in detail) in (("SKIP", True), ("PASS", False)), detail
    assert "host emulation" in checks["ep_kernels"][1]
    assert "host_emulation device memory (cuda:0)" in checks["store_zero_copy"][1]
    bw = [line for line in p.stdout.splitlines() if line.startswith("BW ")]
    assert any(line.startswith("BW tcp_staging ") for line in bw) and any("tcp_staging_baseline" in b for b in bw)
    assert summary["mode"] == "emulation" and summary["exit"] == 0 and summary["total_s"] < 600, summary
    for name, r in summary["checks"].items():
        assert {"state", "detail", "seconds"} <= set(r), (name, r)
    assert summary["checks"]["store_zero_copy"]["data"]["batch_bytes"] is True
    with open(tmp_path / "gpu_check.json") as f:
        assert json.load(f)["checks"].keys() == summary["checks"].keys()


def test_a_check_past_its_limit_is_killed_and_fails():
    p, checks, summary = run("--emulation", "--only", "tcp_staging", "--limit", "tcp_staging=1", timeout=120)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert checks["tcp_staging"][0] == "FAIL" and "timed out after 1 s" in checks["tcp_staging"][1], checks
    assert list(summary["checks"]) == ["tcp_staging"] and summary["exit"] == 1


def test_finds_the_conformance_binaries_where_build_native_installs_them(tmp_path, monkeypatch):
    monkeypatch.delenv("MC_GPU_CHECK_CONFORMANCE", raising=False)
    monkeypatch.delenv("BUILD_WORKSPACE_DIRECTORY", raising=False)
    monkeypatch.setattr(gpu_check, "ROOT", str(tmp_path))
    binary, looked = gpu_check._conformance_binary()
    assert binary == "" and os.path.join(str(tmp_path), gpu_check.INSTALLED_CONFORMANCE) in looked, looked
    # The layout ci/build_native.sh installs: both binaries in python/mooncake/_plugins/conformance/.
    where = tmp_path / "python" / "mooncake" / "_plugins" / "conformance"
    where.mkdir(parents=True)
    for name in ("tcp_conformance_test", "conformance_peer"):
        (where / name).write_text("#!/bin/sh\n")
        (where / name).chmod(0o755)
    assert gpu_check._conformance_binary() == (str(where / "tcp_conformance_test"), str(where / "conformance_peer"))
    # The script installs where this looks (read from the source tree the runfiles link to).
    script = os.path.join(os.path.dirname(os.path.realpath(SCRIPT)), "..", "..", "ci", "build_native.sh")
    with open(script) as f:
        assert "install -d " + gpu_check.INSTALLED_CONFORMANCE + "\n" in f.read(), script
