"""Transfer Engine metrics from get_stats(): per transport and peer, after real transfers."""

import re
import urllib.request

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mooncake import te_metrics
from mooncake.engine import TransferEngine


def value(text: str, sample: str) -> float:
    m = re.search(r"^" + re.escape(sample) + r" (\S+)$", text, re.M)
    assert m, f"{sample} not exported:\n{text}"
    return float(m.group(1))


@pytest.fixture
def tcp_pair(monkeypatch):
    monkeypatch.setenv("MC_FORCE_TCP", "1")  # the two engines share a host: force the tcp transport
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src, dst = np.arange(1 << 20, dtype=np.uint8), np.zeros(1 << 20, dtype=np.uint8)
    assert a.register_memory(src.ctypes.data, src.nbytes) == 0
    assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
    yield a, b, src, dst
    a.close()
    b.close()


def test_bytes_slices_and_paths_per_peer(tcp_pair):
    a, b, src, dst = tcp_pair
    peer = b.get_local_segment_name()
    remote = a.get_first_buffer_address(peer)
    for _ in range(3):
        assert a.transfer_sync_write(peer, src.ctypes.data, remote, 300_000) == 0
    assert np.array_equal(dst[:300_000], src[:300_000])
    registry = CollectorRegistry()
    registry.register(te_metrics.EngineCollector(a))
    text = generate_latest(registry).decode()
    labels = f'{{peer="{peer}",transport="tcp"}}'
    assert value(text, "mooncake_te_bytes_total" + labels) == 900_000
    assert value(text, "mooncake_te_slices_total" + labels) >= 3
    assert value(text, "mooncake_te_errors_total" + labels) == 0
    assert value(text, "mooncake_te_retries_total" + labels) == 0
    assert value(text, f'mooncake_te_paths{{peer="{peer}",state="up",transport="tcp"}}') >= 1
    assert value(text, 'mooncake_te_listener_connections{listener="tcp"}') >= 0
    assert value(text, "mooncake_te_up") == 1
    assert value(text, "mooncake_te_notifications_dropped_total") == 0
    count = value(text, "mooncake_te_transfer_latency_seconds_count" + labels)
    assert count == 3  # one per transfer_sync_write
    assert value(text, f'mooncake_te_transfer_latency_seconds_bucket{{le="+Inf",peer="{peer}",transport="tcp"}}') == 3
    assert 0 < value(text, "mooncake_te_transfer_latency_seconds_sum" + labels) < 30


def test_a_failed_peer_counts_nothing_and_a_closed_engine_is_down(tcp_pair):
    a, _, src, _ = tcp_pair
    assert a.transfer_sync_write("127.0.0.1:1", src.ctypes.data, 0, 4096) != 0
    collector = te_metrics.EngineCollector(lambda: None)
    assert [m.name for m in collector.collect()] == ["mooncake_te_up"]
    a.close()
    text = generate_latest(_registry(te_metrics.EngineCollector(a))).decode()
    assert "mooncake_te_up" in text  # a closed engine never fails the scrape


def _registry(collector):
    r = CollectorRegistry()
    r.register(collector)
    return r


def test_parse_and_aggregate():
    assert te_metrics.parse_stats("") == {} and te_metrics.parse_stats("[1]") == {}
    assert te_metrics.parse_stats("{bad") == {}
    stats = {"tcp": {"p via a -> b": {"peer": "p", "bytes": 5, "slices": 1, "errors": 1, "failovers": 2,
                                      "connected_lanes": 1, "state": "up"},
                     "p via c -> d": {"peer": "p", "bytes": 7, "slices": 2, "errors": 0, "failovers": 0,
                                      "connected_lanes": 0, "state": "down"}},
             "shm": {"q": {"bytes": 3, "slices": 1, "errors": 0, "state": "up"}},
             "listeners": {"rpc": {"open": 1}}, "notifications": {"queued": 0}}
    agg = te_metrics.per_peer(stats)
    assert agg[("tcp", "p")] == {"bytes": 12, "slices": 3, "errors": 1, "retries": 2, "lanes": 1,
                                 "states": {"up": 1, "down": 1}}
    assert agg[("shm", "q")]["bytes"] == 3 and set(agg) == {("tcp", "p"), ("shm", "q")}


def test_wrong_type_is_a_type_error():
    with pytest.raises(TypeError):
        te_metrics.EngineCollector(42)


def test_serve_as_an_engine_option(tcp_pair):
    a = tcp_pair[0]
    server, thread = te_metrics.serve(a, 0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10) as r:
            assert "mooncake_te_up 1.0" in r.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
