"""Simulator speed: protocol A seconds per run by policy and lookup path, protocol B events/s and memory.

Everything is measured side by side in one run and printed; nothing is asserted. Protocol A uses
the ``openb`` ``default`` trace when it is next to the repository (``../shared/traces``) or in
``$GPUSLICE_OPENB_DIR``, else a synthetic cluster of the same shape. ``GPUSLICE_BENCH_EVENTS``
sets protocol B's event count (default 1,000,000).
"""

from __future__ import annotations

import os
import random
import resource
import time
from pathlib import Path

from packing.products import Request, load_catalog
from simulations import registry  # noqa: F401  (registers the simulator policies)
from simulations.cluster import CardModel, build_ledger, card_model_for, card_nodes
from simulations.engine import EngineConfig, simulate
from simulations.protocol_a import ProtocolAConfig, pod_requests, run_seed
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import NodeSpec, read_openb_nodes, read_openb_pods
from simulations.workload import job_request

OPENB = Path(os.environ.get("GPUSLICE_OPENB_DIR") or Path(__file__).resolve().parents[3] / "shared" / "traces"
             / "alibaba-openb")


def _protocol_a_inputs() -> tuple[str, list[NodeSpec], list[Request], CardModel]:
    catalog = load_catalog()
    nodes_csv, pods_csv = OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv"
    if nodes_csv.is_file() and pods_csv.is_file():
        nodes, _ = read_openb_nodes(nodes_csv)
        pods, _ = read_openb_pods(pods_csv)
        return "openb default", nodes, pod_requests(pods, catalog, "none"), card_model_for(catalog, "none")
    rng = random.Random(0)  # same shape: 1213 nodes, about 6200 GPUs, 8152 pods
    nodes = [NodeSpec(f"n{i}", rng.choice([96000, 104000, 64000]), 393216, rng.choice([8, 8, 2, 4]), "G")
             for i in range(1213)]
    requests = [Request(milli=rng.choice([230, 470, 810, 1000, 1000]), cpu_milli=rng.choice([3152, 8000, 11300]),
                        host_memory_mib=8192) for _ in range(8152)]
    return "synthetic openb-like", nodes, requests, CardModel(None, 0)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def bench_protocol_a() -> None:
    label, nodes, requests, card = _protocol_a_inputs()
    print(f"protocol A on {label}: {len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, {len(requests)} pods "
          "inflated to 130 %, seed 42")
    timings: dict[str, float] = {}
    cases = [("best-fit (key cache)", ProtocolAConfig(policy="best-fit")),
             ("best-fit (ledger index)", ProtocolAConfig(policy="best-fit", use_index=True)),
             ("go-best-fit", ProtocolAConfig(policy="go-best-fit")),
             ("random", ProtocolAConfig(policy="random")),
             ("fgd", ProtocolAConfig(policy="fgd")),
             ("frag-gradient", ProtocolAConfig(policy="frag-gradient"))]
    for name, config in cases:
        run = run_seed(nodes, requests, card, config, seed=42)
        timings[name] = run.seconds
        print(f"  {name:<26} {run.seconds:6.2f} s/run  {run.pods / run.seconds:8.0f} pods/s  "
              f"unallocated@100 {run.unallocated_gpu_pct_at_100:5.2f} %")
    base = timings["best-fit (key cache)"]
    for name, seconds in timings.items():
        print(f"  ratio {name} / best-fit (key cache): {seconds / base:5.2f}")


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
    sim = simulate(ledger, jobs, requests, EngineConfig(), seed=1)
    wall = time.perf_counter() - started
    print(f"protocol B, built-in synthetic, 64 cards, ρ 0.85, best-fit + aging-guard: {sim.events} events in "
          f"{wall:.1f} s = {sim.events / wall:,.0f} events/s")
    print(f"  peak RSS {_rss_mib():.0f} MiB (workload {after_build - before:.0f} MiB of it); "
          f"utilisation {sim.mean_allocated_pct:.1f} %")


def main() -> None:
    bench_protocol_a()
    bench_protocol_b()


if __name__ == "__main__":
    main()
