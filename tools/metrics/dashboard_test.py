"""Every metric the Grafana dashboard plots is exported by a running master, store client and Transfer Engine
(scraped from their /metrics after real puts and gets), and the dashboard JSON is well formed."""

import json
import os
import re
import socket
import urllib.request

import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.master.testing import MasterProcess

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mooncake_dashboard.json")
_METRIC = re.compile(r"\b((?:master|mooncake)_[a-zA-Z0-9_]+)\b")
# Sample names each family type may expose (text format 0.0.4 names counter families with their _total).
_SUFFIXES = {"counter": ("", "_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
             "gauge": ("",), "untyped": ("",), "unknown": ("",), "summary": ("_count", "_sum", "")}


def plotted_metrics() -> dict:
    """{metric name: [panel titles]} of every PromQL expression in the dashboard."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    out: dict = {}
    for panel in dash["panels"]:
        for target in panel["targets"]:
            for name in _METRIC.findall(target["expr"]):
                out.setdefault(name, []).append(panel["title"])
    return out


def exported(text: str) -> tuple[set, set]:
    """(sample names that could appear per the # TYPE lines, sample names that do appear)."""
    declared, present = set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            declared |= {family + s for s in _SUFFIXES.get(kind, ("",))}
        elif line and not line.startswith("#"):
            present.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return declared | present, present


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scraped():
    master = MasterProcess("--default_kv_lease_ttl=100")
    port = free_port()
    store = MooncakeDistributedStore()
    try:
        assert store.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                            "global_segment_size": "16MB", "local_buffer_size": "4MB", "protocol": "tcp",
                            "master_server_addr": master.address, "enable_client_http_server": True,
                            "client_http_port": port}) == 0
        assert store.put("dash/a", b"v" * 4096) == 0
        assert store.put_batch(["dash/b", "dash/c"], [b"x" * 10, b"y" * 10]) == 0
        assert store.get("dash/a") == b"v" * 4096 and store.get("dash/none") == b""
        assert store.get_batch(["dash/b"]) == [b"x" * 10]
        yield scrape(master.metrics_port) + scrape(port)
    finally:
        store.close()
        master.stop()


def test_dashboard_is_well_formed():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["uid"] and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}"


def test_every_plotted_metric_is_exported(scraped):
    possible, _ = exported(scraped)
    plotted = plotted_metrics()
    assert len(plotted) >= 30
    missing = {name: panels for name, panels in plotted.items() if name not in possible}
    assert not missing, f"plotted but not exported: {missing}"


def test_the_numbers_behind_the_dashboard_are_live(scraped):
    _, present = exported(scraped)
    for name in ("master_key_count", "master_allocated_bytes", "master_active_clients", "master_requests_total",
                 "mooncake_transfer_write_bytes", "mooncake_transfer_read_bytes", "mooncake_client_requests_total",
                 "mooncake_transfer_get_latency_bucket", "mooncake_transfer_batch_put_latency_bucket",
                 "mooncake_te_up"):
        assert name in present, name
    assert re.search(r"^master_key_count 3\.0$", scraped, re.M)
    assert re.search(r"^mooncake_transfer_write_bytes 4116\.0$", scraped, re.M)
