import http.client
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from mooncake.http_metadata_server import HttpMetadataServer


@pytest.fixture
def server():
    with HttpMetadataServer("127.0.0.1", 0) as s:
        yield s


def request(server, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def key_path(key):
    return "/metadata?key=" + urllib.parse.quote(key, safe="")


def test_put_get_delete_round_trip(server):
    assert request(server, "GET", key_path("mooncake/ram/a")) == (404, b"metadata not found")
    assert request(server, "PUT", key_path("mooncake/ram/a"), b'{"x":1}') == (200, b"metadata updated")
    assert request(server, "GET", key_path("mooncake/ram/a")) == (200, b'{"x":1}')
    assert request(server, "PUT", key_path("mooncake/ram/a"), b'{"x":2}')[0] == 200
    assert request(server, "GET", key_path("mooncake/ram/a")) == (200, b'{"x":2}')
    assert request(server, "DELETE", key_path("mooncake/ram/a")) == (200, b"metadata deleted")
    assert request(server, "DELETE", key_path("mooncake/ram/a"))[0] == 404


def test_keys_are_stripped_and_url_decoded(server):
    assert request(server, "PUT", key_path("  k/with space&=  "), b"v")[0] == 200
    assert request(server, "GET", key_path("k/with space&=")) == (200, b"v")


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
@pytest.mark.parametrize("path", ["/metadata", "/metadata?key=", "/metadata?key=%20%20"])
def test_missing_or_blank_key_is_400(server, method, path):
    assert request(server, method, path, b"" if method == "PUT" else None)[0] == 400


def test_duplicate_rpc_meta_is_rejected_unless_identical(server):
    path = key_path("mooncake/rpc_meta/node")
    assert request(server, "PUT", path, b"A")[0] == 200
    assert request(server, "PUT", path, b"A") == (200, b"metadata unchanged")
    assert request(server, "PUT", path, b"B")[0] == 400
    assert request(server, "GET", path) == (200, b"A")


def test_health_unknown_path_and_method(server):
    assert request(server, "GET", "/health") == (200, b"OK")
    assert request(server, "GET", "/nope")[0] == 404
    assert request(server, "POST", key_path("k"), b"x")[0] == 405


def test_concurrent_writers_lose_nothing(server):
    def writer(i):
        for j in range(50):
            assert request(server, "PUT", key_path(f"k{i}/{j}"), str(j).encode())[0] == 200

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.store.keys()) == 400


def test_cli_serves_and_reports_bind_errors():
    with HttpMetadataServer("127.0.0.1", 0) as busy:
        out = subprocess.run([sys.executable, "-m", "mooncake.http_metadata_server", "--host", "127.0.0.1",
                              "--port", str(busy.port)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 1
        assert "cannot bind" in out.stderr
    help_out = subprocess.run([sys.executable, "-m", "mooncake.http_metadata_server", "--help"],
                              capture_output=True, text=True, timeout=30)
    assert help_out.returncode == 0 and "--port" in help_out.stdout


def test_stop_is_idempotent():
    s = HttpMetadataServer("127.0.0.1", 0).start()
    s.stop()
    s.stop()
    time.sleep(0)
