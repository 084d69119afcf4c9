"""Plugin states through Python: TransferEngine.plugins(), TransferEngine.get_supported_protocols() and
transfer_engine_topology_dump, on the built-in plugins and (in subprocesses, since plugins load once per process)
with the loader's toy plugins in an MC_PLUGIN_DIR folder. A broken or unusable plugin never breaks the import or a
tcp engine."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from mooncake.engine import TransferEngine

HERE = os.path.dirname(os.path.abspath(__file__))
TOYS = os.path.join(HERE, "..", "..", "transfer_engine", "plugin", "testing")
KEYS = {"name", "kind", "origin", "protocols", "state", "reason"}
STATES = {"loaded", "unusable", "library_missing", "refused", "error"}

# Runs in a fresh interpreter: lists the plugins and protocols, then moves 4 KiB between two tcp engines.
CHILD = r"""
import json, sys
import numpy as np
from mooncake.engine import TransferEngine
out = {"plugins": TransferEngine.plugins(), "protocols": TransferEngine.get_supported_protocols()}
a, b = TransferEngine(), TransferEngine()
assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
src, dst = np.arange(4096, dtype=np.uint8), np.zeros(4096, dtype=np.uint8)
assert a.register_memory(src.ctypes.data, src.nbytes) == 0
assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
peer = b.get_local_segment_name()
out["write"] = a.transfer_sync_write(peer, src.ctypes.data, b.get_first_buffer_address(peer), 4096)
out["equal"] = bool((src == dst).all())
a.close(); b.close()
print(json.dumps(out))
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MC_PLUGIN_DIR", "MC_TOY_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env.update(extra)
    return env


def _run(args, **extra):
    out = subprocess.run(args, capture_output=True, text=True, env=_env(**extra), timeout=120)
    assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """A folder with copies of the toy plugins: good transport, good platform, wrong ABI, wrong build id, missing
    vendor library, no entry point."""
    d = tmp_path_factory.mktemp("plugins")
    for name in ("libmc_transport_toy.so", "libmc_platform_toyplat.so", "libmc_transport_toy_badabi.so",
                 "libmc_transport_toy_badbuild.so", "libmc_transport_toy_novendor.so",
                 "libmc_transport_toy_noentry.so"):
        shutil.copy(os.path.join(TOYS, name), d / name)
    return str(d)


def _by_name(plugins):
    return {(p["kind"], p["name"]): p for p in plugins}


def test_builtin_plugins_are_listed():
    plugins = TransferEngine.plugins()
    assert isinstance(plugins, list) and plugins
    for p in plugins:
        assert set(p) == KEYS and p["state"] in STATES and isinstance(p["protocols"], list), p
    found = _by_name(plugins)
    tcp = found[("transport", "tcp")]
    assert tcp["origin"] == "builtin" and tcp["state"] == "loaded" and tcp["reason"] == "" and "tcp" in tcp["protocols"]
    assert found[("platform", "cpu")]["state"] == "loaded"


def test_supported_protocols_on_the_class_and_an_engine():
    protocols = TransferEngine.get_supported_protocols()
    assert "tcp" in protocols and len(set(protocols)) == len(protocols)
    usable = {proto for p in TransferEngine.plugins() if p["kind"] == "transport" and p["state"] == "loaded"
              for proto in p["protocols"]}
    assert set(protocols) == usable
    engine = TransferEngine()
    assert engine.get_supported_protocols() == protocols
    assert engine.plugins() == TransferEngine.plugins()


def test_wrong_arguments_are_a_type_error():
    with pytest.raises(TypeError):
        TransferEngine.get_supported_protocols("tcp")
    with pytest.raises(TypeError):
        TransferEngine.plugins(1)


