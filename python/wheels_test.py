"""Every wheel variant of //python:wheels installs into its own fresh venv and works there.

Per variant: the wheel carries exactly the plugins and device code its manifest (<variant>.variant.json, written by
mc_wheel_variant from the BUILD arguments) names and otherwise the same files as the non-cuda wheel; it installs
with pip into a new venv; `import mooncake.engine` works; two tcp engines move bytes; every carried plugin loads and
says why it cannot serve this host (no accelerator here); `initialize(..., "rdma", ...)` fails and logs why; no
vendor library is NEEDED by `_native`, a plugin or device code (plugins dlopen them). Prints wheel sizes.
"""

import glob
import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN_DIR = "mooncake/_plugins/"
EP_KERNELS = "mooncake/ep/cuda/libmooncake_ep_cuda.so"

# The distributions this project publishes (Mooncake's names), the plugins and device files each must carry. A
# variant not built on this machine (its plugin or toolkit missing) is reported as skipped.
NET = ["libmc_transport_efa.so", "libmc_transport_file.so", "libmc_transport_rdma.so"]  # every variant
CUDA = ["libmc_platform_cuda.so", "libmc_transport_nvlink.so", "libmc_transport_nvlink_intra.so"]
SPEC = {
    "mooncake-transfer-engine-non-cuda": (NET, []),
    "mooncake-transfer-engine": (NET + CUDA, []),  # CUDA 12: no nvcc 12 here, no kernels
    "mooncake-transfer-engine-cuda13": (NET + CUDA, [EP_KERNELS]),
    "mooncake-transfer-engine-rocm": (NET + ["libmc_platform_rocm.so", "libmc_transport_hip.so"], []),
    "mooncake-transfer-engine-npu": (NET + ["libmc_platform_ascend.so"], []),
    "mooncake-transfer-engine-musa": (NET + ["libmc_platform_musa.so"], []),
}
NON_CUDA = "mooncake-transfer-engine-non-cuda"

# What _native and the plugins may NEED: the C/C++ runtime and libcurl (HTTP metadata). Anything else (libcuda,
# libcudart, libamdhip64, libascendcl, libmusa, libibverbs, libfabric, libnuma, ...) must be dlopen'ed instead.
ALLOWED_NEEDED = {
    "libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2",
    "libpthread.so.0", "libdl.so.2", "librt.so.1", "libcurl.so.4",
}
MAX_WHEEL_MIB = 8          # the shared files: ~1.5 MiB today (the gzip traces ~1.1 MiB); catches stray data
MAX_DEVICE_CODE_MIB = 16   # per variant, on top: kernels for a few GPU generations


def _load_manifests():
    manifests = {}
    for path in sorted(glob.glob(os.path.join(HERE, "*.variant.json"))):
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
        assert m["distribution"] not in manifests, f"two variants named {m['distribution']}"
        m["path"] = os.path.join(HERE, m["wheel"])
        manifests[m["distribution"]] = m
    return manifests


MANIFESTS = _load_manifests()
BUILT = sorted(MANIFESTS)


def test_every_built_variant_is_a_known_distribution():
    assert NON_CUDA in MANIFESTS, f"//python:wheels lacks the non-cuda wheel; found {BUILT}"
    assert set(MANIFESTS) <= set(SPEC), f"unknown distributions {set(MANIFESTS) - set(SPEC)}"


@pytest.mark.parametrize("distribution", sorted(SPEC))
def test_variant_is_built(distribution):
    if distribution not in MANIFESTS:
        pytest.skip(f"{distribution} is not among //python:wheels on this machine (its plugin or toolkit is missing)")
    m = MANIFESTS[distribution]
    print(f"{distribution}: device code: {m['device_code']}; compile-only: {m['compile_only'] or 'no'}")
    assert os.path.isfile(m["path"]), f"the manifest names {m['wheel']}, which is not in //python:wheels"


# ---- contents (no install needed) ------------------------------------------------------------------------------

def _names(m):
    return zipfile.ZipFile(m["path"]).namelist()


