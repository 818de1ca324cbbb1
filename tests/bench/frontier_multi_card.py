"""The no-fragmentation frontier on the multi-card mixes, and the alone lower bound.

``python -m tests.bench.bench_fairness --frontier --multi-card`` (minutes). Per mix and load, the
relaxation's ``product_waits`` (``simulations/ideal.py``: fluid cards, no node boundaries, every product
in its own line) over a grid of orders: **a A** the largest product (the 8-card jobs on ``multigpu50``)
counted A min earlier than it arrived (``ahead``), **hold H** a head that has waited H min stops every
line after it (∞: backfill, best effort's order). ``a 0 hold ∞`` is the relaxation's own first in,
first out. Per order each product's p99 (mean of per-seed p99); **alone**: each product of whole cards
with every other removed (``alone_waits``), a lower bound on its p99 under any policy that serves it
in arrival order and preempts nothing.

Two judgements per cell. Against best effort on the real cluster (``--best-effort FILE.json``): `!` a
product above 1.25 x its best-effort p99 + 5 min. The relaxation serves slices worse than the real
cluster does (fragments there are room only slices can use), so that one marks slices in every order;
hence also against the relaxation's own first in, first out (`*`), where the question is the same one
at a smaller scale: can any order cut the worst product's tail to 0.8 x without another product paying?
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from packing.products import Request, load_catalog
from simulations import fairness, protocol_b
from simulations.ideal import alone_waits, product_waits
from simulations.metrics import product_order
from simulations.workload import size_class
from tests.bench.bench_fairness import best_point, cell_head, mix_pool, p99, sacrificed

MIXES = ("multigpu50",)
AHEADS_MIN = (0.0, 60.0, 360.0, 720.0, 1440.0, math.inf)  # the largest product's head start
HOLDS_MIN = (math.inf, 240.0, 60.0, 0.0)  # a head's wait before it stops every line after it
MultiOrder = tuple[float, float]  # (the largest product's head start, hold_after_s), seconds
FIFO: MultiOrder = (0.0, math.inf)  # the relaxation's own first in, first out with backfill


def multi_card_orders(aheads_min: Sequence[float], holds_min: Sequence[float]) -> list[MultiOrder]:
    """Every pair (head start, hold), in minutes, as seconds; first in, first out first, once."""
    pairs = [(60.0 * a, 60.0 * h) for a in aheads_min for h in holds_min]
    return [FIFO, *(o for o in pairs if o != FIFO)]


def multi_label(order: MultiOrder) -> str:
    """``a 360 hold 60`` (minutes), ``a ∞ hold ∞``."""
    def minutes(value: float) -> str:
        return f"{value / 60:g}" if math.isfinite(value) else ("∞" if value > 0 else "-∞")

    return f"a {minutes(order[0])} hold {minutes(order[1])}"


def largest(requests: Sequence[Request]) -> str:
    """The product of whole cards asking the most cards (the one ``a`` puts ahead)."""
    return size_class(max((r for r in requests if r.whole), key=lambda r: r.count))


def multi_frontier_cell(source: protocol_b.PoolSource, rho: float, seeds: Sequence[int], jobs: int,
                        orders: Sequence[MultiOrder]) -> tuple[dict[MultiOrder, dict[str, float]], dict[str, float]]:
    """Per order, per product, the mean of per-seed p99 waits in seconds (``product_waits``); and alone."""
    catalog = load_catalog()
    config = protocol_b.ProtocolBConfig(rounding="slices", rho=rho, jobs=jobs)
    per: dict[MultiOrder, dict[str, list[float]]] = {order: {} for order in orders}
    alone: dict[str, list[float]] = {}
    for seed in seeds:
        pool, reqs, _ = protocol_b.seed_workload(source, catalog, config, 64_000, seed)
        top = largest(reqs)
        for order in orders:
            for product, waits in product_waits(pool, reqs, 64, {top: order[0]}, order[1]).items():
                per[order].setdefault(product, []).append(p99(waits))
        for product, waits in alone_waits(pool, reqs, 64).items():
            alone.setdefault(product, []).append(p99(waits))
    return ({order: {p: statistics.fmean(v) for p, v in row.items()} for order, row in per.items()},
            {p: statistics.fmean(v) for p, v in alone.items()})


def verdict(rows: Mapping[MultiOrder, Mapping[str, float]], reference: Mapping[str, float], name: str) -> str:
    """The order with the smallest worst-product p99 sacrificing none against ``reference``, and its ratio."""
    best = best_point(rows, reference)
    if best is None:
        return f"  against {name}: every order sacrifices a product"
    goal = fairness.SHARP_RATIO * max(reference.values())
    reach = "reached" if best.worst_p99_s <= goal + 1e-9 else "NOT reached"
    return (f"  against {name}: best with no product sacrificed {multi_label(best.order)}, {best.worst_product} "
            f"{best.worst_p99_s / 60:.1f} = {best.ratio:.2f} x; 0.8 x is {goal / 60:.1f}: {reach}")


def multi_frontier_table(traces: Path, mixes: Sequence[str], rhos: Sequence[float], seeds: tuple[int, ...],
                         jobs: int, orders: Sequence[MultiOrder],
                         best_effort: Mapping[tuple[str, float], tuple[tuple[int, ...], dict[str, float]]]) -> str:
    """Each multi-card mix and load: every order's per-product p99, alone, and the two judgements."""
    if FIFO not in orders:
        orders = [FIFO, *orders]
    width = max(len(multi_label(o)) for o in orders)
    lines = ["no-fragmentation frontier, every product in its own line (simulations/ideal.py product_waits; "
             "minutes, mean of per-seed p99). a A: the largest product counted A min earlier; hold H: a head "
             "that waited H min stops every line after it. `!`: above 1.25 x best effort's p99 + 5 min (the real "
             "cluster's); `*`: the same against this relaxation's own first in, first out (a 0 hold ∞)"]
    for mix in mixes:
        for rho in rhos:
            rows, alone = multi_frontier_cell(mix_pool(traces, mix, rho, jobs), rho, seeds, jobs, orders)
            products = sorted({p for row in rows.values() for p in row}, key=product_order)
            head, be = cell_head(mix, rho, seeds, jobs, products, best_effort)
            lines += ["", head]
            lines.append(f"  {'order':>{width}} " + " ".join(f"{p:>11}" for p in products) + "  worst")
            for order in orders:
                row = rows[order]
                real, own = set(sacrificed(row, be)), set(sacrificed(row, rows[FIFO]))
                cells = " ".join(f"{row[p] / 60:>9.1f}{'!' if p in real else ' '}{'*' if p in own else ' '}"
                                 for p in products)
                worst = max(row, key=lambda p: (row[p], product_order(p)))
                lines.append(f"  {multi_label(order):>{width}} {cells} {worst} {row[worst] / 60:.1f}")
            lines.append(f"  {'alone':>{width}} " + " ".join(f"{alone[p] / 60:>9.1f}  " if p in alone else f"{'-':>9}  "
                                                         for p in products))
            if be:
                lines.append(verdict(rows, be, "best effort on the real cluster"))
            lines.append(verdict(rows, rows[FIFO], "this relaxation's first in, first out"))
    return "\n".join(lines)