def test_toy_plugins_report_every_state_and_tcp_still_works(plugin_dir):
    out = json.loads(_run([sys.executable, "-c", CHILD], MC_PLUGIN_DIR=plugin_dir).stdout)
    assert out["write"] == 0 and out["equal"]
    found = _by_name(out["plugins"])
    toy = found[("transport", "toy")]
    assert toy["state"] == "unusable" and toy["reason"] == "no toy device"
    assert toy["protocols"] == ["toy", "toy_alias"]
    assert toy["origin"] == os.path.join(plugin_dir, "libmc_transport_toy.so")
    assert found[("platform", "toyplat")]["state"] == "loaded"
    bad_abi = found[("transport", "toy_badabi")]
    assert bad_abi["state"] == "refused" and bad_abi["reason"] == "plugin ABI version 2, this engine loads version 1"
    bad_build = found[("transport", "toy_badbuild")]
    assert bad_build["state"] == "refused" and "build id 0000000000000000" in bad_build["reason"]
    missing = found[("transport", "toy_novendor")]
    assert missing["state"] == "library_missing"
    assert "libmc_missing_vendor.so.1: cannot open shared object file" in missing["reason"]
    assert found[("transport", "toy_noentry")]["state"] == "error"
    assert "toy" not in out["protocols"] and "tcp" in out["protocols"]


def test_a_usable_toy_serves_its_protocols(plugin_dir):
    out = json.loads(_run([sys.executable, "-c", CHILD], MC_PLUGIN_DIR=plugin_dir, MC_TOY_DEVICE="1").stdout)
    toy = _by_name(out["plugins"])[("transport", "toy")]
    assert toy["state"] == "loaded" and toy["reason"] == ""
    assert {"toy", "toy_alias", "tcp"} <= set(out["protocols"])
    assert out["write"] == 0 and out["equal"]


def test_plugins_beside_the_extension_are_found(tmp_path):
    # The wheel's layout: mooncake/_native*.so with mooncake/_plugins/libmc_*.so beside it, no MC_PLUGIN_DIR.
    package = tmp_path / "site" / "mooncake"
    (package / "_plugins").mkdir(parents=True)
    for name in ("__init__.py", "engine.py", "_native.so"):
        shutil.copy(os.path.join(HERE, name), package / name)
    shutil.copy(os.path.join(TOYS, "libmc_transport_toy.so"), package / "_plugins" / "libmc_transport_toy.so")
    code = "import json; from mooncake.engine import TransferEngine; print(json.dumps(TransferEngine.plugins()))"
    env = _env(MC_TOY_DEVICE="1")
    env["PYTHONPATH"] = str(tmp_path / "site")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    toy = _by_name(json.loads(out.stdout))[("transport", "toy")]
    assert toy["state"] == "loaded" and toy["origin"] == str(package / "_plugins" / "libmc_transport_toy.so")


def test_missing_plugin_folder_is_not_fatal(tmp_path):
    out = _run([sys.executable, "-c", CHILD], MC_PLUGIN_DIR=str(tmp_path / "nowhere"))
    assert json.loads(out.stdout)["write"] == 0
    assert "cannot read plugin folder" in out.stderr


def test_topology_dump_lists_plugins(plugin_dir):
    dump = [sys.executable, "-m", "mooncake.transfer_engine_topology_dump"]
    plain = _run(dump, MC_PLUGIN_DIR=plugin_dir)
    assert "plugins" not in json.loads(plain.stdout)  # still a file MC_CUSTOM_TOPO_JSON accepts
    table = plain.stderr.splitlines()
    assert "plugins:" in table
    rows = [line.split() for line in table if line.startswith("  ")]
    assert rows[0][:4] == ["KIND", "NAME", "STATE", "PROTOCOLS"]
    assert ["transport", "toy", "unusable", "toy,toy_alias"] in [r[:4] for r in rows]
    assert any(r[:3] == ["transport", "toy_novendor", "library_missing"] for r in rows)
    assert any(r[:3] == ["transport", "tcp", "loaded"] for r in rows)
    full = json.loads(_run(dump + ["--plugins"], MC_PLUGIN_DIR=plugin_dir).stdout)
    found = _by_name(full["plugins"])
    assert found[("transport", "toy_badabi")]["state"] == "refused"
    assert found[("transport", "tcp")]["state"] == "loaded"
    assert all(k.startswith("cpu:") for k in full if k != "plugins")


def test_a_plugin_so_exports_only_its_entry_point():
    for name in ("libmc_transport_toy.so", "libmc_platform_toyplat.so"):
        out = subprocess.run(["nm", "-D", "--defined-only", os.path.join(TOYS, name)], capture_output=True,
                             text=True, check=True).stdout
        assert [line.split()[-1] for line in out.splitlines()] == ["mc_plugin_v1"], f"{name} exports:\n{out}"
