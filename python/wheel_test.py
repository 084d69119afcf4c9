"""The built wheel installs with pip into a clean venv and works there (no Bazel, no source tree)."""

import glob
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

WHEEL = glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mooncake_transfer_engine_non_cuda-*.whl"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    assert len(WHEEL) == 1, WHEEL
    root = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(root)], check=True, timeout=120)
    py = str(root / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", WHEEL[0]], check=True, timeout=300)
    return root


def run(venv, args, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=str(venv), env=env, **kw)


def test_wheel_contents():
    names = zipfile.ZipFile(WHEEL[0]).namelist()
    assert any(n.startswith("mooncake/_native.") and n.endswith(".so") for n in names)
    assert "mooncake/tools/cli.py" in names
    assert "mooncake/store/master/cli.py" in names
    assert "mooncake/ep/buffer.py" in names
    assert "mooncake/pg/__init__.py" in names and "mooncake/async_store.py" in names
    assert "mooncake/store/client/store.py" in names
    assert "mooncake/store/proto/mooncake_master_pb2_grpc.py" in names
    assert not any(n.endswith("_test.py") for n in names)
    entry = zipfile.ZipFile(WHEEL[0]).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for script in ("transfer_engine_bench", "mooncake_http_metadata_server", "mooncake ", "mooncake_master",
                   "mooncake_client", "transfer_engine_topology_dump"):
        assert script in entry


def test_engine_works_from_the_installed_wheel(venv):
    code = textwrap.dedent("""
        import mooncake, mooncake.engine
        from mooncake.engine import TransferEngine
        assert 'site-packages' in mooncake.__file__, mooncake.__file__
        a, b = TransferEngine(), TransferEngine()
        assert a.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0
        assert b.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0
        src, dst = a.allocate_managed_buffer(1 << 20), b.allocate_managed_buffer(1 << 20)
        data = bytes(range(256)) * 4096
        a.write_bytes_to_buffer(src, data, len(data))
        assert a.transfer_sync_write(b.get_local_segment_name(), src, dst, len(data)) == 0
        assert b.read_bytes_from_buffer(dst, len(data)) == data
        print('ok')
    """)
    out = run(venv, [str(venv / "bin" / "python"), "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_console_scripts(venv):
    out = run(venv, [str(venv / "bin" / "mooncake_http_metadata_server"), "--help"])
    assert out.returncode == 0 and "--port" in out.stdout, out.stderr
    # numpy is a declared dependency; offline, borrow the one this test runs with.
    site = os.path.dirname(os.path.dirname(__import__("numpy").__file__))
    venv_site = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    with open(os.path.join(venv_site, "deps.pth"), "w") as f:
        f.write(site + "\n")
    out = run(venv, [str(venv / "bin" / "transfer_engine_bench"), "--help"])
    assert out.returncode == 0 and "--mode" in out.stdout, out.stderr
    out = run(venv, [str(venv / "bin" / "mooncake"), "kvcache-size", "--model", "llama-3-70b", "--json"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["bytes_per_token"] == 327680  # Llama-3-70B, bf16: 320 KiB per token
    out = run(venv, [str(venv / "bin" / "mooncake_master"), "--help"])
    assert out.returncode == 0 and "--port" in out.stdout, out.stderr
