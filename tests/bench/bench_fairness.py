"""The queue's fairness: what the default admission costs per decision, and the fairness table.

``python -m tests.bench.run fairness`` (part of ``make bench``):

* **per decision**: the same workload (the built-in synthetic mix, 64 cards, offered load 0.95, so
  a line forms) through the simulation engine under best-effort-fifo, drain-soonest and the
  default worst-first; every ``ClaimQueue.admit`` and a periodic ``explain`` are timed. Printed:
  µs per admission step and per explained claim, and worst-first's ratios to the other two,
  measured side by side in this run (the queue states differ as the strategies do; the arrivals
  and departures are the same);
* **a small fairness table**: the synthetic mix at 0.85, two seeds (seconds; noisy, an example of
  the output, not a measurement).

``make bench-fairness`` (``python -m tests.bench.bench_fairness --full``): the fairness table the
issue asks for -- ``default`` (single-card), ``gpushare100``, ``gpushare60`` (single-card),
``multigpu50`` (multi-card, runtimes borrowed from ``default``) and the built-in synthetic mix, each
at offered load 0.7, 0.85 and 0.95, 64 cards, runtimes capped at 2 days, seeds 1-10, 15 000 jobs,
usable capacity at 1.1 -- best effort, worst-first and drain-soonest, through ``gpuslice simulate
--compare-admission``. Needs ``$GPUSLICE_TRACES`` (the folder holding ``alibaba-openb/``); hours
on two cores. ``--seeds``, ``--jobs`` and ``--rho`` override the sizes.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packing.products import load_catalog
from packing.queue import BEST_EFFORT_FIFO, DRAIN_SOONEST, WORST_FIRST, ClaimQueue
from simulations import protocol_b
from simulations.cli import simulate_main
from simulations.engine import EngineConfig
from simulations.ideal import reference_waits
from simulations.metrics import product_order
from simulations.options import parse_seeds
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import read_openb_pods
from simulations.workload import borrow_runtimes, openb_jobs

STRATEGIES = (BEST_EFFORT_FIFO, DRAIN_SOONEST, WORST_FIRST)
EXPLAIN_EVERY = 50  # admission steps between two timed explain passes


class _Timed:
    """Wraps ``ClaimQueue.admit``/``explain`` of every queue made while installed, accumulating their times."""

    def __init__(self) -> None:
        self.admit: list[float] = []
        self.explain_per_claim: list[float] = []
        self._admit = ClaimQueue.admit
        self._explain = ClaimQueue.explain

    def __enter__(self) -> _Timed:
        timed = self
        admit, explain = self._admit, self._explain

        def timed_admit(q: ClaimQueue, now: float) -> Any:
            t0 = time.perf_counter()
            out = admit(q, now)
            timed.admit.append(time.perf_counter() - t0)
            if len(timed.admit) % EXPLAIN_EVERY == 0 and q.waiting():
                t1 = time.perf_counter()
                explain(q, now)
                timed.explain_per_claim.append((time.perf_counter() - t1) / q.waiting())
            return out

        ClaimQueue.admit = timed_admit  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        ClaimQueue.admit = self._admit  # type: ignore[method-assign]


def per_decision(jobs: int = 4000, seed: int = 1) -> dict[str, dict[str, float]]:
    """µs per admission step (mean, p99) and per explained claim, per strategy, on one workload."""
    catalog = load_catalog()
    pool = generate(SyntheticSpec(cards=64, rho=0.95, jobs=jobs), seed)
    out: dict[str, dict[str, float]] = {}
    for name in STRATEGIES:
        config = protocol_b.ProtocolBConfig(engine=EngineConfig(admission=name), rho=None)
        with _Timed() as t:
            result = protocol_b.run(pool, catalog, config, [seed], cards=64)
        steps = sorted(t.admit)
        out[name] = {"steps": len(steps), "mean_us": 1e6 * statistics.fmean(steps),
                     "p99_us": 1e6 * steps[int(0.99 * (len(steps) - 1))],
                     "explain_us_per_claim": 1e6 * statistics.fmean(t.explain_per_claim or [0.0]),
                     "mean_waiting": result.simulations[0].mean_waiting}
    return out


def print_cost(rows: dict[str, dict[str, float]]) -> None:
    print("per decision: built-in synthetic mix, 64 cards, offered load 0.95, 4 000 jobs, seed 1; every admit "
          f"timed, explain every {EXPLAIN_EVERY} steps")
    print(f"{'admission':<18} {'steps':>7} {'mean waiting':>12} {'step µs mean':>13} {'step µs p99':>12} "
          f"{'explain µs/claim':>17}")
    for name, r in rows.items():
        print(f"{name:<18} {r['steps']:>7.0f} {r['mean_waiting']:>12.1f} {r['mean_us']:>13.1f} {r['p99_us']:>12.1f} "
              f"{r['explain_us_per_claim']:>17.2f}")
    wf = rows[WORST_FIRST]
    for other in (BEST_EFFORT_FIFO, DRAIN_SOONEST):
        o = rows[other]
        print(f"worst-first / {other}: step mean x{wf['mean_us'] / o['mean_us']:.2f}, "
              f"p99 x{wf['p99_us'] / o['p99_us']:.2f}, explain per claim "
              f"x{wf['explain_us_per_claim'] / max(o['explain_us_per_claim'], 1e-9):.2f}")


def full_table(seeds: str, jobs: int, rho: str, run: Callable[[list[str]], int] = simulate_main,
               out: Path | None = None) -> int:
    """The fairness table over every mix and load, through ``gpuslice simulate --compare-admission``; with
    ``out``, each command's figures also go to ``out/<name>.json`` (``--json``)."""
    root = os.environ.get("GPUSLICE_TRACES")
    if not root:
        print("bench-fairness: set GPUSLICE_TRACES to the folder holding alibaba-openb/", file=sys.stderr)
        return 2
    t = Path(root) / "alibaba-openb"
    common = ["--protocol", "b", "--cards", "64", "--rho", rho, "--jobs", str(jobs), "--seeds", seeds,
              "--compare-admission", "--admission", ",".join(STRATEGIES), "--saturation", "1.1"]
    single = ",".join(str(t / f"openb_pod_list_{m}.csv") for m in ("default", "gpushare100", "gpushare60"))
    runs = {
        "single": ["--pods", single, "--max-job-cards", "1", *common],
        "multigpu50": ["--pods", str(t / "openb_pod_list_multigpu50.csv"), "--runtimes-from",
                       str(t / "openb_pod_list_default.csv"), *common],
        "synthetic": common,
    }
    for name, argv in runs.items():
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            argv = [*argv, "--json", str(out / f"{name}.json")]
        print(f"\n$ gpuslice simulate {' '.join(argv)}", flush=True)
        code = run(argv)
        if code:
            return code
    print()
    print(reference_table(t, [float(x) for x in rho.split(",")], parse_seeds(seeds), jobs))
    return 0


