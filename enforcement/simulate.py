"""``gpuslice agent --simulate``: the whole agent against simulated GPUs, a fake /proc and cgroupfs.

:class:`Simulation` builds a node from a :class:`Scenario` (pods with products and simulated
processes, host processes, NVML faults, stalls of the agent's loop), wires the *real* agent to it
(PynvmlBackend over FakeNVML, the cgroup resolver over the fake /proc, the v2 freezer over the
fake cgroupfs, the pod index from an in-memory pod source) and steps both on one simulated clock;
the freeze ceiling (the ThawGuard's job in the real agent) is enforced every tick. The property tests
use the same harness, so the demo and the tests exercise exactly the same code.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from enforcement.agent import Agent, AgentConfig, HolderStatus
from enforcement.cgroups import CgroupResolver
from enforcement.clock import SimClock
from enforcement.events import RecordingEventSink
from enforcement.freezer import CgroupFreezer, FreezeController, FreezeJournal
from enforcement.nvml import PynvmlBackend
from enforcement.pacer import PacerParams, waterfill
from enforcement.pods import PodIndex
from enforcement.simgpu import GIB, FakeNVML, Fault, SimGPU, Steps, Workload
from enforcement.simhost import SimContainer, SimNode
from packing.products import Catalog, load_catalog

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class PodSpec:
    """A pod on the simulated node: its product, GPU, and the processes it starts (at ``start``)."""

    name: str
    product: str | None
    gpu: int = 0
    processes: tuple[Workload, ...] = ()
    start: float = 0.0
    managed: bool = True
    namespace: str = "default"
    restart_s: float | None = None  # a killed process is started afresh this long after (the container restarts)
    after_restart: Workload | None = None  # what the restarted process does (default: the same again)


@dataclass(frozen=True, slots=True)
class HostProcess:
    """A GPU process outside any pod (a host service): the agent must never touch it."""

    name: str
    cgroup: str
    gpu: int
    workload: Workload
    pre_frozen: bool = False


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything the simulated node holds. Fault times are seconds after the simulation starts."""

    pods: tuple[PodSpec, ...]
    gpus: int = 1
    host: tuple[HostProcess, ...] = ()
    faults: tuple[Fault, ...] = ()
    sample_window_s: float = 1 / 6
    sample_delay_s: float = 0.05
    sample_jitter_s: float = 0.02
    kill_latency_s: float = 0.0
    has_v3: bool = True
    kill_waits_for_thaw: bool = False  # a frozen process dies only once thawed (the v1 freezer)
    stalls: tuple[tuple[float, float], ...] = ()  # the agent's loop is stuck (not stepped); its ThawGuard runs


