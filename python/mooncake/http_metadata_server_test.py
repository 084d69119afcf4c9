import http.client
import os
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


def test_keep_alive_requests_take_no_delayed_ack_stall(server):
    """A reply is written as headers, then body. With Nagle on, the body waited for the client's delayed ACK
    (~40 ms per request), and every register_memory of an engine on HTTP metadata paid it twice (a 16 MiB
    store put took 88 ms instead of 3 ms). 40 requests on one keep-alive connection: far below 40 x 40 ms."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        t0 = time.monotonic()
        for i in range(20):
            conn.request("PUT", key_path("mooncake/ram/nagle"), body=b'{"n":%d}' % i)
            assert conn.getresponse().read() == b"metadata updated"
            conn.request("GET", key_path("mooncake/ram/nagle"))
            assert conn.getresponse().read() == b'{"n":%d}' % i
        elapsed = time.monotonic() - t0
    finally:
        conn.close()
    assert elapsed < 0.5, f"40 keep-alive requests took {elapsed:.2f} s"


def test_bodies_in_flight_share_a_bounded_budget():
    """Eight PUTs that announce 8 MiB and stall after 7 MiB hold at most the server's 8 MiB budget (each used
    to buffer its whole body, 56 MiB here, for as long as the client kept the connection); a body that does
    not arrive in time (2 s) ends its connection; the server serves on."""
    import ctypes

    from mooncake.testing.listener_fuzz import Stalled, memory_kib

    libc = ctypes.CDLL("libc.so.6")
    head = b"PUT /metadata?key=big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (8 << 20)
    body = head + b"x" * (7 << 20)
    with HttpMetadataServer("127.0.0.1", 0, max_bodies_in_flight=8 << 20, body_timeout=2.0) as s:
        libc.malloc_trim(0)
        before = memory_kib(os.getpid())
        with Stalled(("127.0.0.1", s.port), body, 8, send_timeout=0.1) as stalled:
            time.sleep(0.5)
            libc.malloc_trim(0)  # what the stalled requests hold, not what the allocator keeps cached
            held = memory_kib(os.getpid()) - before
            peak = s._httpd.body_budget.used
            deadline = time.monotonic() + 8
            while stalled.closed_by_peer < 8 and time.monotonic() < deadline:
                peak = max(peak, s._httpd.body_budget.used)
                time.sleep(0.01)
            assert stalled.closed_by_peer == 8
        assert peak <= 8 << 20 and s._httpd.body_budget.used == 0
        # RSS is the backstop (the budget check above is exact): buffering whole bodies holds 56 MiB and more;
        # the bounded server holds its 8 MiB budget plus per-connection thread stacks and allocator arenas, which
        # on a loaded machine reached 28 MiB.
        assert held < 40 << 10, f"{held} KiB held for 8 stalled bodies"
        assert request(s, "PUT", key_path("k"), b"v" * (1 << 20))[0] == 200
        assert request(s, "GET", key_path("k")) == (200, b"v" * (1 << 20))
        assert request(s, "GET", key_path("big"))[0] == 404


def test_refused_requests_close_their_connection(server):
    def raw(data):
        from mooncake.testing.listener_fuzz import exchange
        return exchange(("127.0.0.1", server.port), data)

    too_big = b"PUT /metadata?key=k HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % ((64 << 20) + 1)
    assert raw(too_big).startswith(b"HTTP/1.1 413")
    chunked = b"PUT /metadata?key=k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"
    assert raw(chunked).startswith(b"HTTP/1.1 411")
    # A POST with a body is refused and the body is not taken for a second request.
    post = b"POST /metadata?key=k HTTP/1.1\r\nContent-Length: 22\r\n\r\nGET /health HTTP/1.1\r\n\r\n"
    reply = raw(post)
    assert reply.startswith(b"HTTP/1.1 405") and reply.count(b"HTTP/1.1") == 1
    assert request(server, "GET", key_path("k"))[0] == 404


def test_connection_cap():
    from mooncake.testing.listener_fuzz import Stalled, exchange

    with HttpMetadataServer("127.0.0.1", 0, max_connections=3) as s:
        addr = ("127.0.0.1", s.port)
        with Stalled(addr, b"", 3) as idle:
            time.sleep(0.2)
            assert exchange(addr, b"GET /health HTTP/1.1\r\n\r\n") == b""  # closed at once
            assert idle.closed_by_peer == 0
        time.sleep(0.2)
        assert exchange(addr, b"GET /health HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200")


def get_versioned(server, path):
    """(status, body, X-Mooncake-Metadata-Version as int or None) of a GET."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        version = resp.getheader("X-Mooncake-Metadata-Version")
        return resp.status, body, None if version is None else int(version)
    finally:
        conn.close()


