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


def _dask(work: list[command_a.Workload], tasks: list[command_a.Task], workers: int) -> tuple[float, Any]:
    """(seconds for the sweep once the cluster is up, each worker's RSS in MiB afterwards)."""
    client = dask_sweep.client_for(workers, None)
    try:
        client.wait_for_workers(workers)
        started = time.perf_counter()
        dask_sweep.run(tasks, work, SETTINGS, lambda d, n: None, client=client)
        seconds = time.perf_counter() - started
        return seconds, dask_sweep.worker_rss_mib(client)
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()


def _processes(work: list[command_a.Workload], tasks: list[command_a.Task], processes: int) -> float:
    command_a._WORK[:] = work
    command_a._CONFIG.update(SETTINGS)
    started = time.perf_counter()
    command_a.execute(tasks, processes, lambda d, n: None)
    return time.perf_counter() - started


def main() -> None:
    source, work = _workloads(LISTS)
    tasks = _tasks(work)
    print(f"protocol A sweep: {len(work)} {source} pod lists x best-fit, first-fit x stable ties x seeds "
          f"{SEEDS[0]}-{SEEDS[-1]} = {len(tasks)} tasks; wall seconds of the sweep itself (clusters already up); "
          f"{os.cpu_count()} cores, shared with whatever else runs")
    one, _ = _dask(work, tasks, 1)
    two, rss = _dask(work, tasks, 2)
    procs = _processes(work, tasks, 2)
    serial = _processes(work, tasks, 1)
    print(f"  serial (in process)      {serial:7.1f} s")
    print(f"  --processes 2            {procs:7.1f} s   speed-up {serial / procs:4.2f}x over serial")
    print(f"  Dask, 1 worker           {one:7.1f} s")
    print(f"  Dask, 2 workers          {two:7.1f} s   speed-up 1 -> 2 workers {one / two:4.2f}x (goal >= 1.8x)")
    print(f"  Dask overhead per task against --processes 2: {(two - procs) / len(tasks) * 1000:+.0f} ms, "
          f"{100 * (two - procs) / procs:+.1f} % of the sweep (goal <= 5 %)")
    print(f"  Dask overhead per task, 1 worker against serial: {(one - serial) / len(tasks) * 1000:+.0f} ms, "
          f"{100 * (one - serial) / serial:+.1f} %")
    print(f"  worker RSS after the sweep with {len(work)} pod lists: "
          + ", ".join(f"{v:.0f} MiB" for v in rss.values()))
    if len(work) < 24 and source == "openb":
        _, every = _workloads(None)
        _, rss24 = _dask(every, [("run", 0, "best-fit", "stable", SEEDS[0])], 1)
        print(f"  a worker holding all {len(every)} openb pod lists (after one task): "
              + ", ".join(f"{v:.0f} MiB" for v in rss24.values()) + " (goal < 1024 MiB)")
