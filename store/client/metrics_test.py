"""The store client's /metrics and /health (setup(..., enable_client_http_server=True, client_http_port=N))
against a real master, and mooncake_client serving them too."""

import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess, child_env, read_line, stop_process


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=300")
    yield m
    m.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def value(text: str, sample: str) -> float:
    m = re.search(r"^" + re.escape(sample) + r" (\S+)$", text, re.M)
    assert m, f"{sample} not exported:\n{text}"
    return float(m.group(1))


def setup_store(master, port, **kw):
    s = MooncakeDistributedStore()
    code = s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "16MB", "local_buffer_size": "4MB", "protocol": "tcp",
                    "master_server_addr": master.address, "enable_client_http_server": True,
                    "client_http_port": port, **kw})
    return s, code


def test_metrics_count_puts_gets_and_misses(master):
    port = free_port()
    s, code = setup_store(master, port)
    assert code == 0
    try:
        assert s.put("m/a", b"x" * 1000) == 0
        assert s.put_batch(["m/b", "m/c"], [b"y" * 10, b"z" * 20]) == 0
        assert s.get("m/a") == b"x" * 1000
        assert s.get("m/none") == b""
        buf = np.zeros(4096, dtype=np.uint8)
        assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
        assert s.batch_get_into(["m/b", "m/none"], [buf.ctypes.data, buf.ctypes.data + 100], [100, 100]) == \
            [10, E.OBJECT_NOT_FOUND]
        code, text = scrape(port)
        assert code == 200
        assert value(text, "mooncake_transfer_write_bytes") == 1030
        assert value(text, "mooncake_transfer_read_bytes") == 1010
        assert value(text, 'mooncake_client_requests_total{op="put"}') == 1
        assert value(text, 'mooncake_client_requests_total{op="put_batch"}') == 2
        assert value(text, 'mooncake_client_requests_total{op="batch_get_into"}') == 2
        assert value(text, 'mooncake_client_request_failures_total{op="get"}') == 1
        assert value(text, "mooncake_client_get_misses_total") == 2
        assert value(text, "mooncake_transfer_put_latency_count") == 1
        assert value(text, "mooncake_transfer_batch_put_latency_count") == 1
        assert value(text, "mooncake_transfer_get_latency_count") == 2
        assert 'mooncake_transfer_get_latency_bucket{le="125.0"}' in text
        assert value(text, "mooncake_client_segment_bytes") == 16 << 20
        assert value(text, "mooncake_te_up") == 1
        code, body = scrape(port, "/health")
        assert code == 200 and json.loads(body)["status"] == "ok"
        assert scrape(port, "/nope")[0] == 404
    finally:
        s.close()
    with pytest.raises(OSError):  # the server is gone with the client
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert "put" not in s.__dict__  # the wrappers are gone too


def test_port_in_use_fails_setup(master):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        s, code = setup_store(master, busy.getsockname()[1])
        assert code == E.INVALID_PARAMS
        s.close()


def test_without_the_option_nothing_listens(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "4MB", "tcp", "", master.address) == 0
    try:
        assert s._http is None and "put" not in s.__dict__
    finally:
        s.close()


def test_mooncake_client_serves_metrics(master):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mooncake.store.client.service", "--master_server_address",
                             master.address, "--port", "0", "--global_segment_size", "16MB",
                             "--enable_client_http_server", "--client_http_port", str(port), "--log_level",
                             "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        assert read_line(proc, 60).startswith("mooncake_client ready")
        code, text = scrape(port)
        assert code == 200 and value(text, "mooncake_client_segment_bytes") == 16 << 20
        assert "mooncake_transfer_read_bytes" in text
    finally:
        assert stop_process(proc, 10) == 0
