"""Sweeps on Dask against worker processes: the speed-up from 1 to 2 Dask workers, the per-task overhead
against ``--processes 2``, and the memory of a worker holding the 24 openb pod lists.

Side by side in one run, wall time (a sweep is wall time by nature), nothing asserted. The sweep is
protocol A on the ``openb`` pod lists found through ``$GPUSLICE_TRACES`` (``GPUSLICE_BENCH_LISTS``
of them, default 8; ``best-fit`` and ``first-fit`` under stable ties, ``GPUSLICE_BENCH_SEEDS``
seeds, default 2), else on synthetic workloads of the same shape. Every figure is from one run of
each setup on a shared machine: read them as that.

Goals (issue 31): speed-up 1 -> 2 workers >= 1.8x; Dask's per-task overhead against --processes
<= 5 %; memory per worker for the 24 pod lists < 1 GiB.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from packing.products import load_catalog
from simulations import command_a, dask_sweep, protocol_a
from simulations.cluster import card_model_for
from simulations.traces import read_openb_nodes, read_openb_pods
from tests.traces import openb_dir

LISTS = int(os.environ.get("GPUSLICE_BENCH_LISTS", "8"))
SEEDS = tuple(range(42, 42 + int(os.environ.get("GPUSLICE_BENCH_SEEDS", "2"))))
SETTINGS = {"rounding": "none", "scores": "exact", "inflation": protocol_a.DEFAULT_INFLATION}


def _workloads(count: int | None) -> tuple[str, list[command_a.Workload]]:
    catalog = load_catalog()
    folder = openb_dir()
    if folder is None:
        from simulations.cluster import card_nodes
        from simulations.synthetic import SyntheticSpec, generate
        from simulations.workload import job_request
        out = []
        for k in range(count or 24):
            reqs = [job_request(j, catalog, "slices") for j in generate(SyntheticSpec(cards=512, jobs=8000), k)]
            out.append(command_a.Workload(f"synthetic-{k}", card_nodes(512), reqs, card_model_for(catalog, "slices")))
        return "synthetic (set $GPUSLICE_TRACES for openb)", out
    nodes, _ = read_openb_nodes(folder / "openb_node_list_gpu_node.csv")
    files = sorted(folder.glob("openb_pod_list_*.csv"))[: count or None]
    card = card_model_for(catalog, "none")
    out = [command_a.Workload(f.name, nodes, protocol_a.pod_requests(read_openb_pods(f)[0], catalog, "none"), card)
           for f in files]
    return "openb", out


def _tasks(work: list[command_a.Workload]) -> list[command_a.Task]:
    return [("run", w, p, "stable", s) for w in range(len(work)) for p in ("best-fit", "first-fit") for s in SEEDS]


def _timed(run: Any) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    source, work = _workloads(LISTS)
    tasks = _tasks(work)
    rounds = int(os.environ.get("GPUSLICE_BENCH_ROUNDS", "3"))
    print(f"protocol A sweep: {len(work)} {source} pod lists x best-fit, first-fit x stable ties x seeds "
          f"{SEEDS[0]}-{SEEDS[-1]} = {len(tasks)} tasks; wall seconds of each sweep (the Dask clusters already up, "
          f"the workloads scattered in the timing), {rounds} rounds interleaved, medians; {os.cpu_count()} cores "
          "shared with other sessions' tests and benches on this machine: read the figures as that")
    clients = {n: dask_sweep.client_for(n, None) for n in (1, 2)}
    times: dict[str, list[float]] = {"dask-1": [], "dask-2": [], "processes-2": []}
    rss: dict[str, float] = {}
    try:
        for n, c in clients.items():
            c.wait_for_workers(n)
        command_a._WORK[:] = work
        command_a._CONFIG.update(SETTINGS)
        for _ in range(rounds):
            for n, c in clients.items():
                times[f"dask-{n}"].append(_timed(lambda c=c: dask_sweep.run(tasks, work, SETTINGS,
                                                                             lambda d, t: None, client=c)))
            times["processes-2"].append(_timed(lambda: command_a.execute(tasks, 2, lambda d, t: None)))
        rss = dask_sweep.worker_rss_mib(clients[2])
    finally:
        for c in clients.values():
            cluster = c.cluster
            c.close()
            cluster.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"  {k:<13} median {med[k]:7.1f} s   rounds: {', '.join(f'{x:.1f}' for x in v)}")
    print(f"  speed-up 1 -> 2 Dask workers: {med['dask-1'] / med['dask-2']:.2f}x (goal >= 1.8x)")
    over = med["dask-2"] - med["processes-2"]
    print(f"  Dask against --processes 2: {over / len(tasks) * 1000:+.0f} ms per task, "
          f"{100 * over / med['processes-2']:+.1f} % of the sweep (goal <= 5 %)")
    print(f"  worker RSS after the sweeps, {len(work)} pod lists scattered: "
          + ", ".join(f"{v:.0f} MiB" for v in rss.values()))
    _, every = _workloads(None)
    client = dask_sweep.client_for(1, None)
    try:
        dask_sweep.run([("run", 0, "best-fit", "stable", SEEDS[0])], every, SETTINGS, lambda d, t: None, client=client)
        held = dask_sweep.worker_rss_mib(client)
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()
    print(f"  a worker holding all {len(every)} {source} pod lists (scattered, after one task): "
          + ", ".join(f"{v:.0f} MiB" for v in held.values()) + " (goal < 1024 MiB)")
