"""Fidelity from a live cluster: ``simulate --from-cluster`` places the next claims where the extender does.

``gpuslice serve --standalone`` under real gunicorn is driven like kube-scheduler (as in
``test_sim_fidelity.py``) through 300 claims (quarter, half, whole and two-card slices, arrivals and
releases, some waiting); then its ``/state`` and its history (``gpuslice history export``) are
saved, and the extender is driven on through the next 100 claims. ``gpuslice simulate
--from-cluster STATE --history FILE --trace NEXT`` must start every one of them, and every claim
that waited at the snapshot, at the same time, on the same node and the same cards.

Every pod declares its runtime (``activeDeadlineSeconds``) and runs exactly that long, so the
claims still running at the snapshot end at their deadlines on the extender's clock: the driver
releases each at ``admitted + limit`` (both from the exported history), which is what
``--running-ends declared`` computes. The policy's mix and load phase come from the history: the
simulator replays the recorded arrivals and departures before the snapshot.
"""

from __future__ import annotations

import csv
import heapq
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from extender.client import ExtenderClient
from extender.samples import binding_args, filter_args, pod
from simulations.traces import Job, write_jobs

from .gunicorn_proc import gpuslice_serve

NODES, GPUS, BEFORE, AFTER = 24, 4, 300, 100
LABEL = "Tesla-V100-SXM2-32GB"
SHAPES = (("v100-25", 1, 0.40), ("v100-50", 1, 0.30), ("v100-100", 1, 0.24), ("v100-100", 2, 0.06))
Placed = tuple[float, str, tuple[str, ...]]


def claims(n: int, seed: int, prefix: str, start: float, gap: float = 3.0) -> list[Job]:
    """Poisson arrivals at about the cards' capacity, whole-second lognormal runtimes (declared as limits)."""
    rng = random.Random(seed)
    out: list[Job] = []
    t = start
    for i in range(n):
        product, count, _ = rng.choices(SHAPES, [w for _, _, w in SHAPES])[0]
        t += rng.expovariate(1 / gap)
        runtime = float(round(rng.lognormvariate(6.0, 0.8)))
        out.append(Job(name=f"{prefix}-{i:04d}", arrival=round(t, 3), duration=runtime, milli=0, count=count,
                       product=product))
    return out


class Driver:
    """kube-scheduler's part: at each time, releases, then pending pods oldest first, then new ones."""

    def __init__(self, client: ExtenderClient) -> None:
        self.client = client
        self.names = [f"node-{i}" for i in range(NODES)]
        self.docs: dict[str, dict[str, object]] = {}
        self.departures: list[tuple[float, str]] = []
        self.pending: list[Job] = []
        self.placed: dict[str, Placed] = {}
        self.jobs: dict[str, Job] = {}

    def uid(self, name: str) -> str:
        meta = self.docs[name]["metadata"]
        assert isinstance(meta, dict)
        return str(meta["uid"])

    def add(self, job: Job) -> None:
        self.jobs[job.name] = job
        self.docs[job.name] = pod(job.name, job.product, count=job.count, time_limit_s=int(job.duration or 0))

    def try_place(self, job: Job, now: float) -> bool:
        doc = self.docs[job.name]
        status, reply = self.client.post("/filter", filter_args(doc, self.names))
        assert status == 200 and reply["Error"] == "", reply
        if not reply["NodeNames"]:
            return False
        status, scores = self.client.post("/prioritize", filter_args(doc, reply["NodeNames"]))
        assert status == 200
        top = max(s["Score"] for s in scores)
        node = next(s["Host"] for s in scores if s["Score"] == top)
        status, bound = self.client.post("/bind", binding_args(doc, node))
        assert status == 200 and bound["Error"] == "", bound
        status, state = self.client.get("/state")
        held = next(a for a in state["allocations"] if a["pod_uid"] == self.uid(job.name))
        self.placed[job.name] = (now, node, tuple(held["gpus"]))
        heapq.heappush(self.departures, (now + (job.duration or 0.0), job.name))
        return True

    def run(self, arrivals: list[Job], until: float = float("inf")) -> float:
        """Drive through ``arrivals`` and the departures due, up to ``until``; the last event time."""
        arrivals = sorted(arrivals, key=lambda j: j.arrival)
        now = 0.0
        while arrivals or self.departures:
            now = min(arrivals[0].arrival if arrivals else float("inf"),
                      self.departures[0][0] if self.departures else float("inf"))
            if now > until:
                break
            while self.departures and self.departures[0][0] <= now:
                _, name = heapq.heappop(self.departures)
                status, _ = self.client.post("/admin/release", {"PodUID": self.uid(name)})
                assert status == 200
            while arrivals and arrivals[0].arrival <= now:
                job = arrivals.pop(0)
                self.add(job)
                self.pending.append(job)
            self.pending = [job for job in self.pending if not self.try_place(job, now)]
        return now


