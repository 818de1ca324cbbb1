"""Protocol A sweeps on a Dask LocalCluster (``simulations/dask_sweep.py``): the same results as a serial
sweep, the workloads sent once per worker, a lost worker costing only its tasks, Ctrl-C cancelling."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")  # in the dev extra: make test has it

from packing.products import load_catalog  # noqa: E402
from simulations import command_a, dask_sweep  # noqa: E402
from simulations.cluster import card_model, card_nodes  # noqa: E402
from simulations.synthetic import SyntheticSpec, generate  # noqa: E402
from simulations.workload import job_request  # noqa: E402

SETTINGS = {"rounding": "slices", "scores": "exact", "inflation": 1.3}


def workloads(cards: int = 16, jobs: int = 400) -> list[command_a.Workload]:
    catalog = load_catalog()
    out = []
    for k in range(3):
        requests = [job_request(j, catalog, "slices") for j in generate(SyntheticSpec(cards=cards, jobs=jobs), k)]
        out.append(command_a.Workload(f"w{k}", card_nodes(cards), requests, card_model(catalog, "slices", requests)))
    return out


TASKS = [("run", w, p, t, s) for w in range(3) for p in ("best-fit", "first-fit") for t in ("stable", "random")
         for s in (1, 2)]


def plain(result: Any) -> str:
    """A run's figures as text (NaN equal to NaN), its timing left out."""
    return json.dumps({k: v for k, v in result.as_dict().items() if k != "seconds"}, sort_keys=True)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with dask_sweep.client_for(2, None) as c:  # the local cluster ``--workers 2`` starts
        yield c
    c.cluster.close()


@pytest.mark.timeout(300)
def test_a_dask_sweep_equals_the_serial_one_and_sends_each_workload_once_per_worker(client: Any) -> None:
    work = workloads()
    serial = [command_a.run_task(t, work[t[1]], SETTINGS) for t in TASKS]
    seen: list[tuple[int, int]] = []
    results = dask_sweep.run(TASKS, work, SETTINGS, lambda d, n: seen.append((d, n)), client=client)
    assert [plain(r) for r in results] == [plain(r) for r in serial]
    assert seen[-1] == (len(TASKS), len(TASKS)) and [d for d, _ in seen] == list(range(1, len(TASKS) + 1))

    def fetched(dask_worker: Any) -> int:  # workloads a worker had to fetch from another: none, it holds them all
        return sum(len(entry.get("keys", ())) for entry in dask_worker.transfer_incoming_log)

    assert all(n == 0 for n in client.run(fetched).values())
    assert len(client.run(lambda: 1)) == 2  # both workers served


@pytest.mark.timeout(300)
def test_a_worker_lost_mid_sweep_costs_only_its_tasks(client: Any) -> None:
    work = workloads()
    serial = [command_a.run_task(t, work[t[1]], SETTINGS) for t in TASKS]
    killed: list[str] = []

    def progress(done: int, total: int) -> None:
        if done == 2 and not killed:  # kill one worker process outright; its nanny starts a new one
            pids = client.run(os.getpid)
            address, pid = sorted(pids.items())[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(address)

    results = dask_sweep.run(TASKS, work, SETTINGS, progress, client=client)
    assert killed
    assert [plain(r) for r in results] == [plain(r) for r in serial]
    client.wait_for_workers(2, timeout=60)


@pytest.mark.timeout(300)
def test_every_worker_lost_at_once_the_workloads_are_scattered_again(client: Any) -> None:
    # the scattered workloads die with their last holders: the scheduler cancels the tasks that need
    # them, and the sweep must scatter again and resubmit, not fail or hang
    work = workloads()
    serial = [command_a.run_task(t, work[t[1]], SETTINGS) for t in TASKS]
    killed: list[int] = []

    def progress(done: int, total: int) -> None:
        if done == 2 and not killed:
            for pid in client.run(os.getpid).values():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    results = dask_sweep.run(TASKS, work, SETTINGS, progress, client=client)
    assert len(killed) == 2
    assert [plain(r) for r in results] == [plain(r) for r in serial]
    client.wait_for_workers(2, timeout=60)


@pytest.mark.timeout(300)
def test_ctrl_c_cancels_the_tasks_not_done(client: Any) -> None:
    work = workloads(256, 6000)  # tasks of a fraction of a second each
    many = TASKS * 2

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    def states(dask_scheduler: Any) -> tuple[int, int]:
        runs = [ts for ts in dask_scheduler.tasks.values() if str(ts.key).startswith("run_task")]
        finished = {key for key, _, finish, *_ in dask_scheduler.transition_log
                    if str(key).startswith("run_task") and finish == "memory"}
        return sum(1 for ts in runs if ts.state in ("processing", "waiting", "queued", "no-worker")), len(finished)

    before = client.run_on_scheduler(states)[1]
    with pytest.raises(KeyboardInterrupt):
        dask_sweep.run(many, work, SETTINGS, interrupt, client=client)
    deadline = time.monotonic() + 30  # the scheduler forgets cancelled tasks as soon as it hears of it
    while client.run_on_scheduler(states)[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2)  # had they not been cancelled, the two workers would finish more of them meanwhile
    pending, finished = client.run_on_scheduler(states)
    assert pending == 0
    assert finished - before < len(many) // 2  # most never ran: cancelled, not finished in the background


def test_both_a_local_and_a_remote_cluster_is_refused() -> None:
    with pytest.raises(dask_sweep.UsageError, match="not both"):
        dask_sweep.client_for(2, "tcp://127.0.0.1:8786")
