"""Simulator speed: every policy's 10-seed protocol A run against a plain numpy FGD, sweeps over processes,
protocol B events/s and memory.

Everything is measured side by side in one run and printed; nothing is asserted. Times are CPU
seconds of this process (``time.process_time``: less disturbed by other load on a shared
machine than wall time), except the process sweep, which is wall time by nature. Protocol A
uses the ``openb`` ``default`` trace found through ``$GPUSLICE_TRACES`` (``tests/traces.py``),
else a synthetic cluster of the same shape. ``GPUSLICE_BENCH_SEEDS`` sets the seeds per policy
(default 10), ``GPUSLICE_BENCH_EVENTS`` protocol B's event count (default 1,000,000).

The target: each policy's 10-seed run within 1× the time of ``tests.bench.numpy_fgd`` (FGD as
arrays, every fitting node and card evaluated at once per pod) on the same workload.
"""

from __future__ import annotations

import os
import random
import resource
import statistics
import time

from packing.policies import POLICIES
from packing.products import Request, load_catalog
from simulations.cluster import CardModel, build_ledger, card_model_for, card_nodes
from simulations.command_a import Workload, execute
from simulations.engine import EngineConfig, simulate
from simulations.protocol_a import ProtocolAConfig, pod_requests, run_seed
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import NodeSpec, read_openb_nodes, read_openb_pods
from simulations.workload import job_request
from tests.bench import numpy_fgd
from tests.traces import openb_dir

SEEDS = tuple(range(42, 42 + int(os.environ.get("GPUSLICE_BENCH_SEEDS", "10"))))


def _protocol_a_inputs() -> tuple[str, list[NodeSpec], list[Request], CardModel]:
    catalog = load_catalog()
    folder = openb_dir()
    if folder is not None:
        nodes, _ = read_openb_nodes(folder / "openb_node_list_gpu_node.csv")
        pods, _ = read_openb_pods(folder / "openb_pod_list_default.csv")
        return "openb default", nodes, pod_requests(pods, catalog, "none"), card_model_for(catalog, "none")
    rng = random.Random(0)  # same shape: 1213 nodes, about 6200 GPUs, 8152 pods
    nodes = [NodeSpec(f"n{i}", rng.choice([96000, 104000, 64000]), 393216, rng.choice([8, 8, 2, 4]), "G")
             for i in range(1213)]
    requests = [Request(milli=rng.choice([230, 470, 810, 1000, 1000]), cpu_milli=rng.choice([3152, 8000, 11300]),
                        host_memory_mib=8192) for _ in range(8152)]
    return "synthetic openb-like (set $GPUSLICE_TRACES for openb)", nodes, requests, CardModel(None, 0)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def bench_protocol_a() -> None:
    label, nodes, requests, card = _protocol_a_inputs()
    print(f"protocol A on {label}: {len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, {len(requests)} pods "
          f"inflated to 130 %, seeds {SEEDS[0]}-{SEEDS[-1]}, CPU seconds for all seeds")
    started = time.process_time()
    numpy_results = [numpy_fgd.run(nodes, requests, s) for s in SEEDS]
    yardstick = time.process_time() - started
    print(f"  {'numpy FGD (yardstick)':<28} {yardstick:7.1f} s  "
          f"unallocated@100 {statistics.fmean(numpy_results):5.2f} %")
    cases = [(name, ProtocolAConfig(policy=name)) for name in POLICIES]
    cases.insert(2, ("best-fit (ledger index)", ProtocolAConfig(policy="best-fit", use_index=True)))
    for name, config in cases:
        started = time.process_time()
        runs = [run_seed(nodes, requests, card, config, seed=s) for s in SEEDS]
        seconds = time.process_time() - started
        print(f"  {name:<28} {seconds:7.1f} s  unallocated@100 "
              f"{statistics.fmean(r.unallocated_gpu_pct_at_100 for r in runs):5.2f} %  "
              f"ratio to numpy FGD {seconds / yardstick:5.2f}")


def bench_processes() -> None:
    """The same sweep (3 policies x 4 seeds) in 1 and in 2 worker processes: wall seconds and speed-up."""
    _, nodes, requests, card = _protocol_a_inputs()
    import simulations.command_a as command

    command._WORK[:] = [Workload("bench", nodes, requests, card)]
    command._CONFIG.update(rounding="none", scores="exact", inflation=1.3)
    tasks = [("run", 0, p, "stable", s) for p in ("gradient-fit", "best-fit", "fgd") for s in SEEDS[:4]]
    walls = {}
    for n in (1, 2):
        started = time.perf_counter()
        execute(tasks, n, lambda _d, _t: None)
        walls[n] = time.perf_counter() - started
    print(f"protocol A sweep of {len(tasks)} runs: {walls[1]:.1f} s in 1 process, {walls[2]:.1f} s in 2 "
          f"(speed-up {walls[1] / walls[2]:.2f}; {os.cpu_count()} cores, shared)")


def bench_protocol_b() -> None:
    events = int(os.environ.get("GPUSLICE_BENCH_EVENTS", "1000000"))
    jobs_n = events // 2  # each job arrives and departs
    catalog = load_catalog()
    before = _rss_mib()
    jobs = generate(SyntheticSpec(cards=64, rho=0.85, jobs=jobs_n), seed=1)
    requests = [job_request(j, catalog, "slices") for j in jobs]
    after_build = _rss_mib()
    ledger = build_ledger(card_nodes(64), card_model_for(catalog, "slices"), seed=1, track_host=False)
    started = time.perf_counter()
    config = EngineConfig()
    sim = simulate(ledger, jobs, requests, config, seed=1)
    wall = time.perf_counter() - started
    print(f"protocol B, built-in synthetic, 64 cards, ρ 0.85, {config.policy} + {config.admission}: "
          f"{sim.events} events in {wall:.1f} s = {sim.events / wall:,.0f} events/s")
    print(f"  peak RSS {_rss_mib():.0f} MiB (workload {after_build - before:.0f} MiB of it); "
          f"utilisation {sim.mean_allocated_pct:.1f} %")


def main() -> None:
    bench_protocol_a()
    bench_processes()
    bench_protocol_b()


if __name__ == "__main__":
    main()