def simulated(tmp: Path, policy: str) -> dict[str, Placed]:
    out = tmp / "placements.csv"
    code = subprocess.run(
        [sys.executable, "-m", "packing.cli", "simulate", "--from-cluster", str(tmp / "state.json"), "--history",
         str(tmp / "history.jsonl"), "--trace", str(tmp / "next.csv"), "--running-ends", "declared",
         "--admission", "best-effort-fifo", "--policy", policy, "--seeds", "1", "--placements", str(out)],
        capture_output=True, text=True, timeout=300)
    assert code.returncode == 0, code.stderr
    with out.open() as f:
        return {r["job"]: (float(r["start_s"]), r["node"], tuple(r["gpus"].split("|"))) for r in csv.DictReader(f)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("policy", ["gradient-fit", "best-fit"])
def test_the_next_claims_land_where_the_extender_puts_them(tmp_path: Path, policy: str) -> None:
    args = ["--nodes", str(NODES), "--gpus-per-node", str(GPUS), "--gpu-model", LABEL, "--policy", policy,
            "--reservation-ttl", "3600"]
    with gpuslice_serve(tmp_path, args) as client:
        driver = Driver(client)
        before = claims(BEFORE, 11, "before", 0.0, gap=2.5)  # a little above capacity: a line at the snapshot
        snap_v = before[-1].arrival
        driver.run(before, until=snap_v)
        status, state = client.get("/state")
        assert status == 200
        (tmp_path / "state.json").write_text(json.dumps(state))
        export = subprocess.run([sys.executable, "-m", "packing.cli", "history", "export", "--url",
                                 f"http://127.0.0.1:{client.port}", "--since", "1d", "-o",
                                 str(tmp_path / "history.jsonl")], capture_output=True, text=True, timeout=60)
        assert export.returncode == 0, export.stderr
        lines = (tmp_path / "history.jsonl").read_text().splitlines()
        header = json.loads(lines[0])
        rows = {r["claim"]: r for r in map(json.loads, lines[1:])}
        held = {a["pod_uid"] for a in state["allocations"]}
        running = [n for n in driver.placed if driver.uid(n) in held]
        waiting = [j.name for j in driver.pending]
        assert len(rows) == BEFORE and len(running) >= 20 and len(waiting) >= 3, (len(running), len(waiting))
        # the pods still running end at their deadlines on the extender's clock: admitted + limit
        t0 = state["wall_time"] - header["origin"]
        # (a deadline already past at the snapshot: the pod ends at once, at the snapshot)
        driver.departures = [(max(0.0, rows[driver.uid(n)]["admitted"] + rows[driver.uid(n)]["time_limit"] - t0), n)
                             for n in running]
        heapq.heapify(driver.departures)
        driver.pending = [driver.jobs[n] for n in waiting]
        already = set(driver.placed)
        after = claims(AFTER, 12, "after", 1.0)
        write_jobs(tmp_path / "next.csv", after)
        driver.run(after)
    real = {n: p for n, p in driver.placed.items() if n not in already}
    assert len(real) >= AFTER  # the next claims all started, and the line at the snapshot with them
    assert sum(1 for j in after if real[j.name][0] > j.arrival) >= 10  # the queue was exercised after the snapshot
    sim = simulated(tmp_path, policy)
    uid_of = {driver.uid(n): n for n in waiting}
    sim = {uid_of.get(k, k): v for k, v in sim.items()}
    assert set(sim) == set(real)
    for name, (r_start, r_node, r_gpus) in real.items():
        s_start, s_node, s_gpus = sim[name]
        assert (s_node, s_gpus) == (r_node, r_gpus), name
        assert s_start == pytest.approx(r_start, abs=1e-4), name
