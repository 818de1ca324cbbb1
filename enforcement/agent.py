"""The node agent's loop: the memory watchdog every ``memory_period_s``, the pacer every slot.

One thread does both, driven by an injected clock, so the simulation and the tests step it by
hand (:meth:`Agent.step`) and the real agent sleeps between due times (:func:`run`). Fail-safe:

* at start, everything a previous run froze (the journal under the runtime directory) is thawed
  (``gpuslice agent`` does this before anything else, see ``cli.py``);
* when a GPU's NVML calls fail, its holders are thawed for the slot (compute fails open), while
  the watchdog keeps trying every period and kills nothing on missing data (memory fails safe);
* NVML calls are bounded (``nvml.bounded``), and a freeze never outlasts the controller's ceiling,
  cut by :class:`~enforcement.freezer.ThawGuard` on its own thread even if this loop is stuck;
* right after a kill, the pod is thawed and stays unfrozen until its killed process is gone (a
  task frozen by the v1 freezer cannot die, so its GPU memory would stay held);
* a container whose cgroup lies outside the agent's view (a private cgroup namespace) is not paced,
  and says so (log, metric);
* at stop (SIGTERM, SIGINT, ``atexit``), every cgroup the agent froze is thawed.

Liveness is progress: :meth:`Agent.healthy` fails once no step has completed for ``stall_s``, or an
NVML call has been running in the driver that long (a hung call, given up on by ``nvml.bounded``).
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from enforcement.attribution import Attributor, ProcessOwner
from enforcement.cgroups import CgroupResolver, ContainerRef
from enforcement.clock import Clock
from enforcement.events import EventSink
from enforcement.freezer import CgroupViewError, FreezeController, FreezeTarget, target_for
from enforcement.killer import Killer
from enforcement.nvml import GpuDevice, NvmlBackend, NvmlError, NvmlTimeout, ReportsHangs, UtilSample
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
    freeze_ceiling_s: float = 0.5  # no freeze outlasts this, even with the loop stuck (ThawGuard)
    stall_s: float = 2.0  # /healthz fails once no step has completed, or an NVML call has run, this long
    max_sample_window_s: float = 1.5  # a longer gap between NVML samples is idle time, not one window

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("the agent needs its node's name (--node-name or NODE_NAME)")
        if self.memory_period_s <= 0:
            raise ValueError(f"memory period must be positive, got {self.memory_period_s}")
        if not self.pacer.max_freeze_s < self.freeze_ceiling_s < 1.0:
            raise ValueError(
                f"the freeze ceiling ({self.freeze_ceiling_s} s) must exceed max_freeze_s "
                f"({self.pacer.max_freeze_s} s) and stay under 1 s (the default probe timeout)"
            )
        if self.stall_s <= self.memory_period_s:
            raise ValueError(f"the stall limit ({self.stall_s} s) must exceed the memory period")


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
        self.watchdog = MemoryWatchdog(backend, self.attributor.owner, killer, events, clock, self._after_kill)
        self.gpus: dict[str, _GpuState] = {}
        self.kills: list[Kill] = []
        self.nvml_errors = 0
        self.nvml_timeouts = 0
        self.recovered: list[FreezeTarget] = []
        self.unpaceable: dict[str, str] = {}  # container id -> why it cannot be paced (outside our cgroup view)
        self.unreadable: dict[str, str] = {}  # gpu uuid -> the error of its last failed memory scan
        self._stepped_at = 0.0  # clock.monotonic() when the last step completed
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
        self._stepped_at = self.clock.monotonic()
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
            try:
                self.backend.close()
            except NvmlError as e:  # a hung or lost driver: nothing left to release that we can reach
                log.warning("NVML shutdown failed: %s", e)
            self.resolver.close()

    def enforce_ceiling(self) -> list[FreezeTarget]:
        """Cut freezes at the ceiling now (what ThawGuard does on its thread; the simulation calls it)."""
        return self.freezer.expire()

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
            self._stepped_at = self.clock.monotonic()

    @staticmethod
    def _advance(due: float, period: float, now: float) -> float:
        due += period
        return due if due > now + _EPS else now + period  # fell behind: skip, do not burst to catch up

    # --- memory ----------------------------------------------------------------------------------
    def _watch(self, now: float) -> None:
        self.attributor.new_scan()
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
                self.unreadable[scan.gpu] = scan.error or "unknown error"
                if scan.timed_out:
                    self.nvml_timeouts += 1
                log.warning("GPU %s: no memory reading this period (%s); nothing is killed", scan.gpu, scan.error)
                continue
            self.unreadable.pop(scan.gpu, None)
            self._update_members(state, scan)
            for usage in scan.holders.values():
                live.update((o.pid, o.start_time) for o, _ in usage.processes)
                seen.update(o.container.container_id for o, _ in usage.processes)
            self.kills += scan.kills
        self.resolver.retain(live)
        if all_ok:
            # Every GPU was scanned: a cached target whose container is on none of them is dropped.
            self._targets = {cid: t for cid, t in self._targets.items() if cid in seen}
            self.unpaceable = {cid: why for cid, why in self.unpaceable.items() if cid in seen}

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
            if ref.container_id in self.unpaceable:
                return None
            try:
                target = target_for(ref, self.cgroup_root)
            except CgroupViewError as e:
                self.unpaceable[ref.container_id] = str(e)
                log.error("not pacing: %s", e)
                return None
            if target is not None:  # not found yet may be a race with the runtime: look again next time
                self._targets[ref.container_id] = target
        return target

    def _after_kill(self, owner: ProcessOwner) -> None:
        """Thaw the killed process's pod at once: frozen by the v1 freezer, it could not die."""
        targets: set[FreezeTarget] = set()
        state = self.gpus.get(owner.holder.gpu)
        if state is not None:
            targets |= state.targets.get(owner.holder.key, set())
        target = self._target(owner.container)
        if target is not None:
            targets.add(target)
        self.freezer.thaw(targets)

    def _dying(self) -> set[HolderKey]:
        """Holders with a killed process still listed: not frozen again until it is gone."""
        return {kill.holder.key for kill in self.watchdog.pending.values()}

    # --- compute ---------------------------------------------------------------------------------
    def _pace(self, now: float) -> None:
        want: set[FreezeTarget] = set()
        period = self.config.pacer.period_s
        dying = self._dying()
        for uuid, state in self.gpus.items():
            members = {k: Member(h.weight, h.paced, state.contexts.get(k, 1)) for k, h in state.members.items()}
            failed = state.failed_at is not None and now - state.failed_at < period
            if not failed:
                try:
                    samples = self.backend.process_utilization(uuid, state.since_us)
                    busy = self.backend.gpu_utilization(uuid)
                except NvmlError as e:
                    self.nvml_errors += 1
                    if isinstance(e, NvmlTimeout):
                        self.nvml_timeouts += 1
                    state.failed_at, failed = now, True
                    log.warning("GPU %s: no utilisation samples (%s); its slices are thawed", uuid, e)
                else:
                    self._ingest(state, samples)
                    state.pacer.observe_busy(now, busy / 100.0)
            if failed:
                state.frozen = state.pacer.fail_open(now, members)
            else:
                state.frozen = state.pacer.decide(now, members)
            for key in state.frozen - dying:
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
        """Healthy while the loop makes progress: steps complete, and no NVML call hangs in the driver.

        Called from the HTTP thread without the agent's lock (a step may be inside a slow NVML call).
        A GPU whose calls answer with errors is named in the text but does not fail the check:
        restarting the agent does not bring a lost GPU back, and the other GPUs stay enforced.
        """
        if not self.started or self.stopped:
            return False, "not running"
        stall = self.config.stall_s
        age = self.clock.monotonic() - self._stepped_at
        if age > stall:
            return False, f"the control loop has not completed a step for {age:.1f} s"
        hung = self.backend.hung() if isinstance(self.backend, ReportsHangs) else None
        if hung is not None and hung[1] > stall:
            return False, f"NVML call {hung[0]} has not returned for {hung[1]:.1f} s"
        unreadable = dict(self.unreadable)
        if unreadable:
            return True, "ok; no memory reading from " + "; ".join(f"{g}: {e}" for g, e in sorted(unreadable.items()))
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