@dataclass
class Simulation:
    """A simulated node plus the real agent, stepped together on one simulated clock."""

    scenario: Scenario
    root: Path
    config: AgentConfig = field(default_factory=lambda: AgentConfig("sim-node"))
    catalog: Catalog = field(default_factory=load_catalog)
    seed: int = 0

    def __post_init__(self) -> None:
        sc = self.scenario
        self.clock = SimClock()
        self.gpus = [
            SimGPU(
                i,
                f"GPU-{i:08x}-5a1e-4c0f-9d00-{self.seed:012x}",
                sample_window_s=sc.sample_window_s,
                sample_delay_s=sc.sample_delay_s,
                sample_jitter_s=sc.sample_jitter_s,
            )
            for i in range(sc.gpus)
        ]
        self.node = SimNode(
            self.root,
            self.gpus,
            self.clock,
            self.config.node_name,
            sc.kill_latency_s,
            seed=self.seed,
            kill_waits_for_thaw=sc.kill_waits_for_thaw,
        )
        origin = self.clock.now()
        faults = tuple(Fault(origin + f.start, origin + f.end, f.code, f.call, f.gpu) for f in sc.faults)
        self.nvml = FakeNVML(self.gpus, self.clock, faults, has_v3=sc.has_v3)
        self.pending: list[tuple[float, SimContainer, Workload]] = []
        self.restarts: dict[str, tuple[float, Workload | None]] = {}
        self.restarted: set[int] = set()
        for pod in sc.pods:
            product = self.catalog.product(pod.product) if pod.product else None
            milli, mib = (product.milli, product.memory_mib) if product else (250, 8192)
            container = self.node.add_pod(
                pod.name,
                pod.product,
                milli,
                mib,
                [pod.gpu],
                namespace=pod.namespace,
                managed=pod.managed,
            )
            self.pending += [(pod.start, container, w) for w in pod.processes]
            if pod.restart_s is not None:
                self.restarts[pod.name] = (pod.restart_s, pod.after_restart)
        for host in sc.host:
            container = self.node.add_container(host.name, host.cgroup, host.gpu, pre_frozen=host.pre_frozen)
            self.pending.append((0.0, container, host.workload))
        self.events = RecordingEventSink()
        self.journal_path = self.root / "run" / "frozen.json"
        self.agent = self.new_agent()
        self._spawn_due()

    def new_agent(self) -> Agent:
        """A fresh agent process on this node (as after a crash-restart): own caches, same journal."""
        index = PodIndex(self.config.node_name)
        index.replace(self.node.pods)
        return Agent(
            self.config,
            PynvmlBackend(self.nvml).open(),
            CgroupResolver(self.node.proc_root),
            index,
            FreezeController(
                CgroupFreezer(self.node.cgroup_root),
                FreezeJournal(self.journal_path),
                ceiling_s=self.config.freeze_ceiling_s,
                clock=self.clock.monotonic,
            ),
            self.node,
            self.events,
            self.clock,
            self.node.cgroup_root,
        )

    def start(self) -> None:
        self.agent.start()
        self.node.sync_cgroups()

    def now(self) -> float:
        return self.node.now()

    def _spawn_due(self) -> None:
        now = self.node.now()
        for name, (delay, again) in self.restarts.items():
            container = self.node.containers[name]
            for p in container.processes:
                if p.died is not None and p.pid not in self.restarted:
                    self.restarted.add(p.pid)
                    self.pending.append((p.died - self.node.origin + delay, container, again or p.workload))
        due = [p for p in self.pending if p[0] <= now + _EPS]
        self.pending = [p for p in self.pending if p[0] > now + _EPS]
        for _, container, workload in due:
            self.node.spawn(container, workload)

    def run_until(self, t: float, every: float | None = None, on_report: Callable[[float], None] | None = None) -> None:
        """Advance to simulated second ``t``, stepping the agent whenever it is due."""
        next_report = (self.node.now() + every) if every else None
        while self.node.now() < t - _EPS:
            self.node.advance()
            self._spawn_due()
            now = self.node.now()
            stalled = any(a <= now < b for a, b in self.scenario.stalls)
            if not self.agent.stopped and not stalled and self.clock.now() >= self.agent.next_due() - 1e-6:
                self.agent.step(self.clock.now())
                self.node.sync_cgroups()
            if not self.agent.stopped and self.agent.enforce_ceiling():  # the ThawGuard's part, every tick
                self.node.sync_cgroups()
            if next_report is not None and on_report is not None and self.node.now() >= next_report - _EPS:
                on_report(self.node.now())
                next_report += every or 0.0

    def stop(self) -> None:
        self.agent.stop()
        self.node.sync_cgroups()

    # --- ground truth helpers --------------------------------------------------------------------
    def fault_windows(self) -> list[tuple[float, float]]:
        """Each NVML fault's ``[start, end)`` in simulated seconds, as the simulated NVML applies it.

        The clock runs on NVML's base (~1.7e9 s, where a double resolves 2.4e-7 s), so ticks and fault
        edges are both rounded there: the tick at a fault's end (0.6 s) reads back as 0.5999999 s,
        though NVML, comparing on the clock's base, has ended the fault at that very tick. Judge times
        read off the clock (kills) against these windows, not the scenario's nominal ones: both are
        exact differences from the origin, so the comparison is the one NVML made.
        """
        origin = self.node.origin
        return [(f.start - origin, f.end - origin) for f in self.nvml.faults]

    def weights(self, gpu: int) -> dict[str, float]:
        """Entitlements (fraction of a card) of the managed pods on ``gpu``."""
        out: dict[str, float] = {}
        for pod in self.scenario.pods:
            if pod.gpu == gpu and pod.managed and pod.product:
                out[pod.name] = self.catalog.product(pod.product).milli / 1000
        return out

    def expected_shares(self, gpu: int, t0: float, t1: float, step: float = 0.1) -> dict[str, float]:
        """The water-fill of the GPU by entitlement, capped by each pod's true demand, averaged over [t0, t1]."""
        weights = self.weights(gpu)
        total = {name: 0.0 for name in weights}
        n = max(1, round((t1 - t0) / step))
        for i in range(n):
            when = self.node.origin + t0 + (i + 0.5) * (t1 - t0) / n
            caps = {
                name: min(1.0, sum(p.demand_at(when) for p in self.node.containers[name].processes)) for name in weights
            }
            for name, share in waterfill(weights, caps).items():
                total[name] += share / n
        return total


