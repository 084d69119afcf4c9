import json
import socket
import subprocess
import sys
import urllib.request

import pytest

import mooncake
from mooncake.store.master.cli import parse_config
from mooncake.store.master.testing import MasterProcess, child_env


def test_defaults_match_mooncake():
    cfg, level = parse_config([])
    assert (cfg.port, cfg.max_threads, cfg.default_kv_lease_ttl_ms, cfg.eviction_high_watermark_ratio,
            cfg.eviction_ratio, cfg.client_ttl_sec, cfg.metrics_port, cfg.enable_http_metadata_server,
            cfg.http_metadata_server_port, cfg.default_kv_soft_pin_ttl_ms, cfg.put_start_discard_timeout_sec,
            cfg.put_start_release_timeout_sec) == (50051, 16, 10000, 0.9, 0.05, 10.0, 9003, False, 8080,
                                                   1_800_000, 30.0, 600.0)
    assert level == "INFO"


def test_flag_forms():
    cfg, _ = parse_config(["--port", "123", "--default_kv_lease_ttl=2s", "--client_ttl=500ms",
                           "--enable_http_metadata_server", "--noenable_metric_reporting",
                           "--allow_evict_soft_pinned_objects=false", "--rpc_port=77", "--rpc_thread_num=3",
                           "--max_kv_soft_pin_ttl=2h"])
    assert cfg.port == 77 and cfg.max_threads == 3  # --rpc_port / --rpc_thread_num win when set
    assert cfg.default_kv_lease_ttl_ms == 2000 and cfg.client_ttl_sec == 0.5
    assert cfg.enable_http_metadata_server and not cfg.enable_metric_reporting
    assert not cfg.allow_evict_soft_pinned_objects and cfg.max_kv_soft_pin_ttl_ms == 7_200_000
    assert parse_config(["--default_kv_lease_ttl=750"])[0].default_kv_lease_ttl_ms == 750


@pytest.mark.parametrize("argv, message", [
    (["--bogus=1"], "unrecognized arguments"),
    (["--port=70000"], "--port"),
    (["--eviction_ratio=0"], "--eviction_ratio"),
    (["--eviction_high_watermark_ratio=abc"], "--eviction_high_watermark_ratio"),
    (["--default_kv_lease_ttl=soon"], "duration"),
    (["--enable_http_metadata_server=maybe"], "boolean"),
    (["--allocation_strategy=best"], "allocation_strategy"),
    (["--memory_allocator=cachelib"], "memory_allocator"),
    (["--default_kv_soft_pin_ttl=2h", "--max_kv_soft_pin_ttl=1h"], "max_kv_soft_pin_ttl"),
    (["--log_level=LOUD"], "log_level"),
    (["--enable_ha"], "--ha_backend_connstring"),
    (["--enable_ha", "--ha_backend_type=zookeeper", "--etcd_endpoints=h:1"], "--ha_backend_type"),
    (["--ha_lease_ttl=100ms"], "--ha_lease_ttl"),
    (["--snapshot_interval_seconds=0"], "--snapshot_interval_seconds"),
])
def test_bad_flags_exit_2_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_ha_and_snapshot_flags():
    cfg, _ = parse_config(["--enable_ha", "--etcd_endpoints=h1:2379;h2:2379", "--enable_oplog", "--ha_lease_ttl=3s",
                           "--enable_snapshot", "--snapshot_dir=/x", "--snapshot_interval_seconds=5"])
    assert (cfg.enable_ha, cfg.ha_backend_type, cfg.ha_backend_connstring, cfg.enable_oplog) == (
        True, "etcd", "h1:2379;h2:2379", True)
    assert (cfg.ha_lease_ttl_sec, cfg.enable_snapshot, cfg.snapshot_path(), cfg.snapshot_interval_seconds) == (
        3.0, True, "/x", 5.0)


def test_config_file(tmp_path, capsys):
    path = tmp_path / "master.json"
    path.write_text(json.dumps({"port": 6000, "eviction_ratio": 0.1, "enable_http_metadata_server": True}))
    cfg, _ = parse_config([f"--config_path={path}", "--port=6001"])
    assert cfg.port == 6001 and cfg.eviction_ratio == 0.1 and cfg.enable_http_metadata_server
    path.write_text(json.dumps({"nonsense": 1}))
    with pytest.raises(SystemExit):
        parse_config([f"--config_path={path}"])
    assert "unknown flag 'nonsense'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config([f"--config_path={tmp_path / 'missing.json'}"])


def _run(*args):
    return subprocess.run([sys.executable, "-m", "mooncake.store.master.cli", *args], capture_output=True,
                          text=True, env=child_env(), timeout=60)


def test_version_help_and_errors_in_a_real_process():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"mooncake_master {mooncake.__version__}"
    r = _run("--help")
    assert r.returncode == 0 and "--default_kv_lease_ttl" in r.stdout and "--eviction_high_watermark_ratio" in r.stdout
    r = _run("--client_ttl=-1")
    assert r.returncode == 2 and "client_ttl" in r.stderr


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run(f"--port={port}", "--rpc_address=127.0.0.1", "--metrics_port=0")
    assert r.returncode == 1 and "cannot bind" in r.stderr


def test_embedded_http_metadata_server():
    m = MasterProcess("--enable_http_metadata_server", "--http_metadata_server_port=0",
                      "--http_metadata_server_host=127.0.0.1")
    try:
        port = int(m.banner.split("metadata ")[1].split(":")[1])
        url = f"http://127.0.0.1:{port}/metadata?key=mooncake/ram/seg"
        req = urllib.request.Request(url, data=b'{"name": "seg"}', method="PUT")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.read() == b'{"name": "seg"}'
        with urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/health", timeout=10) as r:
            assert json.loads(r.read())["status"] == "ok"
    finally:
        assert m.stop() == 0  # SIGTERM: clean shutdown
