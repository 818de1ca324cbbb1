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
--compare-admission``; then the frontiers below (single-card and multi-card), judged against that
run's best effort. Needs ``$GPUSLICE_TRACES`` (the folder holding ``alibaba-openb/``); hours on two
cores. ``--seeds``, ``--jobs`` and ``--rho`` override the sizes.

``--frontier`` (minutes): how far the worst-served product could go with no product sacrificed, in
the no-fragmentation reference (``simulations/ideal.py``, a relaxation: fluid slices, no node
boundaries) on the single-card mixes' workloads of the full table. Per mix and load it runs two
families of orders between the corners: ``τ T`` (a whole-card job goes ahead of slices once it has
waited T min; τ 0: whole cards first) and ``h H`` (arrival order, slices counted H min earlier; h ∞:
slices first, h 0: first in, first out), ``--cross`` every pair (τ, h), ``--per-product`` every pair
of head starts for quarters and halves (``h 60/0``); prints each product's p99 (mean of
per-seed p99) per order and whole cards alone (every slice removed). With ``--best-effort FILE.json``
(``gpuslice simulate --json`` of best effort on the same seeds, any number of files) it marks `!` the
products above 1.25 x their best-effort p99 + 5 min and names the order with the smallest worst-product
p99 among those that sacrifice none, with its ratio to best effort's worst. An argued reference, not a
lower bound over all policies (the module docstring says why). ``--reference`` prints the two corners only.

