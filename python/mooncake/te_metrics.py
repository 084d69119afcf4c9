"""Prometheus metrics of a Transfer Engine, read from its ``get_stats()`` JSON at every scrape.

``EngineCollector(engine)`` registers into any ``prometheus_client`` registry (the store client's /metrics
does so for its engine); ``serve(engine, port)`` is the engine option: its own /metrics endpoint. Nothing is
counted between scrapes: each scrape asks the engine once (a few microseconds per peer).

Metrics (labels: ``transport`` = the get_stats() section, "tcp", "shm", "efa", ...; ``peer`` = the peer's
segment name; counters are totals since the engine started):

  mooncake_te_bytes_total{transport,peer}           bytes moved
  mooncake_te_slices_total{transport,peer}          slices completed
  mooncake_te_errors_total{transport,peer}          slices failed
  mooncake_te_retries_total{transport,peer}         slices moved to another path (tcp failovers)
  mooncake_te_paths{transport,peer,state}           paths (tcp: NIC pairs) per state ("up", "down", ...)
  mooncake_te_connected_lanes{transport,peer}       open data connections
  mooncake_te_listener_connections{listener}        open connections on the rpc / tcp data listener
  mooncake_te_listener_events_total{listener,event} accepted, served, evicted, refused, timed_out, stalled, malformed
  mooncake_te_notifications_queued                  notifications waiting for get_notifies()
  mooncake_te_notifications_dropped_total           notifications refused (queue full)
  mooncake_te_transfer_latency_seconds{transport,peer}  histogram of completed requests' latency (submit to
                                                    completion; the transport chosen at submit)
  mooncake_te_up                                    1 while the engine answers get_stats(), else 0

Threading: collect() may run on any thread; it only calls engine.get_stats(), which is thread-safe.
"""

from __future__ import annotations

import json
import logging

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

_log = logging.getLogger("mooncake.te_metrics")
_NOT_TRANSPORTS = ("listeners", "notifications", "latency")
_LISTENER_EVENTS = ("accepted", "served", "evicted", "refused", "timed_out", "stalled", "malformed")


def parse_stats(text: str) -> dict:
    """get_stats() JSON -> dict; {} for an empty or malformed document (an engine that is closed)."""
    try:
        stats = json.loads(text) if text else {}
    except ValueError:
        return {}
    return stats if isinstance(stats, dict) else {}


def per_peer(stats: dict) -> dict:
    """{(transport, peer): {"bytes", "slices", "errors", "retries", "lanes", "states": {state: n}}} summed over
    a peer's paths."""
    out: dict = {}
    for transport, entries in stats.items():
        if transport in _NOT_TRANSPORTS or not isinstance(entries, dict):
            continue
        for name, e in entries.items():
            if not isinstance(e, dict):
                continue
            agg = out.setdefault((transport, str(e.get("peer") or name)),
                                 {"bytes": 0, "slices": 0, "errors": 0, "retries": 0, "lanes": 0, "states": {}})
            for key, field in (("bytes", "bytes"), ("slices", "slices"), ("errors", "errors"),
                               ("retries", "failovers"), ("retries", "retries"), ("lanes", "connected_lanes")):
                value = e.get(field)
                if isinstance(value, (int, float)):
                    agg[key] += value
            state = e.get("state")
            if isinstance(state, str):
                agg["states"][state] = agg["states"].get(state, 0) + 1
    return out