def _metadata(m, file):
    names = _names(m)
    entry = next(n for n in names if n.endswith(".dist-info/" + file))
    return zipfile.ZipFile(m["path"]).read(entry).decode()


def _field(text, key):
    return [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith(key + ": ")]


@pytest.mark.parametrize("distribution", BUILT)
def test_manifest_is_the_spec(distribution):
    m = MANIFESTS[distribution]
    plugins, device_files = SPEC[distribution]
    assert [p.removeprefix(PLUGIN_DIR) for p in m["plugins"]] == sorted(plugins)
    assert m["device_files"] == sorted(device_files)
    # Nothing an accelerator variant adds runs on the CI machine (no accelerator): the manifest must say why.
    assert bool(m["compile_only"]) == (distribution != NON_CUDA), m["compile_only"]
    assert m["device_code"], "say how the variant gets its device code (or 'none')"


@pytest.mark.parametrize("distribution", BUILT)
def test_variant_differs_only_in_plugins_device_code_and_metadata(distribution):
    m, base = MANIFESTS[distribution], MANIFESTS[NON_CUDA]
    names = _names(m)
    size = os.path.getsize(m["path"])
    print(f"{m['wheel']}: {size / 2**20:.2f} MiB, {len(names)} files")
    assert set(n for n in names if n.startswith(PLUGIN_DIR)) == set(m["plugins"])
    assert set(m["device_files"]) <= set(names)
    shared = {n for n in names if ".dist-info/" not in n} - set(m["plugins"]) - set(m["device_files"])
    assert shared == {n for n in _names(base) if ".dist-info/" not in n} - set(base["plugins"])
    assert any(re.fullmatch(r"mooncake/_native\..*\.so", n) for n in names)

    meta, base_meta = _metadata(m, "METADATA"), _metadata(base, "METADATA")
    assert _field(meta, "Name") == [distribution]
    assert _field(meta, "Summary") == [m["summary"]]
    assert _field(meta, "Version") == _field(base_meta, "Version")
    assert _metadata(m, "WHEEL") == _metadata(base, "WHEEL")  # same version/platform tag
    tag = _field(_metadata(m, "WHEEL"), "Tag")[0]
    assert m["wheel"].endswith(f"-{tag}.whl") and m["wheel"].startswith(distribution.replace("-", "_") + "-")

    device = sum(zipfile.ZipFile(m["path"]).getinfo(n).compress_size for n in m["device_files"])
    assert size - device < MAX_WHEEL_MIB << 20, size
    assert device < MAX_DEVICE_CODE_MIB << 20, device


# ---- installed into a fresh venv -------------------------------------------------------------------------------

_VENVS = {}


def venv(tmp_path_factory, distribution):
    """A new venv (no pip of its own, no system site-packages) with only this variant installed by pip;
    numpy (a declared dependency) is borrowed from the test's interpreter, after the venv's own site-packages."""
    if distribution in _VENVS:
        return _VENVS[distribution]
    root = tmp_path_factory.mktemp("venv-" + distribution)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    py = str(root / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "--no-cache-dir", "--disable-pip-version-check",
                    "install", "-q", "--no-index", "--no-deps", MANIFESTS[distribution]["path"]],
                   check=True, timeout=120)
    site = os.path.dirname(os.path.dirname(__import__("numpy").__file__))
    venv_site = sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)})
    with open(os.path.join(venv_site, "deps.pth"), "w") as f:
        f.write(site + "\n")
    _VENVS[distribution] = (py, venv_site)
    return _VENVS[distribution]


