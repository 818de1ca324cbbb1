"""Memory-cap properties of the whole agent against the simulated node (M1, M2).

1-4 slices with 1-2 processes each follow random step-wise memory traces that cross their caps;
kills take a random latency (up to longer than a period), and under the v1 freezer's rules a
frozen process dies only once thawed; a host service and a pod without an allocation record hold
large amounts of memory throughout. NVML faults (errors, or usage the
driver cannot report) are injected at random times in the second property.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pynvml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from enforcement.agent import AgentConfig
from enforcement.pacer import PacerParams
from enforcement.simgpu import GIB, MEMORY_UNKNOWN, Fault, SimProcess, Steps, Workload
from enforcement.simulate import HostProcess, PodSpec, Scenario, Simulation

PERIOD = 0.2
END = 8.0
COMBOS = [
    ("v100-25",),
    ("v100-50",),
    ("v100-100",),
    ("v100-50", "v100-50"),
    ("v100-50", "v100-25", "v100-25"),
    ("v100-25", "v100-25", "v100-25", "v100-25"),
]
CAP_GIB = {"v100-25": 8, "v100-50": 16, "v100-100": 32}
HOG = Workload(Steps.constant(0.2), Steps.constant(40 * GIB), queue_s=0.02)


@st.composite
def traces(draw: st.DrawFn, cap_gib: int, processes: int) -> Workload:
    """A step-wise memory trace around ``cap / processes`` that may cross the cap."""
    share = cap_gib * GIB / processes
    times = sorted(draw(st.sets(st.floats(0.1, END - 1.5), max_size=3)))
    levels = draw(st.lists(st.floats(0.2, 1.6), min_size=len(times) + 1, max_size=len(times) + 1))
    points = [(0.0, levels[0] * share)] + [(t, lv * share) for t, lv in zip(times, levels[1:], strict=True)]
    return Workload(Steps.constant(0.5), Steps.of(*points), queue_s=0.02)


@st.composite
def scenarios(draw: st.DrawFn, with_faults: bool) -> Scenario:
    combo = draw(st.sampled_from(COMBOS))
    pods = []
    for i, product in enumerate(combo):
        n = draw(st.integers(1, 2))
        pods.append(PodSpec(f"p{i}", product, 0, tuple(draw(traces(CAP_GIB[product], n)) for _ in range(n))))
    pods.append(PodSpec("no-record", "v100-25", 0, (HOG,), managed=False))
    faults: tuple[Fault, ...] = ()
    if with_faults:
        windows = draw(st.lists(st.tuples(st.floats(0.5, END - 1), st.floats(0.1, 1.5)), min_size=1, max_size=3))
        codes = st.sampled_from([pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN, MEMORY_UNKNOWN])
        faults = tuple(Fault(start, start + length, draw(codes)) for start, length in windows)
    return Scenario(
        tuple(pods),
        host=(HostProcess("dcgm-exporter", "/system.slice/dcgm-exporter.service", 0, HOG),),
        faults=faults,
        kill_latency_s=draw(st.sampled_from([0.0, 0.03, 0.1, 0.25])),
        kill_waits_for_thaw=draw(st.booleans()),  # the v1 freezer: a frozen process dies only once thawed
    )


def run(scenario: Scenario, root: Path) -> Simulation:
    config = AgentConfig("sim-node", memory_period_s=PERIOD, pacer=PacerParams(grace_s=1.0))
    sim = Simulation(scenario, root, config)
    sim.start()
    sim.run_until(END)
    return sim


def over_cap_episodes(sim: Simulation, name: str, cap: int) -> list[tuple[float, float]]:
    """(first tick over cap, first tick back at or under it) for each breach, from the ground truth."""
    tick, series, out, start = sim.node.tick_s, sim.node.containers[name].memory, [], None
    for i, used in enumerate(series):
        if used > cap and start is None:
            start = (i + 1) * tick
        elif used <= cap and start is not None:
            out.append((start, (i + 1) * tick))
            start = None
    if start is not None:
        out.append((start, len(series) * tick + tick))
    return out


def held(process: SimProcess, when: float) -> int:
    """What the process held at clock time ``when`` (its trace, whatever happened later)."""
    return int(process.workload.memory.at(when - process.born))


def check_kills(sim: Simulation) -> None:
    """M2: each kill hit the largest remaining process of a managed slice that was over its cap."""
    caps = {p.name: CAP_GIB[p.product] * GIB for p in sim.scenario.pods if p.managed and p.product}
    killed_before: set[int] = set()
    for kill in sim.node.kills:
        assert kill.container in caps, f"killed {kill.pid} in {kill.container}, which is not a managed slice"
        container = sim.node.containers[kill.container]
        i = sim.node.tick_index(kill.time)
        assert container.memory[i] > caps[kill.container], f"{kill.container} was not over its cap"
        when = sim.clock.now() - sim.now() + kill.time  # back to the clock's base
        alive = [p for p in container.processes if p.born <= when and (p.died is None or p.died >= when)]
        candidates = [p for p in alive if p.pid not in killed_before]
        victim = next(p for p in candidates if p.pid == kill.pid)
        assert held(victim, when) == max(held(p, when) for p in candidates)
        killed_before.add(kill.pid)
    assert sim.node.foreign_signals == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(with_faults=False))
def test_no_slice_stays_over_its_cap_longer_than_a_period(scenario: Scenario) -> None:
    """M1 + M2 without faults."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = run(scenario, Path(tmp))
        bound = PERIOD + scenario.kill_latency_s + 2 * sim.node.tick_s
        for pod in scenario.pods:
            if pod.managed and pod.product:
                for start, end in over_cap_episodes(sim, pod.name, CAP_GIB[pod.product] * GIB):
                    if end <= END:
                        assert end - start <= bound + 1e-6, f"{pod.name} over its cap {start:.2f}-{end:.2f} s"
        check_kills(sim)
        assert sim.node.containers["no-record"].processes[0].alive
        assert sim.node.containers["dcgm-exporter"].processes[0].alive
        assert len(sim.events.events) == len(sim.node.kills)


