"""The master's /status page in a real headless Chromium: it renders, shows the live numbers of a running
master and store client, and updates after a put without a reload. A screenshot is kept as a test artifact
(TEST_UNDECLARED_OUTPUTS_DIR). The JSON stays at /status.json and at /status for non-browser clients."""

import json
import os
import re
import urllib.request

import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.master.testing import MasterProcess
from mooncake.tools.metrics.chromium import Chromium

needs_chromium = pytest.mark.skipif(Chromium.find() is None,
                                    reason="no chromium on PATH: install the Debian package `chromium` "
                                           "(ci/apt-packages.txt) to run the browser test")


@pytest.fixture(scope="module")
def cluster():
    master = MasterProcess("--default_kv_lease_ttl=100")
    store = MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", "32MB", "4MB", "tcp", "", master.address) == 0
        yield master, store
    finally:
        store.close()
        master.stop()


def get(port: int, path: str, accept: str | None = None) -> tuple[str, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers.get("Content-Type"), r.read().decode()


def test_json_for_scripts_html_for_browsers(cluster):
    master, store = cluster
    assert store.put("json/a", b"x" * 100) == 0
    assert store.get("json/none") == b""
    for path, accept in (("/status", None), ("/status", "*/*"), ("/status", "application/json"),
                         ("/status.json", "text/html")):
        kind, body = get(master.metrics_port, path, accept)
        doc = json.loads(body)
        assert kind.startswith("application/json"), (path, accept)
        assert doc["role"] == "single" and doc["objects"] >= 1 and len(doc["segments"]) == 1
        assert doc["misses"] >= 1 and doc["gets"] >= doc["misses"]
        assert doc["clients_detail"][0]["alive"] is True
        assert doc["clients_detail"][0]["segments"] == [doc["segments"][0]["name"]]
    kind, body = get(master.metrics_port, "/status", "text/html,application/xhtml+xml;q=0.9")
    assert kind.startswith("text/html") and "<title>Mooncake master</title>" in body
    assert "const REFRESH_MS = 2000;" in body
    assert "const REFRESH_MS = 500;" in get(master.metrics_port, "/status?refresh=0.5", "text/html")[1]
    assert store.remove("json/a") == 0


@needs_chromium
def test_page_renders_live_numbers_and_updates_after_a_put(cluster):
    master, store = cluster
    url = f"http://127.0.0.1:{master.metrics_port}/status?refresh=0.3"
    before = json.loads(get(master.metrics_port, "/status.json")[1])["objects"]
    browser = Chromium(url)
    try:
        browser.wait_for("document.getElementById('keys').textContent !== '-'")
        assert browser.evaluate("document.getElementById('role').textContent") == "single"
        assert browser.evaluate("document.getElementById('keys').textContent") == str(before)
        assert browser.evaluate("document.getElementById('clients').textContent") == "1"
        segment = browser.evaluate("document.querySelector('#segments tr td').textContent")
        assert segment == store.get_hostname()
        assert re.fullmatch(r"[\d.]+ %", browser.evaluate("document.getElementById('used').textContent"))
        for i in range(3):
            assert store.put(f"page/{i}", b"v" * (1 << 20)) == 0
        assert store.get("page/missing") == b""
        keys = browser.wait_for(f"document.getElementById('keys').textContent === '{before + 3}' && "
                                "document.getElementById('keys').textContent")
        assert keys == str(before + 3)  # the page updated itself: no reload happened
        assert browser.evaluate("performance.getEntriesByType('navigation').length") == 1
        assert "misses" in browser.evaluate("document.getElementById('hits').textContent")
        ops = browser.evaluate("[...document.querySelectorAll('#ops tr td:first-child')].map(t => t.textContent)")
        assert any(op.startswith("put") for op in ops) and "get_replica_list" in ops
        png = browser.screenshot()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
        out = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
        if out:
            with open(os.path.join(out, "master_status_page.png"), "wb") as f:
                f.write(png)
    finally:
        browser.close()
        for i in range(3):
            store.remove(f"page/{i}")
