"""The agent's liveness: progress, not error counts (against the simulated node)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pynvml

from enforcement.agent import AgentConfig
from enforcement.nvml import NvmlBackend
from enforcement.pacer import PacerParams
from enforcement.simgpu import Fault
from enforcement.simulate import Simulation, demo_scenario


def _sim(tmp_path: Path, faults: tuple[Fault, ...] = ()) -> Simulation:
    scenario = dataclasses.replace(demo_scenario(), faults=faults)
    sim = Simulation(scenario, tmp_path, AgentConfig("sim-node", pacer=PacerParams(grace_s=1.0)))
    sim.start()
    return sim


def test_health_fails_once_the_loop_stops_completing_steps(tmp_path: Path) -> None:
    sim = _sim(tmp_path)
    sim.run_until(3.0)
    assert sim.agent.healthy() == (True, "ok")
    sim.clock.advance(1.9)  # nobody steps the agent: a loop stuck somewhere
    assert sim.agent.healthy()[0] is True
    sim.clock.advance(0.2)
    ok, why = sim.agent.healthy()
    assert not ok and why.startswith("the control loop has not completed a step for 2.")


def test_a_gpu_answering_errors_is_named_but_does_not_fail_liveness(tmp_path: Path) -> None:
    sim = _sim(tmp_path, (Fault(1.0, 30.0, pynvml.NVML_ERROR_GPU_IS_LOST, gpu=1),))
    sim.run_until(6.0)
    ok, why = sim.agent.healthy()
    assert ok, why  # a restart would not bring GPU 1 back, and GPU 0 is still enforced
    assert "no memory reading from GPU-00000001" in why and "GPU is lost" in why
    sim.run_until(31.0)
    assert sim.agent.healthy() == (True, "ok")


class _Hanging:
    """The simulated backend, reporting one call stuck in the driver (as nvml.BoundedBackend does)."""

    def __init__(self, backend: NvmlBackend, stuck_s: float) -> None:
        self._backend = backend
        self.stuck_s = stuck_s

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)

    def hung(self) -> tuple[str, float] | None:
        return ("process_utilization on GPU-0", self.stuck_s) if self.stuck_s else None


def test_an_nvml_call_hung_past_the_stall_limit_fails_liveness(tmp_path: Path) -> None:
    sim = _sim(tmp_path)
    hanging = _Hanging(sim.agent.backend, 1.5)
    sim.agent.backend = hanging  # type: ignore[assignment]
    sim.run_until(2.0)
    assert sim.agent.healthy()[0] is True
    hanging.stuck_s = 2.5
    ok, why = sim.agent.healthy()
    assert not ok and why == "NVML call process_utilization on GPU-0 has not returned for 2.5 s"
    sim.stop()