class EngineCollector:
    """A prometheus_client collector over `engine` (anything with get_stats(); a callable returning the
    engine, or None while there is none, also works). It holds the engine: drop the collector to release it."""

    def __init__(self, engine) -> None:
        if hasattr(engine, "get_stats"):
            self._get = lambda: engine
        elif callable(engine):
            self._get = engine
        else:
            raise TypeError(f"EngineCollector needs a Transfer Engine or a callable returning one, got "
                            f"{type(engine).__name__}")

    def describe(self):
        return []  # registration must not call get_stats()

    def _stats(self) -> dict | None:
        engine = self._get()
        if engine is None:
            return None
        try:
            return parse_stats(engine.get_stats())
        except Exception as e:  # noqa: BLE001  (a closing engine may raise; a scrape must not fail)
            _log.debug("get_stats failed: %s", e)
            return None

    def collect(self):
        stats = self._stats()
        up = GaugeMetricFamily("mooncake_te_up", "1 while the Transfer Engine answers get_stats()")
        up.add_metric([], 1 if stats else 0)
        yield up
        if not stats:
            return
        labels = ["transport", "peer"]
        fams = {k: CounterMetricFamily(f"mooncake_te_{k}", doc, labels=labels) for k, doc in (
            ("bytes", "Bytes moved per transport and peer"), ("slices", "Slices completed per transport and peer"),
            ("errors", "Slices failed per transport and peer"),
            ("retries", "Slices moved to another path (tcp failovers) per transport and peer"))}
        lanes = GaugeMetricFamily("mooncake_te_connected_lanes", "Open data connections per peer", labels=labels)
        paths = GaugeMetricFamily("mooncake_te_paths", "Paths per peer and state", labels=labels + ["state"])
        for (transport, peer), agg in sorted(per_peer(stats).items()):
            for k, fam in fams.items():
                fam.add_metric([transport, peer], agg[k])
            lanes.add_metric([transport, peer], agg["lanes"])
            for state, n in sorted(agg["states"].items()):
                paths.add_metric([transport, peer, state], n)
        yield from fams.values()
        yield lanes
        yield paths
        listeners = stats.get("listeners") or {}
        conns = GaugeMetricFamily("mooncake_te_listener_connections", "Open connections per listener",
                                  labels=["listener"])
        events = CounterMetricFamily("mooncake_te_listener_events", "Listener events (accepted, evicted, ...)",
                                     labels=["listener", "event"])
        for name, ls in sorted(listeners.items()):
            if not isinstance(ls, dict):
                continue
            conns.add_metric([name], ls.get("open", 0))
            for event in _LISTENER_EVENTS:
                if isinstance(ls.get(event), (int, float)):
                    events.add_metric([name, event], ls[event])
        yield conns
        yield events
        notes = stats.get("notifications") or {}
        queued = GaugeMetricFamily("mooncake_te_notifications_queued", "Notifications waiting for get_notifies()")
        queued.add_metric([], notes.get("queued", 0))
        dropped = CounterMetricFamily("mooncake_te_notifications_dropped", "Notifications refused (queue full)")
        dropped.add_metric([], notes.get("dropped", 0))
        yield queued
        yield dropped
        yield latency_histograms(stats)


def latency_histograms(stats: dict) -> HistogramMetricFamily:
    """get_stats()["latency"] ({transport: {peer: {le_us, counts, sum_us}}}) as one Prometheus histogram."""
    fam = HistogramMetricFamily("mooncake_te_transfer_latency_seconds",
                                "Latency of completed transfer requests per transport and peer",
                                labels=["transport", "peer"])
    for transport, peers in sorted((stats.get("latency") or {}).items()):
        if not isinstance(peers, dict):
            continue
        for peer, h in sorted(peers.items()):
            if not isinstance(h, dict):
                continue
            bounds, counts = h.get("le_us"), h.get("counts")
            if not isinstance(bounds, list) or not isinstance(counts, list) or len(counts) != len(bounds) + 1:
                continue
            buckets, total = [], 0
            for le, n in zip(bounds + [float("inf")], counts):
                total += n
                buckets.append(("+Inf" if le == float("inf") else repr(le / 1e6), total))
            fam.add_metric([transport, str(peer)], buckets, float(h.get("sum_us", 0)) / 1e6)
    return fam


def serve(engine, port: int, host: str = "0.0.0.0"):
    """Serves /metrics of `engine` alone on host:port (0: any free port) from a daemon thread. Returns
    (server, thread) of prometheus_client.start_http_server; server.server_address[1] is the port, and
    server.shutdown() stops it. Raises OSError when the port cannot be bound."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    return start_http_server(port, addr=host, registry=registry)
