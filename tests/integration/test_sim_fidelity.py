"""Fidelity: the simulator places every claim where the extender does, on the same trace and policy.

One trace of a few hundred claims (quarter, half, whole and two-card slices, arrivals and
releases, some claims waiting for room) on a few dozen nodes runs twice:

* through ``gpuslice simulate --protocol b --rho none --admission best-effort-fifo`` (the trace's
  own timing; the placements written with ``--placements``);
* through ``gpuslice serve --standalone`` under real gunicorn, driven over HTTP as kube-scheduler
  would drive it: at each event time the releases (``POST /admin/release``), then every pending
  pod in arrival order and then the new ones: filter, prioritize, bind to the best-scored node
  (the first of the filter's answer among equal scores: kube-scheduler picks one of them at
  random, and for a policy with unique keys there is only one).

Both must agree on every claim: whether and when it started, its node, its GPUs. Under
``gradient-fit`` the trace places claims in both load phases (filling: the gradient; churning,
once departures keep pace: best fit), read from the extender's ``gpuslice_placement_churning``. The node order
is the simulator's per-seed order, so the node list is written so that node-i gets order i, the
order the extender's seeded nodes have.
"""

from __future__ import annotations

import csv
import heapq
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from extender.client import ExtenderClient
from extender.samples import binding_args, filter_args, pod
from simulations.cli import simulate_main
from simulations.cluster import node_order
from simulations.traces import Job, write_jobs

from .gunicorn_proc import gpuslice_serve

NODES, GPUS, CLAIMS, SEED = 24, 4, 320, 5
LABEL = "Tesla-V100-SXM2-32GB"
SHAPES = (("v100-25", 1, 0.40), ("v100-50", 1, 0.30), ("v100-100", 1, 0.24), ("v100-100", 2, 0.06))


def trace_jobs() -> list[Job]:
    """Poisson arrivals offering about the cards' capacity, lognormal runtimes: enough load that claims wait."""
    rng = random.Random(11)
    jobs: list[Job] = []
    t = 0.0
    for i in range(CLAIMS):
        product, count, _ = rng.choices(SHAPES, [w for _, _, w in SHAPES])[0]
        t += rng.expovariate(1 / 3.0)
        jobs.append(Job(name=f"claim-{i:04d}", arrival=round(t, 3), duration=round(rng.lognormvariate(6.0, 0.8), 3),
                        milli=0, count=count, product=product))
    return jobs


def write_nodes(path: Path) -> None:
    """The node list in an order the simulator's seed permutation turns into node-i at order i."""
    perm = node_order(NODES, SEED)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        for i in range(NODES):
            w.writerow([f"node-{perm[i]}", 96000, 786432, GPUS, LABEL])


def simulated(tmp_path: Path, trace: Path, nodes: Path, policy: str) -> dict[str, tuple[float, str, tuple[int, ...]]]:
    out = tmp_path / f"placements-{policy}.csv"
    code = simulate_main(["--protocol", "b", "--trace", str(trace), "--nodes", str(nodes), "--rho", "none",
                          "--admission", "best-effort-fifo", "--policy", policy, "--seeds", str(SEED),
                          "--placements", str(out), "--json", str(tmp_path / f"sim-{policy}.json")])
    assert code == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    return {r["job"]: (float(r["start_s"]), r["node"], gpu_indices(r["gpus"].split("|"))) for r in rows}


def gpu_indices(uuids: list[str]) -> tuple[int, ...]:
    """GPU positions on their node ("node-3/gpu1" in the simulator, "node-3/gpu-1" in the extender)."""
    return tuple(int(u.rsplit("gpu", 1)[1].lstrip("-")) for u in uuids)


def churning(client: ExtenderClient) -> bool | None:
    """The extender's load phase from /metrics (None for a policy that reads none)."""
    _, text = client.request_raw("GET", "/metrics")
    lines = [x for x in text.decode().splitlines() if x.startswith("gpuslice_placement_churning ")]
    return float(lines[0].split()[1]) == 1.0 if lines else None


