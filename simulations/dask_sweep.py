"""Protocol A sweeps on Dask (``distributed``): ``--workers N`` (a ``LocalCluster``) or ``--scheduler ADDR``.

Each (workload, policy, tie rule, seed) run is one task (``command_a.run_task``). The workloads
(node lists and pod requests, the bulk of what a task reads) are scattered once, broadcast to
every worker, so a task carries only its few words of settings; a worker that joins later fetches
a workload once, when its first task needs it. Results stream back as they finish
(``as_completed``) and move the progress bar. A worker lost mid-sweep costs only the tasks it was
running: the scheduler runs them again elsewhere (up to Dask's ``allowed-failures``). Scattered
data has no recipe: on a scheduler whose memory manager trims a broadcast back to one replica
(``--scheduler``'s default; the local cluster turns it off), or when every holder is lost, a
workload's last copy can go with a worker; the scheduler then cancels its tasks, and the sweep
scatters that workload again and resubmits them (at most ``RESUBMITS`` times each).
Ctrl-C cancels every task not yet done, then closes the client (and the cluster it started).

Results come back in task order and equal the serial ones (each run is deterministic in its
seed). ``--processes N`` stays the path that needs no extra dependency.

Running the workers on your own Kubernetes: the Dask Kubernetes operator (``dask-kubernetes``,
``kubectl apply`` of a ``DaskCluster`` whose worker image has ``pip install 'gpuslice[sweep]'``),
then ``--scheduler tcp://<cluster>-scheduler.<namespace>:8786`` (simulations/README.md, *Sweeps on
Dask*).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from simulations.options import UsageError

Progress = Callable[[int, int], None]
RESUBMITS = 3  # a task cancelled for lost data is sent again this often before the sweep gives up


def client_for(workers: int | None, scheduler: str | None) -> Any:
    """A Dask client: on the scheduler at ``scheduler``, or on a new LocalCluster of ``workers`` processes."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise UsageError("--workers and --scheduler run on Dask: pip install 'gpuslice[sweep]' "
                         "(or use --processes N)") from None
    if workers is not None and scheduler:
        raise UsageError("give --workers (a local Dask cluster) or --scheduler (an existing one), not both")
    if scheduler:
        try:
            return Client(scheduler, timeout="20s")  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError) as e:
            raise UsageError(f"--scheduler {scheduler}: no Dask scheduler answers there ({e})") from None
    import dask

    # the memory manager would trim each broadcast workload back to one copy: workers then fetch it
    # again, and a lost worker takes the last copy with it
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        cluster = LocalCluster(n_workers=workers or 1, threads_per_worker=1, processes=True,  # type: ignore[no-untyped-call]
                               dashboard_address=":0", silence_logs=40, memory_limit=0)  # any free port: never 8787
    return Client(cluster)  # type: ignore[no-untyped-call]


def run(tasks: Sequence[Any], workloads: Sequence[Any], settings: dict[str, Any], progress: Progress,
        workers: int | None = None, scheduler: str | None = None, client: Any = None) -> list[Any]:
    """Every task's result in task order (``task[1]`` indexes ``workloads``); see the module docstring."""
    from distributed import as_completed
    from distributed.client import FutureCancelledError

    from simulations.command_a import run_task

    own = client is None
    client = client if client is not None else client_for(workers, scheduler)
    futures: list[Any] = []
    try:
        shared = client.scatter(list(workloads), broadcast=True, hash=False)  # once per worker, not per task
        futures = [client.submit(run_task, task, shared[task[1]], settings, pure=False) for task in tasks]
        index = {f.key: i for i, f in enumerate(futures)}
        tries = [0] * len(futures)
        results: list[Any] = [None] * len(futures)
        done = 0
        pending = as_completed(futures)  # type: ignore[no-untyped-call]
        for future in pending:
            i = index.pop(future.key)
            try:
                results[i] = future.result()
            except FutureCancelledError:  # its workload's last copy went with a lost worker
                tries[i] += 1
                if tries[i] > RESUBMITS:
                    raise RuntimeError(f"task {tasks[i]!r} was cancelled {tries[i]} times (workers keep "
                                       "being lost); the sweep stops") from None
                w = tasks[i][1]
                if shared[w].status != "finished":
                    shared[w] = client.scatter(workloads[w], broadcast=True, hash=False)
                futures[i] = client.submit(run_task, tasks[i], shared[w], settings, pure=False)
                index[futures[i].key] = i
                pending.add(futures[i])  # type: ignore[no-untyped-call]
                continue
            done += 1
            progress(done, len(futures))
        return results
    except KeyboardInterrupt:
        client.cancel(futures)
        raise
    finally:
        if own:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()


def worker_rss_mib(client: Any) -> dict[str, float]:
    """Each worker's resident memory now, MiB (for the benchmark)."""
    def rss() -> float:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    out: dict[str, float] = client.run(rss)
    return out
