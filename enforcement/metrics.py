"""Prometheus metrics of the node agent, per slice holder and per node.

Per holder (labels ``namespace``, ``pod``, ``container``, ``gpu``): memory used and its cap,
measured compute share and the share it is steered to, seconds frozen, processes killed. Per
node: NVML errors and timeouts, skipped memory checks (missing data), freeze/thaw failures,
freezes cut by the ceiling, slots in which the pacer's work-conservation backstop thawed one
more, holders seen, processes on a GPU their pod holds no slice of,
containers that cannot be paced, health; whether the hand-off gives containers the in-container
limiter, and how many it handed without; the pods whose allocation record it refused, by reason.
Running totals are counters (``_total``); what is true
now is a gauge. Series of holders that have left the node are removed, so the registry does not
grow forever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from enforcement.agent import Agent, HolderStatus
from enforcement.limiter import LimiterMode
from packing.record import REFUSALS

if TYPE_CHECKING:
    from enforcement.handoff import Writer
    from enforcement.refusals import Refusals

_LABELS = ("namespace", "pod", "container", "gpu")
Labels = tuple[str, ...]


class _Totals:
    """Feeds the running totals the agent keeps into counters, which only ever go up by increments."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, Labels], float] = {}

    def set(self, counter: Counter, total: float, labels: Labels = ()) -> None:
        key = (id(counter), labels)
        last = self._last.get(key, 0.0)
        if total < last:  # the agent started this total afresh: so does the series
            counter.remove(*labels)
            last = 0.0
        series = counter.labels(*labels) if labels else counter  # exposed from 0, not from the first event
        if total > last:
            series.inc(total - last)
        self._last[key] = total

    def forget(self, counter: Counter, labels: Labels) -> None:
        self._last.pop((id(counter), labels), None)
        with contextlib.suppress(KeyError):  # that counter never had this series
            counter.remove(*labels)


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
        self.frozen = Counter(
            "gpuslice_agent_frozen_seconds_total", "Seconds the pacer has held the slice frozen", _LABELS, registry=r
        )
        self.kills = Counter(
            "gpuslice_agent_slice_kills_total",
            "Processes of the slice killed for exceeding the memory cap",
            _LABELS,
            registry=r,
        )
        self.kills_total = Counter(
            "gpuslice_agent_kills_total", "Processes killed for exceeding a memory cap", registry=r
        )
        self.nvml_errors = Counter("gpuslice_agent_nvml_errors_total", "NVML readings that failed", registry=r)
        self.nvml_timeouts = Counter(
            "gpuslice_agent_nvml_timeouts_total",
            "NVML readings given up on at their deadline (hung driver)",
            registry=r,
        )
        self.skipped = Counter(
            "gpuslice_agent_memory_checks_skipped_total", "Holder checks skipped on missing data", registry=r
        )
        self.freeze_errors = Counter(
            "gpuslice_agent_freeze_errors_total", "Freeze or thaw writes that failed", registry=r
        )
        self.backstop_slots = Counter(
            "gpuslice_agent_pacer_backstop_slots_total",
            "Slots in which the pacer thawed one slice more than its demand estimates asked (freezes idled the GPU)",
            registry=r,
        )
        self.ceiling_thaws = Counter(
            "gpuslice_agent_ceiling_thaws_total",
            "Freezes cut at the freeze ceiling because the control loop was late",
            registry=r,
        )
        self.off_slice = Gauge(
            "gpuslice_agent_off_slice_processes",
            "Processes of managed pods on a GPU their record does not name (last scan)",
            registry=r,
        )
        self.unpaceable = Gauge(
            "gpuslice_agent_unpaceable_containers",
            "GPU containers not paced because their cgroup lies outside the agent's view",
            registry=r,
        )
        self.holders = Gauge("gpuslice_agent_slice_holders", "Slice holders with processes on a GPU", registry=r)
        self.healthy = Gauge("gpuslice_agent_healthy", "1 while the control loop makes progress", registry=r)
        self.limiter_installed = Gauge(
            "gpuslice_agent_limiter_installed",
            "1 while every slice's container gets the in-container memory limiter of this mode (0: the watchdog alone)",
            ("mode",),
            registry=r,
        )
        self.without_limiter = Counter(
            "gpuslice_agent_handoffs_without_limiter_total",
            "Container hand-offs written without the in-container limiter (its files missing on the node)",
            registry=r,
        )
        self.refused = Counter(
            "gpuslice_agent_records_refused_total",
            "Allocation records the agent refused (the pod gets no card from any hand-off path), once per pod and "
            "record, by reason: other-pod (a copy, or forged), other-node, unreadable, not-asked (a product the pod "
            "does not ask for)",
            ("reason",),
            registry=r,
        )
        for reason in REFUSALS:
            self.refused.labels(reason)  # exposed from 0: a refusal is an increase, not a new series
        self._series: set[Labels] = set()
        self._totals = _Totals()

    def update(self, agent: Agent, statuses: Iterable[HolderStatus] | None = None) -> None:
        """Refresh every metric from the agent's current state."""
        current: set[Labels] = set()
        rows = list(agent.statuses() if statuses is None else statuses)
        t = self._totals
        for s in rows:
            labels: Labels = (s.holder.namespace, s.holder.pod, ",".join(s.containers), s.holder.gpu)
            current.add(labels)
            if s.memory_bytes is not None:
                self.memory_used.labels(*labels).set(s.memory_bytes)
            self.memory_cap.labels(*labels).set(s.holder.cap_bytes)
            self.entitlement.labels(*labels).set(s.holder.weight / 1000)
            t.set(self.kills, s.kills, labels)
            if s.pacing is not None:
                self.share.labels(*labels).set(s.pacing.measured)
                self.target.labels(*labels).set(s.pacing.target)
                t.set(self.frozen, s.pacing.frozen_total_s, labels)
        for labels in self._series - current:
            for gauge in (self.memory_used, self.memory_cap, self.share, self.target, self.entitlement):
                with contextlib.suppress(KeyError):  # that gauge never had this series (no pacing view yet)
                    gauge.remove(*labels)
            t.forget(self.kills, labels)
            t.forget(self.frozen, labels)
        self._series = current
        t.set(self.kills_total, len(agent.kills))
        t.set(self.nvml_errors, agent.nvml_errors)
        t.set(self.nvml_timeouts, agent.nvml_timeouts)
        t.set(self.skipped, agent.watchdog.skipped_unknown)
        t.set(self.freeze_errors, agent.freezer.errors)
        t.set(self.ceiling_thaws, agent.freezer.ceiling_thaws)
        t.set(self.backstop_slots, sum(state.pacer.backstop_slots for state in agent.gpus.values()))
        self.off_slice.set(len(agent.attributor.off_slice))
        self.unpaceable.set(len(agent.unpaceable))
        self.holders.set(len(rows))
        self.healthy.set(1 if agent.healthy()[0] else 0)

    def update_handoff(self, writer: Writer) -> None:
        """Refresh the hand-off's metrics (the node side's container edits)."""
        limiter = writer.config.limiter
        if limiter is None:
            return
        on = limiter.mode is not LimiterMode.OFF and not writer.limiter_missing()
        self.limiter_installed.labels(limiter.mode.value).set(1 if on else 0)
        self._totals.set(self.without_limiter, writer.without_limiter)

    def update_refusals(self, refusals: Refusals) -> None:
        """Refresh the count of refused records (every reason exposed, from 0)."""
        for reason, count in refusals.totals().items():
            self._totals.set(self.refused, count, (reason,))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