# --- the demo ---------------------------------------------------------------------------------------
LAST_CHANGE_S = 23.0  # demo_scenario's last change: infer-c killed at ~21 s, restarted 2 s later
SUMMARY_WINDOW_S = 30.0  # the run's summary measures shares over its last 30 s


def settling_time(params: PacerParams) -> float:
    """How long the demo runs before its summary measures steady shares: the last change, the restarted
    container's grace, then the summary's window."""
    return LAST_CHANGE_S + params.grace_s + SUMMARY_WINDOW_S


def demo_scenario() -> Scenario:
    """Two cards. GPU 0: a 50 % and a 25 % trainer, and a 25 % inference pod that is light until
    t=12 s, then busy, and leaks memory past its 8 GiB cap at t=21 s (killed; its container restarts
    2 s later). GPU 1: a 25 % pod alone (it may use the whole card), next to a host exporter that
    holds memory and is never touched."""
    trainer = Workload(Steps.constant(1.0), Steps.constant(12 * GIB), queue_s=0.03)
    small = Workload(Steps.constant(1.0), Steps.constant(6 * GIB), queue_s=0.02)
    infer = Workload(Steps.of((0, 0.15), (12, 1.0)), Steps.of((0, 5 * GIB), (19, 7 * GIB), (21, 9 * GIB)), 0.02)
    solo = Workload(Steps.constant(1.0), Steps.constant(7 * GIB), queue_s=0.02)
    exporter = Workload(Steps.constant(0.0), Steps.constant(GIB // 2), queue_s=0.01)
    return Scenario(
        pods=(
            PodSpec("train-a", "v100-50", 0, (trainer,)),
            PodSpec("train-b", "v100-25", 0, (small,)),
            PodSpec("infer-c", "v100-25", 0, (infer,), restart_s=2.0, after_restart=small),
            PodSpec("solo-d", "v100-25", 1, (solo,)),
        ),
        gpus=2,
        host=(HostProcess("dcgm-exporter", "/system.slice/dcgm-exporter.service", 1, exporter),),
        kill_latency_s=0.05,
    )


def _pct(x: float | None) -> str:
    return "    -" if x is None else f"{100 * x:5.1f}%"


def print_table(sim: Simulation, now: float, window: float, out: TextIO) -> None:
    """The live per-slice table: memory against cap, share (true and as NVML measured) against target."""
    t0 = max(0.0, now - window)
    statuses = sim.agent.statuses()
    print(f"\nt={now:6.1f} s", file=out)
    header = f"  {'GPU':<4}{'POD':<18}{'PRODUCT':<9}{'MEMORY GiB':>14} {'SHARE':>7} {'NVML':>7} {'TARGET':>7}"
    print(header + f" {'FROZEN':>7} {'KILLS':>5}", file=out)
    by_pod = {s.holder.pod: s for s in statuses}
    for pod in sim.scenario.pods:
        c = sim.node.containers[pod.name]
        status: HolderStatus | None = by_pod.get(pod.name)
        used = c.memory[-1] if c.memory else 0
        cap = status.holder.cap_bytes if status else None
        mem = f"{used / GIB:5.1f} / {cap / GIB:4.1f}" if cap else f"{used / GIB:5.1f} /    -"
        true_share = sim.node.share(pod.name, t0, now)
        frozen = sum(max(0.0, min(b, now) - max(a, t0)) for a, b in sim.node.frozen_intervals(pod.name)) / window
        view = status.pacing if status else None
        target = view.target if view else None
        kills = status.kills if status else 0
        line = f"  {pod.gpu:<4}{pod.namespace + '/' + pod.name:<18}{pod.product or '-':<9}{mem:>14} "
        print(
            line + f"{_pct(true_share):>7} {_pct(view.measured if view else None):>7} {_pct(target):>7} "
            f"{_pct(frozen):>7} {kills:>5}",
            file=out,
        )
    for host in sim.scenario.host:
        c = sim.node.containers[host.name]
        print(
            f"  {host.gpu:<4}{host.name + ' (host)':<27}{(c.memory[-1] if c.memory else 0) / GIB:5.1f} /    -", file=out
        )


@dataclass(frozen=True, slots=True)
class Breach:
    """A memory breach of one container: first tick over cap, when the kill was sent, when it died."""

    pod: str
    over_at: float
    killed_at: float | None
    died_at: float | None


def breaches(sim: Simulation) -> list[Breach]:
    """Every stretch of ticks a managed container spent over its cap, matched with its kill."""
    out: list[Breach] = []
    tick = sim.node.tick_s
    for pod in sim.scenario.pods:
        if not pod.managed or not pod.product:
            continue
        cap = sim.catalog.product(pod.product).memory_mib << 20
        series = sim.node.containers[pod.name].memory
        i = 0
        while i < len(series):
            if series[i] > cap:
                start = (i + 1) * tick
                while i < len(series) and series[i] > cap:
                    i += 1
                kill = next((k for k in sim.node.kills if k.container == pod.name and k.time >= start - tick), None)
                out.append(Breach(pod.name, start, kill.time if kill else None, kill.died if kill else None))
            i += 1
    return out


def summary(sim: Simulation, window: float, out: TextIO) -> float:
    """Share error over the last ``window`` seconds and breach-to-kill times; returns the worst error."""
    now = sim.now()
    t0 = max(0.0, now - window)
    worst = 0.0
    print(f"\nshare over the last {now - t0:.0f} s (expected: entitlement water-filled by true demand)", file=out)
    for gpu in range(sim.scenario.gpus):
        expected = sim.expected_shares(gpu, t0, now)
        for name, want in expected.items():
            got = sim.node.share(name, t0, now)
            worst = max(worst, abs(got - want))
            print(
                f"  GPU {gpu} {name:<10} measured {_pct(got)}  expected {_pct(want)}  error {_pct(got - want)}",
                file=out,
            )
        print(f"  GPU {gpu} busy {_pct(sim.node.gpu_share_busy(gpu, t0, now))}", file=out)
    found = breaches(sim)
    print("memory breaches:" if found else "memory breaches: none", file=out)
    for b in found:
        if b.killed_at is None:
            print(f"  {b.pod}: over cap at {b.over_at:.2f} s, not killed", file=out)
        else:
            print(
                f"  {b.pod}: over cap at {b.over_at:.2f} s, killed at {b.killed_at:.2f} s "
                f"(+{b.killed_at - b.over_at:.2f} s), memory freed at {(b.died_at or b.killed_at):.2f} s "
                f"(breach lasted {(b.died_at or b.killed_at) - b.over_at:.2f} s)",
                file=out,
            )
    print(f"events: {len(sim.events.events)}; host processes touched: {len(sim.node.foreign_signals)}", file=out)
    return worst


def run_demo(
    duration: float | None,
    speed: float,
    report_every: float,
    params: PacerParams,
    memory_period_s: float,
    out: TextIO | None = None,
) -> int:
    """Run the demo scenario; with ``duration`` it ends by itself. ``speed`` 0 means as fast as possible."""
    import time

    out = out or sys.stdout

    config = AgentConfig("sim-node", memory_period_s=memory_period_s, pacer=params)
    settle_s = settling_time(params)
    if duration is not None and duration < settle_s:  # first, so that nobody reads the errors as steady
        print(f"note: {duration:g} s is too short for the shares to settle (about {settle_s:.0f} s: the last "
              f"change at {LAST_CHANGE_S:.0f} s, its grace, then the {SUMMARY_WINDOW_S:.0f} s the summary "
              f"measures), so the errors at the end are not steady ones; --duration {settle_s:.0f} or more shows "
              "them converged", file=out)
    with tempfile.TemporaryDirectory(prefix="gpuslice-sim-") as tmp:
        sim = Simulation(demo_scenario(), Path(tmp), config)
        sim.start()
        print(
            f"simulating {'forever' if duration is None else f'{duration:.0f} s'} on 2 simulated V100s "
            f"(memory period {memory_period_s} s, slot {params.slot_s} s, grace {params.grace_s} s)",
            file=out,
        )
        wall_start = time.monotonic()
        try:
            while duration is None or sim.now() < duration - _EPS:
                step_to = sim.now() + report_every
                if duration is not None:
                    step_to = min(step_to, duration)
                sim.run_until(step_to)
                print_table(sim, sim.now(), report_every, out)
                out.flush()
                if speed > 0:
                    time.sleep(max(0.0, sim.now() / speed - (time.monotonic() - wall_start)))
        except KeyboardInterrupt:
            print("\ninterrupted", file=out)
        sim.stop()
        summary(sim, min(SUMMARY_WINDOW_S, sim.now()), out)
        frozen_left = [c.name for c in sim.node.containers.values() if c.frozen and not c.name.startswith("dcgm")]
        print(f"after stop, frozen managed cgroups: {frozen_left or 'none'}", file=out)
    return 0
