"""Prometheus metrics of one extender: requests, latency per verb and phase, placements, failures, capacity, queue.

Each app gets its own ``CollectorRegistry`` (tests build many apps in one process). Capacity and
queue gauges are read from the state at scrape time (``ExtenderState.gauges``), so they can never
drift from the ledger or the queue. Garbage-collector pauses are counted process-wide
(``watch_gc``): a full collection stops every thread, so its length is part of every latency.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
# filter/prioritize/bind at 5 000 nodes sit in the low milliseconds; the tail matters up to httpTimeout (5 s)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SLOW_GC_S = 0.1  # a collection pause this long is logged


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
        enforced = GaugeMetricFamily("gpuslice_nodes_by_enforcement", "Nodes in the ledger by who enforces their "
                                     "slices: agent (it published the inventory) or none (known only by labels)",
                                     labels=["enforcement"])
        for enforcement, n in sorted(values.get("nodes_by_enforcement", {}).items()):
            enforced.add_metric([enforcement], n)
        yield enforced
        yield GaugeMetricFamily("gpuslice_gpus", "GPUs in the ledger", value=values["gpus"])
        yield GaugeMetricFamily("gpuslice_ready", "1 when the extender serves decisions",
                                value=1.0 if values.get("ready", True) else 0.0)
        phase = values.get("phase")
        if phase is not None:  # a policy that reads the load phase (gradient-fit): which rule places now
            churning, ratio = phase
            yield GaugeMetricFamily("gpuslice_placement_churning", "1 while departures keep pace with arrivals "
                                    "and the policy places by best fit, 0 while the cluster fills",
                                    value=1.0 if churning else 0.0)
            yield GaugeMetricFamily("gpuslice_placement_departure_ratio", "Decayed departures per decayed arrival "
                                    "(half-life 500 events); churning at 0.5 and above", value=ratio)
        yield GaugeMetricFamily("gpuslice_ledger_epoch", "When the ledger's current life began (ms since 1970): "
                                "a change means a restart or a rebuild", value=values.get("epoch", 0))


class ExtenderMetrics:
    """The extender's counters and histograms, in a registry of their own."""

    def __init__(self, gauges: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("gpuslice_extender_requests", "Extender requests by verb and HTTP code",
                                ["verb", "code"], registry=self.registry)
        self.latency = Histogram("gpuslice_extender_request_seconds", "Time per extender request, from its "
                                 "headers arriving to its reply (body transfer and queueing included)",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.phases = Histogram("gpuslice_extender_phase_seconds", "Time per phase of an extender request "
                                "(read, queued, parse, lock_wait, locked, binder, encode)", ["verb", "phase"],
                                buckets=LATENCY_BUCKETS, registry=self.registry)
        self.slow = Counter("gpuslice_extender_slow_requests", "Requests slower than the slow-request threshold "
                            "(each is logged with its phases)", ["verb"], registry=self.registry)
        self.placements = Counter("gpuslice_placements", "Slices bound, by product", ["product"],
                                  registry=self.registry)
        self.filter_failures = Counter("gpuslice_filter_node_failures",
                                       "Nodes a filter rejected, by reason code", ["reason"],
                                       registry=self.registry)
        self.bind_failures = Counter("gpuslice_bind_failures", "Binds refused or failed, by outcome code",
                                     ["reason"], registry=self.registry)
        self.reservations = Counter("gpuslice_reservations", "Reservations made by strict-mode filters",
                                    registry=self.registry)
        if gauges is not None:
            self.registry.register(_StateCollector(gauges))
        self.registry.register(_GC)
        self.registry.register(CONNECTIONS)

    def exposition(self) -> bytes:
        """The text exposition format for ``GET /metrics``."""
        return generate_latest(self.registry)


class _GcPauses(Collector):
    """Pauses of the garbage collector by generation, measured through ``gc.callbacks``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = 0.0
        self._counts = {g: [0] * (len(LATENCY_BUCKETS) + 1) for g in range(3)}
        self._sums = dict.fromkeys(range(3), 0.0)
        self._installed = False

    def install(self) -> None:
        """Start measuring (once per process)."""
        with self._lock:
            if not self._installed:
                gc.callbacks.append(self._callback)
                self._installed = True

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info.get("generation", 0)
        slot = next((i for i, b in enumerate(LATENCY_BUCKETS) if pause <= b), len(LATENCY_BUCKETS))
        self._counts[generation][slot] += 1  # the collector holds the GIL: no other thread runs now
        self._sums[generation] += pause
        if pause > SLOW_GC_S:
            log.warning("garbage collection of generation %d paused every thread for %.0f ms (%d objects collected)",
                        generation, pause * 1000, info.get("collected", 0))

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily("gpuslice_gc_pause_seconds", "Garbage-collector pauses by generation "
                                       "(every thread stops for them)", labels=["generation"])
        for generation in range(3):
            cumulative, buckets = 0, []
            for bound, n in zip((*LATENCY_BUCKETS, float("inf")), self._counts[generation], strict=True):
                cumulative += n
                buckets.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
            family.add_metric([str(generation)], buckets, self._sums[generation])
        yield family
        yield GaugeMetricFamily("gpuslice_gc_frozen_objects", "Objects moved out of the collector's reach "
                                "(gc.freeze) after the state was built", value=gc.get_freeze_count())


_GC = _GcPauses()


class _Connections(Collector):
    """Client connections the server accepted (one TLS handshake each): a client that does not keep its
    connections alive shows here as a count that grows with requests."""

    def __init__(self) -> None:
        self.accepted = 0  # bumped on the event loop only

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("gpuslice_extender_connections", "Client connections accepted",
                                  value=self.accepted)


CONNECTIONS = _Connections()


def watch_gc() -> None:
    """Measure garbage-collector pauses in this process from now on."""
    _GC.install()