MIXES = ("default", "gpushare100", "gpushare60")  # single-card: where the reference bounds the whole-card tail


def mix_pool(traces: Path, mix: str, rho: float, jobs: int) -> protocol_b.PoolSource:
    """The job pool the full table runs for ``mix`` (as its commands read it)."""
    if mix == "synthetic":
        return lambda seed: generate(SyntheticSpec(cards=64, rho=rho, jobs=jobs), seed)
    pods, _ = read_openb_pods(str(traces / f"openb_pod_list_{mix}.csv"), True)
    if mix.startswith("multigpu"):
        donors, _ = read_openb_pods(str(traces / "openb_pod_list_default.csv"), True)
        pods = borrow_runtimes(pods, donors)
    pool, _ = openb_jobs(pods)
    return pool if mix.startswith("multigpu") or mix == "gpushare100" else [j for j in pool if j.count <= 1]


def reference_table(traces: Path, rhos: list[float], seeds: tuple[int, ...], jobs: int) -> str:
    """The no-fragmentation reference (``simulations.ideal``) on the table's single-card workloads: per
    product the mean of per-seed p99 waits, slices first (slices served as soon as they fit, fluidly
    packed) and whole cards first. (With jobs of several cards its first-in-first-out line of whole-card
    jobs is no bound: an 8-card job at its head holds up every whole card behind it.)"""
    catalog = load_catalog()
    lines = ["no-fragmentation reference (simulations/ideal.py; minutes, mean of per-seed p99): slices first / "
             "whole cards first"]
    for mix in MIXES:
        for rho in rhos:
            source = mix_pool(traces, mix, rho, jobs)
            config = protocol_b.ProtocolBConfig(rounding="slices", rho=None if mix == "synthetic" else rho, jobs=jobs)
            per: dict[str, list[tuple[float, float]]] = {}
            for seed in seeds:
                pool, reqs, _ = protocol_b.seed_workload(source, catalog, config, 64_000, seed)
                first = reference_waits(pool, reqs, 64)
                last = reference_waits(pool, reqs, 64, wholes_first=True)
                for product in first:
                    per.setdefault(product, []).append((p99(first[product]), p99(last[product])))
            cells = ", ".join(f"{p} {statistics.fmean(a for a, _ in v) / 60:.1f} / "
                              f"{statistics.fmean(b for _, b in v) / 60:.1f}"
                              for p, v in sorted(per.items(), key=lambda kv: product_order(kv[0])))
            lines.append(f"  {mix:<12} ρ {rho:<5} {cells}")
    return "\n".join(lines)


def p99(waits: list[float]) -> float:
    ordered = sorted(waits)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.bench_fairness")
    ap.add_argument("--full", action="store_true", help="the full fairness table (hours; needs GPUSLICE_TRACES)")
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--jobs", type=int, default=15000)
    ap.add_argument("--rho", default="0.7,0.85,0.95")
    ap.add_argument("--out", type=Path, help="with --full: a folder for each command's figures (<name>.json)")
    ap.add_argument("--reference", action="store_true",
                    help="only the no-fragmentation reference (needs GPUSLICE_TRACES)")
    args = ap.parse_args(argv if argv is not None else [])
    if args.reference:
        root = os.environ.get("GPUSLICE_TRACES")
        if not root:
            print("bench-fairness: set GPUSLICE_TRACES to the folder holding alibaba-openb/", file=sys.stderr)
            return 2
        print(reference_table(Path(root) / "alibaba-openb", [float(x) for x in args.rho.split(",")],
                              parse_seeds(args.seeds), args.jobs))
        return 0
    if args.full:
        return full_table(args.seeds, args.jobs, args.rho, out=args.out)
    print_cost(per_decision())
    print("\nfairness table, small (the built-in synthetic mix at 0.85, 2 seeds x 3 000 jobs; `make bench-fairness` "
          "for the full one):", flush=True)
    return simulate_main(["--protocol", "b", "--cards", "64", "--rho", "0.85", "--jobs", "3000", "--seeds", "1-2",
                          "--compare-admission", "--admission", ",".join(STRATEGIES)])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
