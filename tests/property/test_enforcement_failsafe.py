"""Fail-safe properties. F1: nothing managed stays frozen after stop, crash-restart or NVML failure,
and what is not ours (host cgroups, a cgroup someone else froze, pods without a record) is never touched.
F2: no freeze outlasts the ceiling, even while the control loop is stuck (the ThawGuard's job).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pynvml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enforcement.agent import AgentConfig
from enforcement.pacer import PacerParams
from enforcement.simgpu import GIB, Fault, Steps, Workload
from enforcement.simulate import HostProcess, PodSpec, Scenario, Simulation

PARAMS = PacerParams(grace_s=1.0, burst_s=0.5)
COMBOS = [
    ("v100-50", "v100-25"),
    ("v100-25", "v100-25"),
    ("v100-50", "v100-25", "v100-25"),
    ("v100-25", "v100-25", "v100-25", "v100-25"),
]
BUSY = Workload(Steps.constant(1.0), Steps.constant(GIB), queue_s=0.02)
LIGHT = Workload(Steps.constant(0.05), Steps.constant(GIB), queue_s=0.02)
FOREIGN = ("no-record", "paused", "exporter")


@st.composite
def cases(draw: st.DrawFn) -> tuple[Scenario, str, float]:
    combo = draw(st.sampled_from(COMBOS))
    event = draw(st.sampled_from(["stop", "crash", "nvml"]))
    at = draw(st.floats(5.0, 10.0))
    # The last slice runs two processes: native time-slicing over-serves it, so pacing engages.
    pods = [
        PodSpec(f"p{i}", product, 0, (BUSY,) * (2 if i == len(combo) - 1 else 1)) for i, product in enumerate(combo)
    ]
    pods.append(PodSpec("no-record", "v100-25", 0, (LIGHT,), managed=False))
    code = draw(st.sampled_from([pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN]))
    scenario = Scenario(
        tuple(pods),
        host=(
            HostProcess("paused", "/system.slice/paused-job.scope", 0, BUSY, pre_frozen=True),
            HostProcess("exporter", "/system.slice/dcgm-exporter.service", 0, LIGHT),
        ),
        faults=(Fault(at, at + 2.0, code),) if event == "nvml" else (),
        sample_window_s=draw(st.sampled_from([1 / 6, 1.0])),
    )
    return scenario, event, at


def managed_frozen(sim: Simulation) -> list[str]:
    return [p.name for p in sim.scenario.pods if p.managed and sim.node.containers[p.name].frozen]


def foreign_state(sim: Simulation) -> dict[str, tuple[str, int]]:
    out = {}
    for name in FOREIGN:
        f = sim.node.containers[name].directory / "cgroup.freeze"
        out[name] = (f.read_text(), f.stat().st_mtime_ns)
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_nothing_managed_stays_frozen_and_nothing_foreign_is_touched(case: tuple[Scenario, str, float]) -> None:
    scenario, event, at = case
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(scenario, Path(tmp), AgentConfig("sim-node", pacer=PARAMS))
        sim.start()
        before = foreign_state(sim)
        sim.run_until(at)
        assert any(sim.node.frozen_intervals(p.name) for p in scenario.pods if p.managed), "pacing never engaged"
        if event == "stop":
            sim.stop()
            assert managed_frozen(sim) == []
            assert sim.agent.freezer.journal.load() == []
        elif event == "crash":
            sim.agent = sim.new_agent()  # the old agent dies without thawing anything
            sim.start()
            assert managed_frozen(sim) == []
            sim.run_until(at + 3.0)  # and the successor paces on
            sim.stop()
            assert managed_frozen(sim) == []
        else:
            sim.run_until(at + 2.0)
            grace = PARAMS.slot_s + 2 * sim.node.tick_s  # the next slot notices the failure
            for pod in scenario.pods:
                if pod.managed:
                    for a, b in sim.node.frozen_intervals(pod.name):
                        assert b <= at + grace or a >= at + 2.0, (
                            f"{pod.name} frozen {a:.2f}-{b:.2f} s during the outage"
                        )
            sim.run_until(at + 4.0)
            sim.stop()
            assert managed_frozen(sim) == []
        assert foreign_state(sim) == before
        assert sim.node.containers["paused"].frozen  # someone else's freeze stays
        assert sim.node.frozen_intervals("no-record") == [] and sim.node.frozen_intervals("exporter") == []
        assert sim.node.kills == [] and sim.node.foreign_signals == []


@st.composite
def stalls(draw: st.DrawFn) -> Scenario:
    combo = draw(st.sampled_from(COMBOS))
    pods = [
        PodSpec(f"p{i}", product, 0, (BUSY,) * (2 if i == len(combo) - 1 else 1)) for i, product in enumerate(combo)
    ]
    windows = draw(st.lists(st.tuples(st.floats(3.0, 10.0), st.floats(0.05, 3.0)), min_size=1, max_size=3))
    return Scenario(
        tuple(pods),
        stalls=tuple((start, start + length) for start, length in windows),
        sample_window_s=draw(st.sampled_from([1 / 6, 1.0])),
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stalls())
def test_no_freeze_outlasts_the_ceiling_even_with_the_loop_stuck(scenario: Scenario) -> None:
    """F2: the loop is not stepped during the stalls (a hung call, say); freezes are still cut."""
    with tempfile.TemporaryDirectory() as tmp:
        config = AgentConfig("sim-node", pacer=PARAMS)
        sim = Simulation(scenario, Path(tmp), config)
        sim.start()
        sim.run_until(14.0)
        bound = config.freeze_ceiling_s + sim.node.tick_s + 1e-6
        longest = 0.0
        for pod in scenario.pods:
            for a, b in sim.node.frozen_intervals(pod.name):
                longest = max(longest, b - a)
                assert b - a <= bound, f"{pod.name} frozen {a:.2f}-{b:.2f} s (ceiling {config.freeze_ceiling_s} s)"
        assert any(sim.node.frozen_intervals(p.name) for p in scenario.pods), "pacing never engaged"
        sim.stop()
        assert managed_frozen(sim) == []