``--frontier --multi-card``: the same question on the multi-card mixes (``--mixes``, ``multigpu50`` by
default), every product in its own line, over the largest product's head start (``--aheads``) and
holds (``--holds``), with the alone lower bound (``tests/bench/frontier_multi_card.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from packing.products import load_catalog
from packing.queue import BEST_EFFORT_FIFO, DRAIN_SOONEST, WORST_FIRST, ClaimQueue
from simulations import fairness, protocol_b
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
    """The fairness table over every mix and load, through ``gpuslice simulate --compare-admission``, each
    command's figures also in ``out/<name>.json`` (``--json``; a temporary folder without ``out``); then
    the no-fragmentation reference's frontier, judged against the best-effort figures of ``single.json``, and the
    multi-card one with the alone bound, against ``multigpu50.json``'s."""
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
    with tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
        folder = out if out is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name, argv in runs.items():
            argv = [*argv, "--json", str(folder / f"{name}.json")]
            print(f"\n$ gpuslice simulate {' '.join(argv)}", flush=True)
            code = run(argv)
            if code:
                return code
        from tests.bench.frontier_multi_card import AHEADS_MIN, HOLDS_MIN, multi_card_orders, multi_frontier_table

        rhos, seed_list = [float(x) for x in rho.split(",")], parse_seeds(seeds)
        print()
        print(frontier_table(t, rhos, seed_list, jobs, best_effort=read_best_effort(folder / "single.json")))
        print()
        print(multi_frontier_table(t, ["multigpu50"], rhos, seed_list, jobs, multi_card_orders(AHEADS_MIN, HOLDS_MIN),
                                   read_best_effort(folder / "multigpu50.json")), flush=True)
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
                last = reference_waits(pool, reqs, 64, wholes_after_s=0)
                for product in first:
                    per.setdefault(product, []).append((p99(first[product]), p99(last[product])))
            cells = ", ".join(f"{p} {statistics.fmean(a for a, _ in v) / 60:.1f} / "
                              f"{statistics.fmean(b for _, b in v) / 60:.1f}"
                              for p, v in sorted(per.items(), key=lambda kv: product_order(kv[0])))
            lines.append(f"  {mix:<12} ρ {rho:<5} {cells}")
    return "\n".join(lines)


FRONTIER_TAUS_MIN = (0.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 240.0)  # ∞ is h ∞
FRONTIER_HEAD_STARTS_MIN = (math.inf, 240.0, 120.0, 60.0, 30.0, 15.0, 0.0, -15.0, -30.0, -60.0, -120.0)  # -∞ is τ 0
_MIX = re.compile(r"openb_pod_list_([A-Za-z0-9_-]+)\.csv")

SLICES = ("v100-25", "v100-50")  # the slice products of the single-card mixes (the default catalog)
Order = tuple[float, float, float]  # wholes_after_s, then slice_head_start_s of SLICES, of ``reference_waits``
K = TypeVar("K")  # an order of a frontier


def frontier_orders(taus_min: Sequence[float], head_starts_min: Sequence[float], cross: bool = False,
                    per_product: bool = False) -> list[Order]:
    """The orders the frontier runs: each τ (slices first otherwise), then each head start h for every
    slice product (no τ); with ``cross``, every pair (τ, h) instead; with ``per_product``, every pair of
    head starts (quarters', halves') instead."""
    if cross and per_product:
        raise ValueError("cross and per_product are two different grids: choose one")
    if cross:
        return [(60.0 * t, 60.0 * h, 60.0 * h) for t in taus_min for h in head_starts_min]
    if per_product:
        return [(math.inf, 60.0 * q, 60.0 * h) for q in head_starts_min for h in head_starts_min]
    return [(60.0 * t, math.inf, math.inf) for t in taus_min] + [(math.inf, 60.0 * h, 60.0 * h)
                                                                 for h in head_starts_min]


def order_label(order: Order) -> str:
    """``τ 30`` (whole cards ahead once they waited 30 min), ``h 15`` (slices count 15 min earlier), ``h ∞``,
    ``h 60/0`` (quarters 60, halves 0), ``τ 60 h 15`` (both)..."""
    def minutes(value: float) -> str:
        return f"{value / 60:g}" if math.isfinite(value) else ("∞" if value > 0 else "-∞")

    tau, quarters, halves = order
    head = minutes(quarters) if quarters == halves else f"{minutes(quarters)}/{minutes(halves)}"
    if math.isfinite(tau) and not (math.isinf(quarters) and quarters == halves > 0):
        return f"τ {minutes(tau)} h {head}"
    return f"τ {minutes(tau)}" if math.isfinite(tau) else f"h {head}"


def head_starts(order: Order) -> float | dict[str, float]:
    """``reference_waits``' ``slice_head_start_s`` for ``order``: one figure, or one per slice product."""
    _, quarters, halves = order
    return quarters if quarters == halves else dict(zip(SLICES, (quarters, halves), strict=True))


def frontier_cell(source: protocol_b.PoolSource, rho: float, seeds: Sequence[int], jobs: int,
                  orders: Sequence[Order]) -> tuple[dict[Order, dict[str, float]], dict[str, float]]:
    """Per order, per product: the mean of per-seed p99 waits in seconds under the no-fragmentation
    reference, on the full table's workload for each seed; and the same for the whole-card jobs alone
    (every slice removed)."""
    catalog = load_catalog()
    config = protocol_b.ProtocolBConfig(rounding="slices", rho=rho, jobs=jobs)
    per: dict[Order, dict[str, list[float]]] = {order: {} for order in orders}
    alone: dict[str, list[float]] = {}
    for seed in seeds:
        pool, reqs, _ = protocol_b.seed_workload(source, catalog, config, 64_000, seed)
        for order in orders:
            for product, waits in reference_waits(pool, reqs, 64, wholes_after_s=order[0],
                                                  slice_head_start_s=head_starts(order)).items():
                per[order].setdefault(product, []).append(p99(waits))
        kept = [k for k, r in enumerate(reqs) if r.whole]
        for product, waits in reference_waits([pool[k] for k in kept], [reqs[k] for k in kept], 64).items():
            alone.setdefault(product, []).append(p99(waits))
    return ({order: {p: statistics.fmean(v) for p, v in row.items()} for order, row in per.items()},
            {p: statistics.fmean(v) for p, v in alone.items()})


@dataclass(frozen=True)
class FrontierPoint(Generic[K]):
    """The frontier's best order for the worst-served product, with no product sacrificed."""

    order: K
    worst_product: str
    worst_p99_s: float
    ratio: float  # to best effort's worst product's p99


def sacrificed(row: Mapping[str, float], best_effort: Mapping[str, float]) -> list[str]:
    """The products of ``row`` above 1.25 x their best-effort p99 + 5 min (``fairness.limit_s``)."""
    return [p for p, v in row.items() if p in best_effort and v > fairness.limit_s(best_effort[p])]


def best_point(rows: Mapping[K, Mapping[str, float]], best_effort: Mapping[str, float]) -> FrontierPoint[K] | None:
    """Among the orders whose every product stays within its limit (``sacrificed``), the one with the
    smallest worst-product p99 (the first listed on a tie); None when every order sacrifices one."""
    reference_worst = max(best_effort.values())
    fair = {order: row for order, row in rows.items() if row and not sacrificed(row, best_effort)}
    if not fair:
        return None
    order = min(fair, key=lambda o: max(fair[o].values()))
    row = fair[order]
    product = max(row, key=lambda p: (row[p], product_order(p)))
    worst_s = row[product]
    ratio = worst_s / reference_worst if reference_worst > 0 else (1.0 if worst_s <= 0 else math.inf)
    return FrontierPoint(order, product, worst_s, ratio)


def read_best_effort(path: Path) -> dict[tuple[str, float], tuple[tuple[int, ...], dict[str, float]]]:
    """From a ``gpuslice simulate --json`` file (one workload and load, or a sweep of them): per (mix, ρ)
    the seeds and best effort's per-product p99 in seconds (mean of per-seed p99, ``fairness.p99_by_product``)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out: dict[tuple[str, float], tuple[tuple[int, ...], dict[str, float]]] = {}
    for block in data.get("sweep") or [data]:
        mix = _MIX.search(str(block.get("workload", "")))
        rho = block.get("rho_target")
        run = next((r for r in block.get("runs", []) if r.get("admission") == fairness.REFERENCE), None)
        if mix is None or rho is None or run is None:
            continue
        out.setdefault((mix.group(1), float(rho)), (tuple(block.get("seeds", ())), fairness.p99_by_product(run)))
    return out


def frontier_table(traces: Path, rhos: Sequence[float], seeds: tuple[int, ...], jobs: int,
                   orders: Sequence[Order] | None = None,
                   best_effort: Mapping[tuple[str, float], tuple[tuple[int, ...], dict[str, float]]] | None = None
                   ) -> str:
    """The no-fragmentation reference's frontier between slices first and whole cards first, per
    single-card mix and load: each product's p99 per order and, given best effort's figures for the
    cell (same seeds), the smallest worst-product p99 the orders reach with no product sacrificed."""
    orders = list(orders if orders is not None else frontier_orders(FRONTIER_TAUS_MIN, FRONTIER_HEAD_STARTS_MIN))
    width = max(7, *(len(order_label(o)) for o in orders))
    lines = ["no-fragmentation reference frontier (simulations/ideal.py; minutes, mean of per-seed p99). Orders: "
             "τ T: a whole-card job goes ahead of slices once it has waited T min, slices first before (τ 0: whole "
             "cards first); h H: arrival order, a slice counted H min earlier (h ∞: slices first, h 0: first in, "
             "first out, h -∞: whole cards first); alone: whole cards with every slice removed. "
             "`!`: above 1.25 x best effort's p99 + 5 min"]
    for mix in MIXES:
        for rho in rhos:
            rows, alone = frontier_cell(mix_pool(traces, mix, rho, jobs), rho, seeds, jobs, orders)
            products = sorted({p for row in rows.values() for p in row}, key=product_order)
            head, be = cell_head(mix, rho, seeds, jobs, products, best_effort or {})
            lines += ["", head]
            lines.append(f"  {'order':>{width}} " + " ".join(f"{p:>10}" for p in products) + "  worst")
            for order in orders:
                row = rows[order]
                over = set(sacrificed(row, be))
                cells = " ".join(f"{row[p] / 60:>9.1f}{'!' if p in over else ' '}" for p in products)
                worst_p = max(row, key=lambda p: (row[p], product_order(p)))
                lines.append(f"  {order_label(order):>{width}} {cells} {worst_p} {row[worst_p] / 60:.1f}")
            lines.append(f"  {'alone':>{width}} " + " ".join(f"{alone[p] / 60:>9.1f} " if p in alone else f"{'-':>9} "
                                                         for p in products))
            if not be:
                continue
            be_worst = max(be.values())
            goal = fairness.SHARP_RATIO * be_worst
            best = best_point(rows, be)
            if best is None:
                lines.append(f"  every order sacrifices a product (0.8 x best effort's worst is {goal / 60:.1f})")
                continue
            reach = ("reachable" if best.worst_p99_s <= goal + 1e-9 else "NOT reachable") + " in the reference"
            if be_worst < fairness.SACRIFICE_SLACK_S:
                reach = "not judged (best effort's worst is under 5 min: no tail to cut)"
            lines.append(f"  best with no product sacrificed: {order_label(best.order)}, {best.worst_product} "
                         f"{best.worst_p99_s / 60:.1f} = {best.ratio:.2f} x best effort's worst "
                         f"({be_worst / 60:.1f}); 0.8 x is {goal / 60:.1f}: {reach}")
    return "\n".join(lines)


def cell_head(mix: str, rho: float, seeds: tuple[int, ...], jobs: int, products: Sequence[str],
              best_effort: Mapping[tuple[str, float], tuple[tuple[int, ...], dict[str, float]]]
              ) -> tuple[str, dict[str, float]]:
    """A frontier cell's first line, and best effort's per-product p99 for it (empty unless given for
    these very seeds: another seed set is no pairing)."""
    known = best_effort.get((mix, rho))
    be = known[1] if known is not None and known[0] == seeds else {}
    head = f"{mix} ρ {rho}, seeds {seeds_text(seeds)}, {jobs} jobs, 64 cards"
    if be:
        return head + "; best effort " + ", ".join(f"{p} {be[p] / 60:.1f}" for p in products if p in be), be
    if known is not None:
        return head + f"; best effort's figures are for seeds {seeds_text(known[0])}, not these: not judged", be
    return head + "; no best-effort figures for this cell (--best-effort FILE.json): not judged", be


def seeds_text(seeds: Sequence[int]) -> str:
    """``1-10`` for a run of seeds, else ``1,3,7``."""
    contiguous = list(seeds) == list(range(seeds[0], seeds[0] + len(seeds)))
    return f"{seeds[0]}-{seeds[-1]}" if contiguous and len(seeds) > 1 else ",".join(map(str, seeds))


def p99(waits: list[float]) -> float:
    ordered = sorted(waits)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def multi_card_main(args: argparse.Namespace, traces: Path, rhos: list[float], seeds: tuple[int, ...]) -> int:
    """``--frontier --multi-card``: the multi-card frontier (``tests/bench/frontier_multi_card.py``)."""
    from tests.bench.frontier_multi_card import multi_card_orders, multi_frontier_table  # it imports this module

    try:
        aheads = [float(a) for a in args.aheads.split(",") if a.strip()]
        holds = [float(h) for h in args.holds.split(",") if h.strip()]
        best_effort = {k: v for path in args.best_effort for k, v in read_best_effort(path).items()}
        mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"bench-fairness: {e}", file=sys.stderr)
        return 2
    missing = [m for m in mixes if not (traces / f"openb_pod_list_{m}.csv").is_file()]
    if (not aheads or not holds or not mixes or missing or any(math.isnan(a) for a in aheads)
            or any(not h >= 0 for h in holds)):
        print(f"bench-fairness: --aheads needs minutes, --holds minutes >= 0 and --mixes openb mixes under {traces} "
              f"(got {args.aheads!r}, {args.holds!r}, {args.mixes!r}; not found: {', '.join(missing) or 'none'})",
              file=sys.stderr)
        return 2
    print(multi_frontier_table(traces, mixes, rhos, seeds, args.jobs, multi_card_orders(aheads, holds), best_effort),
          flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    from tests.bench.frontier_multi_card import AHEADS_MIN, HOLDS_MIN  # it imports this module

    ap = argparse.ArgumentParser(prog="python -m tests.bench.bench_fairness")
    ap.add_argument("--full", action="store_true", help="the full fairness table (hours; needs GPUSLICE_TRACES)")
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--jobs", type=int, default=15000)
    ap.add_argument("--rho", default="0.7,0.85,0.95")
    ap.add_argument("--out", type=Path, help="with --full: a folder for each command's figures (<name>.json)")
    ap.add_argument("--reference", action="store_true",
                    help="only the no-fragmentation reference (needs GPUSLICE_TRACES)")
    ap.add_argument("--frontier", action="store_true",
                    help="the no-fragmentation reference's frontier over τ and h on the single-card mixes (needs "
                         "GPUSLICE_TRACES); judged against best effort with --best-effort")
    ap.add_argument("--best-effort", type=Path, action="append", default=[], metavar="FILE.json",
                    help="with --frontier: best effort's figures, a `gpuslice simulate --json` file (repeatable)")
    ap.add_argument("--taus", default=",".join(f"{t:g}" for t in FRONTIER_TAUS_MIN),
                    help="with --frontier: the τ grid in minutes (empty: none)")
    ap.add_argument("--head-starts", default=",".join(f"{h:g}" for h in FRONTIER_HEAD_STARTS_MIN),
                    help="with --frontier: the slices' head starts h in minutes, inf and -inf allowed (empty: none)")
    ap.add_argument("--cross", action="store_true", help="with --frontier: every pair (τ, h) of the two grids")
    ap.add_argument("--per-product", action="store_true",
                    help="with --frontier: every pair of head starts (quarters', halves') of the --head-starts grid")
    ap.add_argument("--multi-card", action="store_true",
                    help="with --frontier: the multi-card mixes instead, every product in its own line, over the "
                         "largest product's head start (--aheads) and holds (--holds), with the alone lower bound")
    ap.add_argument("--mixes", default="multigpu50", help="with --multi-card: the openb mixes (comma-separated)")
    ap.add_argument("--aheads", default=",".join(f"{a:g}" for a in AHEADS_MIN),
                    help="with --multi-card: the largest product's head starts in minutes, inf allowed")
    ap.add_argument("--holds", default=",".join(f"{h:g}" for h in HOLDS_MIN),
                    help="with --multi-card: a head's wait in minutes before it stops every line after it, inf allowed")
    args = ap.parse_args(argv if argv is not None else [])
    if args.reference or args.frontier:
        root = os.environ.get("GPUSLICE_TRACES")
        if not root:
            print("bench-fairness: set GPUSLICE_TRACES to the folder holding alibaba-openb/", file=sys.stderr)
            return 2
        traces, rhos, seeds = Path(root) / "alibaba-openb", [float(x) for x in args.rho.split(",")], \
            parse_seeds(args.seeds)
        if args.reference:
            print(reference_table(traces, rhos, seeds, args.jobs))
            return 0
        if args.multi_card:
            return multi_card_main(args, traces, rhos, seeds)
        try:
            taus = [float(t) for t in args.taus.split(",") if t.strip()]
            heads = [float(h) for h in args.head_starts.split(",") if h.strip()]
            best_effort = {k: v for path in args.best_effort for k, v in read_best_effort(path).items()}
            orders = frontier_orders(taus, heads, args.cross, args.per_product)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"bench-fairness: {e}", file=sys.stderr)
            return 2
        if not orders or any(not t >= 0 for t in taus) or any(math.isnan(h) for h in heads):
            print(f"bench-fairness: --taus needs minutes >= 0 and --head-starts numbers, got {args.taus!r} and "
                  f"{args.head_starts!r}", file=sys.stderr)
            return 2
        print(frontier_table(traces, rhos, seeds, args.jobs, orders, best_effort), flush=True)
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
