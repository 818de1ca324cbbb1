"""Prometheus metrics of the cluster side, registered in the app's own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ClusterMetrics:
    """Sync drift, frees, gate lifts, explanations written, leadership."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.drift = Counter("gpuslice_resync_drift", "Differences a full resync found between the API and "
                             "gpuslice's view (missed watch events, ledger repairs)", ["source"], registry=registry)
        self.resyncs = Counter("gpuslice_resyncs", "Full resyncs run", registry=registry)
        self.freed = Counter("gpuslice_freed", "Slices or queue places freed by a pod leaving", ["why"],
                             registry=registry)
        self.observed = Counter("gpuslice_observed_bound", "Bound pods taken into the ledger from the API",
                                ["outcome"], registry=registry)
        self.gate_lifts = Counter("gpuslice_gate_lifts", "Scheduling gates lifted (or pods nudged) after admission",
                                  ["how"], registry=registry)
        self.gate_failures = Counter("gpuslice_gate_lift_failures", "Gate lifts that failed (retried later)",
                                     registry=registry)
        self.admission_steps = Counter("gpuslice_admission_steps", "Queue admission steps run", registry=registry)
        self.step_seconds = Histogram("gpuslice_admission_step_seconds", "Time of one admission step (in-memory)",
                                      buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                                      registry=registry)
        self.notices = Counter("gpuslice_pending_notices", "Conditions and Events written for waiting pods",
                               ["kind"], registry=registry)
        self.groups_not_ready = Counter("gpuslice_pod_groups_not_ready", "Bound pod groups not all Running within "
                                        "the ready timeout: told (an Event), member evictions sent or failed",
                                        ["what"], registry=registry)
        self.entitlement_errors = Counter("gpuslice_entitlement_errors", "Entitlement values that could not be read",
                                          registry=registry)
        self.leader = Gauge("gpuslice_leader", "1 while this replica leads (owns the ledger)", registry=registry)
        self.sync_seconds = Gauge("gpuslice_last_rebuild_seconds", "Time the last rebuild from the API took",
                                  registry=registry)
