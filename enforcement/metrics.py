"""Prometheus metrics of the node agent, per slice holder and per node.

Per holder (labels ``namespace``, ``pod``, ``container``, ``gpu``): memory used and its cap,
measured compute share and the share it is steered to, seconds frozen, processes killed. Per
node: NVML errors, skipped memory checks (missing data), freeze/thaw failures, holders seen.
Series of holders that have left the node are removed, so the registry does not grow forever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from enforcement.agent import Agent, HolderStatus

_LABELS = ("namespace", "pod", "container", "gpu")


class AgentMetrics:
    """A registry of the agent's metrics, refreshed from ``Agent.statuses()`` by :meth:`update`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.memory_used = Gauge(
            "gpuslice_agent_memory_used_bytes", "GPU memory held by the slice's processes", _LABELS, registry=r
        )
        self.memory_cap = Gauge("gpuslice_agent_memory_cap_bytes", "GPU memory cap of the slice", _LABELS, registry=r)
        self.share = Gauge("gpuslice_agent_share_ratio", "Measured share of the GPU (last 10 s)", _LABELS, registry=r)
        self.target = Gauge(
            "gpuslice_agent_share_target_ratio", "Share the pacer steers the slice to", _LABELS, registry=r
        )
        self.entitlement = Gauge(
            "gpuslice_agent_entitlement_ratio", "The slice's compute entitlement", _LABELS, registry=r
        )
        self.frozen = Gauge(
            "gpuslice_agent_frozen_seconds", "Seconds the slice has spent frozen by the pacer", _LABELS, registry=r
        )
        self.kills = Gauge(
            "gpuslice_agent_slice_kills",
            "Processes of the slice killed for exceeding the memory cap",
            _LABELS,
            registry=r,
        )
        self.kills_total = Counter(
            "gpuslice_agent_kills_total", "Processes killed for exceeding a memory cap", registry=r
        )
        self.nvml_errors = Gauge("gpuslice_agent_nvml_errors", "NVML calls that failed since start", registry=r)
        self.skipped = Gauge(
            "gpuslice_agent_memory_checks_skipped", "Holder checks skipped on missing data", registry=r
        )
        self.freeze_errors = Gauge("gpuslice_agent_freeze_errors", "Freeze or thaw writes that failed", registry=r)
        self.off_slice = Gauge(
            "gpuslice_agent_off_slice_processes",
            "Managed pods' processes on GPUs their record does not name",
            registry=r,
        )
        self.holders = Gauge("gpuslice_agent_slice_holders", "Slice holders with processes on a GPU", registry=r)
        self.healthy = Gauge("gpuslice_agent_healthy", "1 while memory readings keep coming", registry=r)
        self._series: set[tuple[str, str, str, str]] = set()
        self._kills_seen = 0

    def update(self, agent: Agent, statuses: Iterable[HolderStatus] | None = None) -> None:
        """Refresh every metric from the agent's current state."""
        current: set[tuple[str, str, str, str]] = set()
        rows = list(agent.statuses() if statuses is None else statuses)
        for s in rows:
            labels = (s.holder.namespace, s.holder.pod, ",".join(s.containers), s.holder.gpu)
            current.add(labels)
            if s.memory_bytes is not None:
                self.memory_used.labels(*labels).set(s.memory_bytes)
            self.memory_cap.labels(*labels).set(s.holder.cap_bytes)
            self.entitlement.labels(*labels).set(s.holder.weight / 1000)
            self.kills.labels(*labels).set(s.kills)
            if s.pacing is not None:
                self.share.labels(*labels).set(s.pacing.measured)
                self.target.labels(*labels).set(s.pacing.target)
                self.frozen.labels(*labels).set(s.pacing.frozen_total_s)
        for labels in self._series - current:
            for gauge in (
                self.memory_used,
                self.memory_cap,
                self.share,
                self.target,
                self.entitlement,
                self.frozen,
                self.kills,
            ):
                with contextlib.suppress(KeyError):  # that gauge never had this series (no pacing view yet)
                    gauge.remove(*labels)
        self._series = current
        new_kills = len(agent.kills) - self._kills_seen
        if new_kills > 0:
            self.kills_total.inc(new_kills)
            self._kills_seen = len(agent.kills)
        self.nvml_errors.set(agent.nvml_errors)
        self.skipped.set(agent.watchdog.skipped_unknown)
        self.freeze_errors.set(agent.freezer.errors)
        self.off_slice.set(agent.attributor.off_slice)
        self.holders.set(len(rows))
        self.healthy.set(1 if agent.healthy()[0] else 0)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
