"""The node agent's loop: the memory watchdog every ``memory_period_s``, the pacer every slot.

One thread does both, driven by an injected clock, so the simulation and the tests step it by
hand (:meth:`Agent.step`) and the real agent sleeps between due times (:func:`run`). Fail-safe:

* at start, everything a previous run froze (the journal under the runtime directory) is thawed;
* when a GPU's NVML calls fail, its holders are thawed for the slot (compute fails open), while
  the watchdog keeps trying every period and kills nothing on missing data (memory fails safe);
* at stop (SIGTERM, SIGINT, ``atexit``), every cgroup the agent froze is thawed.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from enforcement.attribution import Attributor
from enforcement.cgroups import CgroupResolver, ContainerRef
from enforcement.clock import Clock
from enforcement.events import EventSink
from enforcement.freezer import FreezeController, FreezeTarget, target_for
from enforcement.killer import Killer
from enforcement.nvml import GpuDevice, NvmlBackend, NvmlError, UtilSample
from enforcement.pacer import GpuPacer, HolderView, Member, PacerParams
from enforcement.pods import PodIndex, SliceHolder
from enforcement.watchdog import GpuScan, Kill, MemoryWatchdog

log = logging.getLogger(__name__)

HolderKey = tuple[str, str]  # (pod uid, gpu uuid)
_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent's knobs; see README.md for what each one trades."""

    node_name: str
    memory_period_s: float = 0.2
    pacer: PacerParams = field(default_factory=PacerParams)
    pacing: bool = True
    unhealthy_after: int = 5  # consecutive failed scans before /healthz says so
    max_sample_window_s: float = 1.5  # a longer gap between NVML samples is idle time, not one window

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("the agent needs its node's name (--node-name or NODE_NAME)")
        if self.memory_period_s <= 0:
            raise ValueError(f"memory period must be positive, got {self.memory_period_s}")


@dataclass(slots=True)
class _GpuState:
    device: GpuDevice
    pacer: GpuPacer[HolderKey]
    members: dict[HolderKey, SliceHolder] = field(default_factory=dict)
    targets: dict[HolderKey, set[FreezeTarget]] = field(default_factory=dict)
    containers: dict[HolderKey, set[str]] = field(default_factory=dict)
    contexts: dict[HolderKey, int] = field(default_factory=dict)
    pid_holder: dict[int, HolderKey] = field(default_factory=dict)
    memory: dict[HolderKey, int | None] = field(default_factory=dict)
    since_us: int = 0
    last_stamp_us: int | None = None
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    failed_at: float | None = None
    frozen: frozenset[HolderKey] = frozenset()


@dataclass(frozen=True, slots=True)
class HolderStatus:
    """One slice holder as the agent sees it now (for metrics and the live table)."""

    holder: SliceHolder
    gpu_index: int
    containers: tuple[str, ...]
    memory_bytes: int | None
    pacing: HolderView | None
    kills: int


