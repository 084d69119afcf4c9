"""`mooncake doctor` on this machine (no RDMA, no GPU) and against live and absent services."""

import json
import os
import stat

import pytest

from mooncake.http_metadata_server import HttpMetadataServer
from mooncake.store.master.testing import MasterProcess
from mooncake.tools.cli import main
from mooncake.tools.doctor import fabric
from mooncake.tools.doctor.report import Config, Finding, Host


def doctor(capsys, *argv):
    code = main(["doctor", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_this_host_is_ready_for_tcp(capsys):
    code, out, _ = doctor(capsys)
    assert code == 0, out
    assert out.rstrip().splitlines()[-1] == "READY: no RDMA, no GPU, tcp and shm ready"
    assert "CHECK" in out.splitlines()[0] and "plugins    protocol tcp" in out


def test_json_for_scripts(capsys):
    code, out, _ = doctor(capsys, "--json", "--protocol", "TCP", "--segment-size", "1GB")
    report = json.loads(out)
    assert code == 0 and report["ready"] is True and report["summary"] == "no RDMA, no GPU, tcp and shm ready"
    assert report["config"]["segment_size"] == 1 << 30 and report["config"]["protocol"] == "tcp"
    families = {f["family"] for f in report["findings"]}
    assert families == {"rdma", "memory", "gpu", "libfabric", "kernel", "network", "plugins"}
    plugins = {f["item"]: f for f in report["findings"] if f["family"] == "plugins"}
    assert plugins["transport cxl (cxl)"]["state"] == "info" and "MC_CXL_DEV_PATH" in \
        plugins["transport cxl (cxl)"]["detail"]


def test_rdma_will_not_work_here_and_says_what_to_do(capsys):
    code, out, _ = doctor(capsys, "--protocol", "rdma", "--segment-size", "64GB")
    assert code == 1
    assert out.rstrip().splitlines()[-1].startswith("WILL NOT WORK: no RDMA")
    todo = out[out.index("What to do:"):]
    assert "[FAIL] rdma/devices" in todo and "--protocol tcp" in todo
    assert "[FAIL] plugins/protocol rdma" in todo


@pytest.mark.parametrize("argv, message", [
    (["--protocol", "carrier-pigeon"], "unknown protocol"),
    (["--segment-size", "12 parsecs"], "bad size"),
    (["--master", "nohostport"], "host:port"),
    (["--timeout", "0"], "positive"),
])
def test_bad_arguments_exit_2(capsys, argv, message):
    code, out, err = doctor(capsys, *argv)
    assert code == 2 and message in err and out == ""


def test_live_master_and_metadata_server(capsys):
    master = MasterProcess()
    meta = HttpMetadataServer("127.0.0.1", 0).start()
    try:
        code, out, _ = doctor(capsys, "--json", "--master", master.address, "--metadata-server",
                              f"http://127.0.0.1:{meta.port}/metadata")
    finally:
        meta.stop()
        master.stop()
    net = {f["item"]: f for f in json.loads(out)["findings"] if f["family"] == "network"}
    assert code == 0
    assert net["master"]["state"] == "ok" and "answers" in net["master"]["detail"]
    assert net["metadata server"]["state"] == "ok"


def test_absent_master_and_metadata_server(capsys):
    code, out, _ = doctor(capsys, "--json", "--timeout", "1", "--master", "127.0.0.1:1",
                          "--metadata-server", "redis://127.0.0.1:1")
    net = {f["item"]: f for f in json.loads(out)["findings"] if f["family"] == "network"}
    assert code == 1
    assert net["master"]["state"] == "fail" and "mooncake_master" in net["master"]["fix"]
    assert net["metadata server"]["state"] == "fail"


def test_fi_info_providers(tmp_path, monkeypatch):
    tool = tmp_path / "fi_info"
    tool.write_text("#!/bin/sh\nprintf 'tcp:\\n    version: 117.0\\nshm:\\n    version: 117.0\\n'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    f = fabric.check(Host("/"), Config(protocol="efa"))
    assert f[0].data == {"providers": ["tcp", "shm"]}
    assert f[1].state == "fail" and "efa" in f[1].item


def test_a_failing_finding_must_say_what_to_do():
    with pytest.raises(ValueError, match="needs a fix"):
        Finding("x", "y", "fail", "broken")
    with pytest.raises(ValueError, match="unknown finding state"):
        Finding("x", "y", "great", "fine")