# A breach that starts in a fault and is killed at the watchdog tick where the fault ends (0.6 s):
# read off the clock's 1.7e9 s base, that kill's time is 0.5999999 s, inside the scenario's nominal
# [0.5, 0.6), though the simulated NVML (on the same base) had ended the fault at that tick.
FAULT_ENDS_ON_A_TICK = Scenario(
    (PodSpec("p0", "v100-25", 0, (Workload(Steps.constant(0.5), Steps.of((0.0, 4 * GIB), (0.45, 12 * GIB)),
                                           queue_s=0.02),)),
     PodSpec("no-record", "v100-25", 0, (HOG,), managed=False)),
    host=(HostProcess("dcgm-exporter", "/system.slice/dcgm-exporter.service", 0, HOG),),
    faults=(Fault(0.5, 0.5 + 0.1, pynvml.NVML_ERROR_GPU_IS_LOST),),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(with_faults=True))
@example(FAULT_ENDS_ON_A_TICK)
def test_missing_data_never_kills_and_watching_resumes(scenario: Scenario) -> None:
    """M2 with faults: no kill on an error or unknown reading; breaches end a period after the data returns."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = run(scenario, Path(tmp))
        windows = sorted(sim.fault_windows())  # as NVML applied them, on the clock kills are read from
        for kill in sim.node.kills:
            for f_start, f_end in windows:
                assert not f_start <= kill.time < f_end, f"killed at {kill.time} s during a fault [{f_start}, {f_end})"
        check_kills(sim)
        bound = PERIOD + scenario.kill_latency_s + 2 * sim.node.tick_s
        for pod in scenario.pods:
            if pod.managed and pod.product:
                for start, end in over_cap_episodes(sim, pod.name, CAP_GIB[pod.product] * GIB):
                    blind_until = start
                    for f_start, f_end in windows:
                        if f_start <= blind_until + PERIOD and f_end > blind_until:
                            blind_until = f_end  # the watchdog could not see this stretch
                    if end <= END:
                        assert end - blind_until <= bound + 1e-6, f"{pod.name} over cap {start:.2f}-{end:.2f} s"


@st.composite
def paced_breaches(draw: st.DrawFn) -> Scenario:
    """A paced slice (two busy processes beside a 50 % one: often frozen) that crosses its cap."""
    at = draw(st.floats(3.0, END - 1.5))
    leak = Workload(Steps.constant(1.0), Steps.of((0.0, 3 * GIB), (at, 6 * GIB)), queue_s=0.02)
    steady = Workload(Steps.constant(1.0), Steps.constant(3 * GIB), queue_s=0.02)
    busy = Workload(Steps.constant(1.0), Steps.constant(GIB), queue_s=0.02)
    return Scenario(
        (PodSpec("big", "v100-50", 0, (busy,)), PodSpec("leaky", "v100-25", 0, (leak, steady))),
        kill_latency_s=draw(st.sampled_from([0.0, 0.03])),
        kill_waits_for_thaw=True,
    )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(paced_breaches())
def test_a_slice_killed_while_frozen_frees_its_memory_within_the_bound(scenario: Scenario) -> None:
    """M1 under the v1 freezer's rules: the pod is thawed right after the kill, so its process can die."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = run(scenario, Path(tmp))
        assert sim.node.frozen_intervals("leaky"), "the slice was never paced"
        bound = PERIOD + scenario.kill_latency_s + 2 * sim.node.tick_s
        episodes = over_cap_episodes(sim, "leaky", 8 * GIB)
        assert episodes, "the slice never crossed its cap"
        for start, end in episodes:
            assert end - start <= bound + 1e-6, f"leaky over its cap {start:.2f}-{end:.2f} s"
        check_kills(sim)