class Agent:
    """Wires NVML, attribution, the watchdog, the pacers and the freezer into one loop."""

    def __init__(
        self,
        config: AgentConfig,
        backend: NvmlBackend,
        resolver: CgroupResolver,
        index: PodIndex,
        freezer: FreezeController,
        killer: Killer,
        events: EventSink,
        clock: Clock,
        cgroup_root: Path,
    ) -> None:
        self.config = config
        self.backend = backend
        self.resolver = resolver
        self.index = index
        self.freezer = freezer
        self.clock = clock
        self.cgroup_root = cgroup_root
        self.attributor = Attributor(resolver, index)
        self.watchdog = MemoryWatchdog(backend, self.attributor.owner, killer, events, clock)
        self.gpus: dict[str, _GpuState] = {}
        self.kills: list[Kill] = []
        self.nvml_errors = 0
        self.failed_streak = 0
        self.recovered: list[FreezeTarget] = []
        self._next_watch = 0.0
        self._next_slot = 0.0
        self._targets: dict[str, FreezeTarget] = {}
        self._lock = threading.Lock()
        self.started = False
        self.stopped = False

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Thaw what a previous run left frozen, then enumerate the GPUs."""
        self.recovered = self.freezer.recover()
        if self.recovered:
            log.warning("thawed %d cgroup(s) left frozen by a previous run", len(self.recovered))
        for device in self.backend.devices():
            self.gpus[device.uuid] = _GpuState(device, GpuPacer(self.config.pacer))
        now = self.clock.now()
        self._next_watch = self._next_slot = now
        self.started = True

    def stop(self) -> None:
        """Thaw everything we froze and release NVML; safe to call more than once."""
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
            stuck = self.freezer.thaw_all()
            if stuck:
                log.error("could not thaw %s; they stay in the journal for the next start", sorted(stuck))
            self.backend.close()

    def next_due(self) -> float:
        """When :meth:`step` next has work to do."""
        return min(self._next_watch, self._next_slot) if self.config.pacing else self._next_watch

    def step(self, now: float | None = None) -> None:
        """Run whatever is due at ``now`` (the watchdog, then the pacer)."""
        now = self.clock.now() if now is None else now
        with self._lock:
            if self.stopped:
                return
            if now >= self._next_watch - _EPS:
                self._watch(now)
                self._next_watch = self._advance(self._next_watch, self.config.memory_period_s, now)
            if self.config.pacing and now >= self._next_slot - _EPS:
                self._pace(now)
                self._next_slot = self._advance(self._next_slot, self.config.pacer.slot_s, now)

    @staticmethod
    def _advance(due: float, period: float, now: float) -> float:
        due += period
        return due if due > now + _EPS else now + period  # fell behind: skip, do not burst to catch up

    # --- memory ----------------------------------------------------------------------------------
    def _watch(self, now: float) -> None:
        scans = self.watchdog.check(list(self.gpus))
        live: set[tuple[int, int]] = set()
        seen: set[str] = set()
        all_ok = True
        for scan in scans:
            state = self.gpus[scan.gpu]
            if not scan.ok:
                all_ok = False
                self.nvml_errors += 1
                state.failed_at = now
                log.warning("GPU %s: no memory reading this period (%s); nothing is killed", scan.gpu, scan.error)
                continue
            self._update_members(state, scan)
            for usage in scan.holders.values():
                live.update((o.pid, o.start_time) for o, _ in usage.processes)
                seen.update(o.container.container_id for o, _ in usage.processes)
            self.kills += scan.kills
        self.resolver.retain(live)
        if all_ok:
            self.failed_streak = 0
            # Every GPU was scanned: a cached target whose container is on none of them is dropped.
            self._targets = {cid: t for cid, t in self._targets.items() if cid in seen}
        else:
            self.failed_streak += 1

    def _update_members(self, state: _GpuState, scan: GpuScan) -> None:
        state.members = {key: usage.holder for key, usage in scan.holders.items()}
        state.memory = {key: usage.used_bytes for key, usage in scan.holders.items()}
        state.contexts = {key: len(usage.processes) for key, usage in scan.holders.items()}
        state.pid_holder = {o.pid: key for key, usage in scan.holders.items() for o, _ in usage.processes}
        state.targets, state.containers = {}, {}
        for key, usage in scan.holders.items():
            targets: set[FreezeTarget] = set()
            for owner, _ in usage.processes:
                target = self._target(owner.container)
                if target is not None:
                    targets.add(target)
            state.targets[key] = targets
            state.containers[key] = {o.container_name or o.container.container_id[:12] for o, _ in usage.processes}

    def _target(self, ref: ContainerRef) -> FreezeTarget | None:
        target = self._targets.get(ref.container_id)
        if target is None:
            target = target_for(ref, self.cgroup_root)
            if target is not None:  # not found yet may be a race with the runtime: look again next time
                self._targets[ref.container_id] = target
        return target

    # --- compute ---------------------------------------------------------------------------------
    def _pace(self, now: float) -> None:
        want: set[FreezeTarget] = set()
        period = self.config.pacer.period_s
        for uuid, state in self.gpus.items():
            members = {k: Member(h.weight, h.paced, state.contexts.get(k, 1)) for k, h in state.members.items()}
            failed = state.failed_at is not None and now - state.failed_at < period
            if not failed:
                try:
                    samples = self.backend.process_utilization(uuid, state.since_us)
                    busy = self.backend.gpu_utilization(uuid)
                except NvmlError as e:
                    self.nvml_errors += 1
                    state.failed_at, failed = now, True
                    log.warning("GPU %s: no utilisation samples (%s); its slices are thawed", uuid, e)
                else:
                    self._ingest(state, samples)
                    state.pacer.observe_busy(now, busy / 100.0)
            if failed:
                state.frozen = state.pacer.fail_open(now, members)
            else:
                state.frozen = state.pacer.decide(now, members)
            for key in state.frozen:
                want |= state.targets.get(key, set())
        self.freezer.apply(want)

    def _ingest(self, state: _GpuState, samples: list[UtilSample]) -> None:
        by_stamp: dict[int, list[UtilSample]] = {}
        for s in samples:
            if s.timestamp_us > state.since_us:
                by_stamp.setdefault(s.timestamp_us, []).append(s)
        for stamp in sorted(by_stamp):
            previous, state.last_stamp_us = state.last_stamp_us, stamp
            state.since_us = max(state.since_us, stamp)
            if previous is None:
                continue  # the first window's start is unknown: it only sets the baseline
            gap = (stamp - previous) / 1e6
            if gap <= self.config.max_sample_window_s:
                state.gaps.append(gap)
            if not state.gaps:
                continue
            # After idle time (no samples), the window is the driver's sampling period, not the gap.
            length = min(gap, 1.1 * statistics.median(state.gaps))
            used: dict[HolderKey, float] = {}
            busy = 0.0
            for s in by_stamp[stamp]:
                busy += s.sm_util / 100.0 * length
                key = self._holder_of(state, s.pid)
                if key is not None:
                    used[key] = used.get(key, 0.0) + s.sm_util / 100.0 * length
            end = stamp / 1e6
            state.pacer.observe(end - length, end, used, min(busy, length))

    def _holder_of(self, state: _GpuState, pid: int) -> HolderKey | None:
        key = state.pid_holder.get(pid)
        if key is None:  # a process newer than the last memory scan
            owner = self.attributor.owner(pid, state.device.uuid)
            key = owner.holder.key if owner is not None else None
        return key

    # --- reporting -------------------------------------------------------------------------------
    def healthy(self) -> tuple[bool, str]:
        """Healthy while memory readings keep coming (the watchdog is the part that must not stop)."""
        if not self.started or self.stopped:
            return False, "not running"
        if self.failed_streak >= self.config.unhealthy_after:
            return False, f"{self.failed_streak} memory scans in a row failed"
        return True, "ok"

    def statuses(self, now: float | None = None) -> list[HolderStatus]:
        """Every slice holder on every GPU, with its memory, pacing state and kills."""
        now = self.clock.now() if now is None else now
        out: list[HolderStatus] = []
        with self._lock:
            kills = Counter(kill.holder.key for kill in self.kills)
            for state in self.gpus.values():
                views = state.pacer.views(now)
                for key, holder in sorted(state.members.items(), key=lambda kv: kv[1].name):
                    out.append(
                        HolderStatus(
                            holder=holder,
                            gpu_index=state.device.index,
                            containers=tuple(sorted(state.containers.get(key, set()))),
                            memory_bytes=state.memory.get(key),
                            pacing=views.get(key),
                            kills=kills[key],
                        )
                    )
        return out


def run(agent: Agent, clock: Clock, stop: threading.Event, on_step: Callable[[], None] | None = None) -> None:
    """Step the agent on the real clock until ``stop`` is set; thaws everything on the way out."""
    try:
        while not stop.is_set():
            agent.step(clock.now())
            if on_step is not None:
                on_step()
            stop.wait(max(0.0, agent.next_due() - clock.now()))
    finally:
        agent.stop()