def served(client: ExtenderClient, jobs: list[Job],
           phases: list[bool | None] | None = None) -> dict[str, tuple[float, str, tuple[int, ...]]]:
    """Drive the extender through the trace like kube-scheduler; every bound claim's (start, node, GPUs).
    ``phases`` gets the load phase each claim was placed in."""
    names = [f"node-{i}" for i in range(NODES)]
    docs = {j.name: pod(j.name, j.product, count=j.count) for j in jobs}
    departures: list[tuple[float, str]] = []
    arrivals = sorted(jobs, key=lambda j: j.arrival)
    pending: list[Job] = []
    placed: dict[str, tuple[float, str, tuple[int, ...]]] = {}

    def try_place(job: Job, now: float) -> bool:
        doc = docs[job.name]
        status, reply = client.post("/filter", filter_args(doc, names))
        assert status == 200 and reply["Error"] == "", reply
        if not reply["NodeNames"]:
            return False
        status, scores = client.post("/prioritize", filter_args(doc, reply["NodeNames"]))
        assert status == 200
        if phases is not None:
            phases.append(churning(client))
        top = max(s["Score"] for s in scores)
        node = next(s["Host"] for s in scores if s["Score"] == top)  # kube-scheduler: one of the top, at random
        status, bound = client.post("/bind", binding_args(doc, node))
        assert status == 200 and bound["Error"] == "", bound
        status, state = client.get("/state")
        assert status == 200
        held = next(a for a in state["allocations"] if a["pod_uid"] == doc["metadata"]["uid"])
        assert held["node"] == node and held["state"] == "bound"
        placed[job.name] = (now, node, gpu_indices(held["gpus"]))
        heapq.heappush(departures, (now + (job.duration or 0.0), job.name))
        return True

    while arrivals or departures:
        now = min(arrivals[0].arrival if arrivals else float("inf"), departures[0][0] if departures else float("inf"))
        while departures and departures[0][0] <= now:  # the simulator frees capacity first
            _, name = heapq.heappop(departures)
            status, _ = client.post("/admin/release", {"PodUID": docs[name]["metadata"]["uid"]})
            assert status == 200
        while arrivals and arrivals[0].arrival <= now:
            pending.append(arrivals.pop(0))
        pending = [job for job in pending if not try_place(job, now)]  # oldest first, as the queue orders them
    return placed


@pytest.fixture
def extender(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ExtenderClient]:
    args = ["--nodes", str(NODES), "--cards-per-node", str(GPUS), "--gpu-model", LABEL, "--policy", request.param,
            "--reservation-ttl", "3600"]
    with gpuslice_serve(tmp_path, args) as client:
        yield client


@pytest.mark.timeout(600)
@pytest.mark.parametrize("extender", ["gradient-fit", "best-fit", "frag-gradient"], indirect=True)
def test_every_claim_lands_where_the_extender_puts_it(extender: ExtenderClient, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    policy = request.node.callspec.params["extender"]
    jobs = trace_jobs()
    trace, nodes = tmp_path / "trace.csv", tmp_path / "nodes.csv"
    write_jobs(trace, jobs)
    write_nodes(nodes)
    sim = simulated(tmp_path, trace, nodes, policy)
    phases: list[bool | None] = []
    real = served(extender, jobs, phases)
    assert len(real) == CLAIMS  # every claim started in the end
    if policy == "gradient-fit":  # the trace placed claims in both of its phases: filling, then churning
        assert phases.count(False) >= 10 and phases.count(True) >= 10, (phases.count(False), phases.count(True))
    waited = sum(1 for j in jobs if real[j.name][0] > j.arrival)
    assert waited >= 10  # the trace exercised the queue, not only free capacity
    assert set(sim) == set(real)
    for j in jobs:
        s_start, s_node, s_gpus = sim[j.name]
        r_start, r_node, r_gpus = real[j.name]
        assert (s_node, s_gpus) == (r_node, r_gpus), (j.name, j.product, j.count)
        assert s_start == pytest.approx(r_start), j.name