def run_python(py, code):
    """Runs `code` with the venv's interpreter as a user would: no source tree, no plugin directory override."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "MC_PLUGIN_DIR", "MC_LOG_LEVEL")}
    return subprocess.run([py, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(py)), env=env)


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True, timeout=30).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.mark.parametrize("distribution", BUILT)
def test_installed_core_and_plugins_need_no_vendor_library(tmp_path_factory, distribution):
    py, site = venv(tmp_path_factory, distribution)
    native = glob.glob(os.path.join(site, "mooncake", "_native*.so"))
    assert len(native) == 1, native
    m = MANIFESTS[distribution]
    libs = native + [os.path.join(site, p) for p in m["plugins"] + m["device_files"] if p.endswith(".so")]
    for lib in libs:
        got = needed(lib)
        print(f"{os.path.basename(lib)} NEEDED: {' '.join(got)}")
        assert "libc.so.6" in got, f"readelf found no NEEDED entries in {lib}"
        assert not set(got) - ALLOWED_NEEDED, f"{lib} NEEDs {set(got) - ALLOWED_NEEDED} (dlopen them instead)"


@pytest.mark.parametrize("distribution", BUILT)
def test_installed_tcp_engines_move_bytes(tmp_path_factory, distribution):
    py, _ = venv(tmp_path_factory, distribution)
    out = run_python(py, """
        import mooncake, mooncake.engine
        from mooncake.engine import TransferEngine
        assert 'site-packages' in mooncake.__file__, mooncake.__file__
        a, b = TransferEngine(), TransferEngine()
        assert a.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0
        assert b.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0
        n = 4 << 20
        src, dst = a.allocate_managed_buffer(n), b.allocate_managed_buffer(n)
        data = bytes(range(256)) * (n // 256)
        a.write_bytes_to_buffer(src, data, n)
        assert a.transfer_sync_write(b.get_local_segment_name(), src, dst, n) == 0
        assert b.read_bytes_from_buffer(dst, n) == data
        a.write_bytes_to_buffer(src, bytes(n), n)
        assert a.transfer_sync_read(b.get_local_segment_name(), src, dst, n) == 0
        assert a.read_bytes_from_buffer(src, n) == data
        print('ok')
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# A plugin may say "loaded" only where its accelerator's device node exists (never on the CI machine); the file
# transport needs no device (io_uring, present on every kernel we support).
DEVICE_NODES = {"cuda": "/dev/nvidia[0-9]*", "rocm": "/dev/kfd", "ascend": "/dev/davinci[0-9]*",
                "musa": "/dev/mtgpu*", "file": "/proc/self"}


@pytest.mark.parametrize("distribution", BUILT)
def test_installed_plugins_load_and_say_why_they_cannot_serve(tmp_path_factory, distribution):
    py, site = venv(tmp_path_factory, distribution)
    folder = os.path.join(site, PLUGIN_DIR)
    present = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    carried = [p.removeprefix(PLUGIN_DIR) for p in MANIFESTS[distribution]["plugins"]]
    assert present == carried
    out = run_python(py, """
        import json
        from mooncake.engine import TransferEngine
        print(json.dumps(TransferEngine().plugins()))
    """)
    assert out.returncode == 0, out.stderr
    states = json.loads(out.stdout)
    from_wheel = {os.path.basename(s["origin"]): s for s in states if s["origin"] != "builtin"}
    assert sorted(from_wheel) == carried, states
    for file, s in sorted(from_wheel.items()):
        print(f"{file}: {s['kind']} {s['name']}: {s['state']}: {s['reason']}")
        assert os.path.realpath(os.path.dirname(s["origin"])) == os.path.realpath(folder), s
        assert file == f"libmc_{s['kind']}_{s['name']}.so", s
        if s["state"] == "loaded" and glob.glob(DEVICE_NODES.get(s["name"], "/nonexistent")):
            continue
        assert s["state"] in ("unusable", "library_missing"), s
        assert s["reason"].strip(), f"{file} gives no reason: {s}"


@pytest.mark.parametrize("distribution", BUILT)
def test_installed_rdma_initialize_fails_with_reason(tmp_path_factory, distribution):
    py, _ = venv(tmp_path_factory, distribution)
    out = run_python(py, """
        from mooncake.engine import TransferEngine
        print(TransferEngine().initialize('127.0.0.1', 'P2PHANDSHAKE', 'rdma', ''))
    """)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) < 0, f"rdma initialize succeeded on a host without RDMA:\n{out.stderr}"
    reasons = [line for line in out.stderr.splitlines() if "rdma" in line and re.match(r"[WE]\d{4}", line)]
    print("\n".join(reasons))
    assert reasons, f"no WARNING/ERROR line says why rdma failed:\n{out.stderr}"
