"""Cost of the node agent's control loop, measured side by side in one run (``make bench``).

* the pure pacer: one slot (decide + one measured window) for 2, 4 and 8 slice holders, against
  the cost of an empty slot (no holders) as the baseline;
* the whole agent against the simulated node: agent time per simulated second next to the
  simulator's own time, and simulated seconds per wall second of the demo scenario;
* one NVML reading through the deadline wrapper (``nvml.bounded``: a hand-off to a worker thread
  and back) against the same reading called directly.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from enforcement.agent import AgentConfig
from enforcement.clock import SimClock
from enforcement.nvml import PynvmlBackend, bounded
from enforcement.pacer import GpuPacer, Member, PacerParams
from enforcement.simgpu import GIB, FakeNVML, SimGPU, SimProcess, Steps, Workload
from enforcement.simulate import Simulation, demo_scenario

T0 = 1_700_000_000.0


def _pacer_slot_cost(holders: int, slots: int = 3000) -> float:
    """Seconds per slot of decide() + observe() with ``holders`` hungry holders."""
    params = PacerParams(grace_s=0.0)
    pacer: GpuPacer[int] = GpuPacer(params)
    members = {i: Member(1000 // max(holders, 1) or 125) for i in range(holders)}
    start = time.perf_counter()
    for n in range(slots):
        t = T0 + n * params.slot_s
        frozen = pacer.decide(t, members)
        running = [k for k in members if k not in frozen]
        pacer.observe(t, t + params.slot_s, {k: params.slot_s / max(len(running), 1) for k in running})
        pacer.observe_busy(t, 1.0)
    return (time.perf_counter() - start) / slots


def _agent_cost(seconds: float = 60.0) -> tuple[float, float, float]:
    """(agent wall s, simulator wall s, total wall s) for ``seconds`` of the demo scenario."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(demo_scenario(), Path(tmp), AgentConfig("sim-node", pacer=PacerParams(grace_s=5.0)))
        sim.start()
        agent_time = 0.0
        step = sim.agent.step

        def timed_step(now: float | None = None) -> None:
            nonlocal agent_time
            started = time.perf_counter()
            step(now)
            agent_time += time.perf_counter() - started

        sim.agent.step = timed_step  # type: ignore[method-assign]
        started = time.perf_counter()
        sim.run_until(seconds)
        total = time.perf_counter() - started
        sim.stop()
    return agent_time, total - agent_time, total


def _nvml_call_cost(calls: int = 3000) -> tuple[float, float]:
    """Seconds per process-memory reading (8 processes): direct, and through the deadline wrapper."""
    clock = SimClock()
    gpu = SimGPU(0, "GPU-bench")
    for pid in range(8):
        gpu.attach(SimProcess(1000 + pid, 0, clock.now(), Workload(Steps.constant(0.5), Steps.constant(GIB))))
    direct = PynvmlBackend(FakeNVML([gpu], clock)).open()
    wrapped = bounded(direct, 0.5)
    out = []
    for backend in (direct, wrapped):
        backend.process_memory("GPU-bench")  # the lane's thread is started outside the timing
        start = time.perf_counter()
        for _ in range(calls):
            backend.process_memory("GPU-bench")
        out.append((time.perf_counter() - start) / calls)
    return out[0], out[1]


def main() -> None:
    logging.getLogger("enforcement").setLevel(logging.ERROR)  # the demo's kill warning is not a figure
    baseline = _pacer_slot_cost(0)
    print(f"pacer slot, no holders (baseline): {baseline * 1e6:8.1f} us")
    for n in (2, 4, 8):
        cost = _pacer_slot_cost(n)
        print(f"pacer slot, {n} holders:           {cost * 1e6:8.1f} us  ({cost / baseline:5.1f}x baseline)")
    seconds = 60.0
    agent, simulator, total = _agent_cost(seconds)
    slots = seconds / PacerParams().slot_s
    print(f"demo scenario, {seconds:.0f} simulated s (2 GPUs, 4 slices, 1 host process):")
    per_slot = agent / slots
    print(f"  agent     {agent:6.2f} s wall = {per_slot * 1e3:6.2f} ms per slot ({per_slot / 0.1:.1%} of a core)")
    print(f"  simulator {simulator:6.2f} s wall  (agent/simulator = {agent / simulator:.2f})")
    print(f"  speed-up  {seconds / total:6.1f}x real time")
    direct, wrapped = _nvml_call_cost()
    print(
        f"NVML reading, direct {direct * 1e6:6.1f} us; with a deadline {wrapped * 1e6:6.1f} us "
        f"({wrapped / direct:.1f}x, +{(wrapped - direct) * 1e6:.0f} us per call)"
    )


if __name__ == "__main__":
    main()
