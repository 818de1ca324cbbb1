"""Prometheus metrics of one extender: requests, latency per verb, placements, failures, capacity, queue.

Each app gets its own ``CollectorRegistry`` (tests build many apps in one process). Capacity and
queue gauges are read from the state at scrape time, so they can never drift from the ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# filter/prioritize/bind at 5 000 nodes sit in the low milliseconds; the tail matters up to httpTimeout (5 s)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _StateCollector(Collector):
    """Gauges computed from the state's current view at scrape time."""

    def __init__(self, gauges: Callable[[], Mapping[str, Any]]) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        values = self._gauges()
        free = GaugeMetricFamily("gpuslice_free_slices", "Slices of each product that still fit now",
                                 labels=["product"])
        for product, n in sorted(values["free_slices"].items()):
            free.add_metric([product], n)
        yield free
        claims = GaugeMetricFamily("gpuslice_claims", "Claims by state: waiting, reserved, bound",
                                   labels=["state"])
        claims.add_metric(["waiting"], values["waiting"])
        claims.add_metric(["reserved"], values["reserved"])
        claims.add_metric(["bound"], values["committed"])
        yield claims
        yield GaugeMetricFamily("gpuslice_pending_claims", "Pods waiting for a slice", value=values["waiting"])
        yield GaugeMetricFamily("gpuslice_nodes", "Nodes with GPUs in the ledger", value=values["nodes"])
        yield GaugeMetricFamily("gpuslice_gpus", "GPUs in the ledger", value=values["gpus"])
        yield GaugeMetricFamily("gpuslice_ready", "1 when the extender serves decisions",
                                value=1.0 if values.get("ready", True) else 0.0)


class ExtenderMetrics:
    """The extender's counters and histograms, in a registry of their own."""

    def __init__(self, gauges: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("gpuslice_extender_requests", "Extender requests by verb and HTTP code",
                                ["verb", "code"], registry=self.registry)
        self.latency = Histogram("gpuslice_extender_request_seconds", "Server-side time per extender request",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.placements = Counter("gpuslice_placements", "Slices bound, by product", ["product"],
                                  registry=self.registry)
        self.filter_failures = Counter("gpuslice_filter_node_failures",
                                       "Nodes a filter rejected, by reason code", ["reason"],
                                       registry=self.registry)
        self.bind_failures = Counter("gpuslice_bind_failures", "Binds refused or failed", ["reason"],
                                     registry=self.registry)
        self.reservations = Counter("gpuslice_reservations", "Reservations made by strict-mode filters",
                                    registry=self.registry)
        if gauges is not None:
            self.registry.register(_StateCollector(gauges))

    def exposition(self) -> bytes:
        """The text exposition format for ``GET /metrics``."""
        return generate_latest(self.registry)