def test_conditional_create_and_delete(server):
    """PUT ...&if_absent=1 creates only an absent key; DELETE ...&if_version=N removes only the entry whose
    version GET reported; both answer 412 and leave the key alone otherwise. Every response announces them."""
    path = key_path("mooncake/ram/c")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert set(resp.getheader("X-Mooncake-Metadata-Features").split(",")) == {"if_absent", "if_version"}
    assert resp.getheader("X-Mooncake-Metadata-Version") is None  # 404: no entry, no version
    assert request(server, "PUT", path + "&if_absent=1", b"first") == (200, b"metadata updated")
    assert request(server, "PUT", path + "&if_absent=1", b"second") == (412, b"metadata exists")
    status, body, version = get_versioned(server, path)
    assert (status, body) == (200, b"first") and version is not None
    assert get_versioned(server, path)[2] == version  # reads do not change it
    assert request(server, "DELETE", path + "&if_version=%d" % (version + 1)) == (412, b"metadata changed")
    assert request(server, "DELETE", path + "&if_version=%d" % (version - 1)) == (412, b"metadata changed")
    assert request(server, "GET", path) == (200, b"first")
    assert request(server, "DELETE", path + "&if_version=%d" % version) == (200, b"metadata deleted")
    assert request(server, "DELETE", path + "&if_version=%d" % version) == (404, b"metadata not found")
    # Without the parameters the old (Mooncake) behaviour is unchanged.
    assert request(server, "PUT", path, b"x") == (200, b"metadata updated")
    assert request(server, "PUT", path, b"y") == (200, b"metadata updated")
    assert request(server, "DELETE", path) == (200, b"metadata deleted")


def test_every_stored_put_gets_a_new_increasing_version(server):
    """Plain and create-if-absent PUTs each store a new version, across keys; an identical rpc_meta PUT (which
    stores nothing) and a refused one keep the entry's version."""
    a, b, rpc = key_path("mooncake/ram/a"), key_path("mooncake/ram/b"), key_path("mooncake/rpc_meta/v")
    versions = []
    for path, body in ((a, b"1"), (b, b"1"), (a, b"1"), (a, b"2")):
        assert request(server, "PUT", path, body)[0] == 200
        versions.append(get_versioned(server, path)[2])
    assert request(server, "PUT", rpc + "&if_absent=1", b"r")[0] == 200
    versions.append(get_versioned(server, rpc)[2])
    assert versions == sorted(set(versions)), versions
    assert request(server, "PUT", rpc, b"r") == (200, b"metadata unchanged")
    assert request(server, "PUT", rpc, b"s")[0] == 400
    assert request(server, "PUT", rpc + "&if_absent=1", b"s")[0] == 412
    assert get_versioned(server, rpc) == (200, b"r", versions[-1])


def test_versions_of_a_restarted_server_start_elsewhere():
    """Each server process starts its versions at a random 62-bit value: a client holding a version from the
    previous process cannot delete the entry the restarted one stores (deterministic-from-1 versions would
    collide at once)."""
    path = key_path("mooncake/rpc_meta/r")
    seen = []
    for _ in range(2):
        with HttpMetadataServer("127.0.0.1", 0) as s:
            assert request(s, "PUT", path, b"same")[0] == 200
            seen.append(get_versioned(s, path)[2])
    assert seen[0] != seen[1] and all(0 < v < 1 << 63 for v in seen), seen
    with HttpMetadataServer("127.0.0.1", 0) as s:
        assert request(s, "PUT", path, b"same")[0] == 200
        assert request(s, "DELETE", path + "&if_version=%d" % seen[0])[0] == 412


@pytest.mark.parametrize("bad", ["", "abc", "-1", "1.5", "%C2%B2", "1%26key%3Dother"])
def test_malformed_if_version_is_400_and_deletes_nothing(server, bad):
    path = key_path("mooncake/ram/m")
    assert request(server, "PUT", path, b"v")[0] == 200
    assert request(server, "DELETE", path + "&if_version=" + bad)[0] == 400
    assert request(server, "GET", path) == (200, b"v")


def test_racing_conditional_deletes_remove_only_the_entry_they_saw(server):
    """Two takeovers of one stale entry: each deletes only the version it read, so the first one's fresh claim
    survives the second one's delete, even when the fresh claim is the same body as the stale one (which a
    compare of values could not tell apart)."""
    path = key_path("mooncake/rpc_meta/n")
    assert request(server, "PUT", path, b"stale")[0] == 200
    stale = get_versioned(server, path)[2]  # both engines read this version
    assert request(server, "DELETE", path + "&if_version=%d" % stale)[0] == 200  # the first engine's delete
    assert request(server, "PUT", path + "&if_absent=1", b"stale")[0] == 200  # and claim, with the same body
    assert request(server, "DELETE", path + "&if_version=%d" % stale) == (412, b"metadata changed")  # late
    assert request(server, "PUT", path + "&if_absent=1", b"other")[0] == 412
    assert request(server, "GET", path) == (200, b"stale")
    assert get_versioned(server, path)[2] > stale
