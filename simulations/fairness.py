"""The queue fairness goal: does an admission strategy serve every product, against best effort?

The objective is the worst-served product, not one product (``packing/QUEUE.md``, *Fairness*). For
one workload at one load, with each product's p99 wait taken as the mean of the per-seed p99s:

* **minimax**: the largest per-product p99 at most ``SHARP_RATIO`` (0.8) x best effort's where best
  effort's worst product needs whole cards (a whole card or several), at most 1.0 x elsewhere; not
  judged where best effort's worst p99 is under ``SACRIFICE_SLACK_S`` (5 min, the goal's own measure of
  a wait too short to count): at such a load there is no tail to cut, and a ratio of two such figures
  is noise (0.1 min against 0.1 min);
* **no product sacrificed**: no product's p99 above ``SACRIFICE_FACTOR`` (1.25) x its own best-effort
  p99 + ``SACRIFICE_SLACK_S`` (5 min);
* the longest wait (every seed's jobs pooled) no longer than best effort's (one seed decides it, so the
  verdict also keeps each seed's longest against best effort's, paired: ``per_seed_longest``, not judged);
* utilisation within ``UTIL_POINTS`` (0.5) points of best effort's, and -- when measured -- usable
  capacity (utilisation at a saturating load) within ``USABLE_POINTS`` (1) point.

The ratio's 95 % interval is paired over seeds (``paired_ratio_ci95``): both runs saw the same arrivals
per seed, so it is much narrower than the two means' own intervals; a ratio whose interval holds 1.0
is no measured difference from best effort. A sacrificed product's margin past its limit is paired the
same way (``past_limit_ci95``, not judged): on 10 seeds a margin whose interval holds 0 is as likely
seed noise as a product that pays (protocol B, #27 stop 43: such flags came and went between seeds
1-10 and 1-20 of one cell).

``verdict`` reads the figures ``simulations.cli`` keeps per run (``per_seed_p99``, ``waits``,
``max_wait_s``, ``utilisation_pct``) and says which points hold.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packing.products import Catalog, RequestError
from packing.queue import BEST_EFFORT_FIFO
from simulations.metrics import product_order
from simulations.protocol_b import SeedSpread

REFERENCE = BEST_EFFORT_FIFO
SHARP_RATIO = 0.8
RATIO = 1.0
SACRIFICE_FACTOR = 1.25
SACRIFICE_SLACK_S = 300.0
UTIL_POINTS = 0.5
USABLE_POINTS = 1.0
_COUNT = re.compile(r"^(.*)x(\d+)$")


def whole_cards(product: str, catalog: Catalog) -> bool:
    """Does ``product`` (a reported class: ``v100-100``, ``v100-100x4``, ``whole``, ``share``...) need whole cards?"""
    m = _COUNT.match(product)
    if m is not None and int(m.group(2)) > 1:
        return True
    if product == "whole":
        return True
    try:
        return catalog.request(product).whole
    except (RequestError, KeyError, ValueError):
        return False


def p99_by_product(run: Mapping[str, Any]) -> dict[str, float]:
    """Per product (``all`` left out): the mean of the per-seed p99 waits in seconds (the pooled p99
    when the run kept no per-seed figures, e.g. one seed)."""
    spread = run.get("per_seed_p99") or {}
    out: dict[str, float] = {}
    for product, w in run["waits"].items():
        if product == "all":
            continue
        mean = (spread.get(product) or {}).get("mean")
        out[product] = float(mean) if isinstance(mean, (int, float)) and math.isfinite(mean) else float(w["p99_s"])
    return out


def worst(run: Mapping[str, Any]) -> tuple[str, float]:
    """The worst-served product of a run and its p99 (mean of per-seed p99), in seconds."""
    p99 = p99_by_product(run)
    if not p99:
        return "-", math.nan
    product = max(p99, key=lambda p: (p99[p], p))
    return product, p99[product]


@dataclass(frozen=True)
class PerSeedLongest:
    """The longest wait seed by seed: the pooled figure the goal judges is the longest of every seed's, so
    one seed decides it; the mean over seeds, paired, says whether a strategy lengthens the longest wait."""

    mean_s: float  # this run's per-seed longest waits, their mean
    reference_mean_s: float  # best effort's on the same seeds
    diff_ci95_s: tuple[float, float]  # 95 % interval of mean(this - best effort), paired over seeds
    longer_seeds: int  # seeds whose longest wait is longer than best effort's
    seeds: int


@dataclass(frozen=True)
class Verdict:
    """One strategy's run against the reference (best effort) on the same workload, load and seeds."""

    worst_product: str
    worst_p99_s: float  # mean of per-seed p99
    ratio: float  # worst_p99_s / the reference's worst p99
    goal_ratio: float  # SHARP_RATIO or RATIO
    sacrificed: tuple[str, ...]  # products above SACRIFICE_FACTOR x their reference p99 + SACRIFICE_SLACK_S
    max_wait_s: float
    reference_max_wait_s: float
    util_gap: float  # reference utilisation - this one, in points (positive: this one uses less)
    usable_gap: float | None  # the same at the saturating load, when measured
    reference_worst_p99_s: float = math.inf  # best effort's worst product's p99 (mean of per-seed p99)
    ratio_ci95: tuple[float, float] | None = None  # the ratio's 95 % interval, paired over seeds (None: < 2 seeds)
    # beside the pooled longest wait (one run's extreme): each seed's longest, this run's mean, best effort's, and
    # the 95 % interval of their difference paired over seeds (None: fewer than two seeds kept)
    longest_per_seed: PerSeedLongest | None = None
    # per sacrificed product (in ``sacrificed``'s order): the 95 % interval of its margin past its limit, seconds,
    # paired over seeds (None: fewer than two seeds); not judged, printed beside the verdict
    past_limit: tuple[tuple[str, tuple[float, float] | None], ...] = ()

    @property
    def minimax_judged(self) -> bool:
        """Whether best effort's worst tail is long enough (``SACRIFICE_SLACK_S``) for the ratio to mean something."""
        return self.reference_worst_p99_s >= SACRIFICE_SLACK_S

    @property
    def failures(self) -> list[str]:
        """The points of the goal this run misses, in words (empty: every point met)."""
        out = []
        if self.minimax_judged and not self.ratio <= self.goal_ratio + 1e-9:
            out.append(f"minimax {self.ratio:.2f} > {self.goal_ratio:.1f}")
        if self.sacrificed:
            out.append("sacrificed " + ", ".join(self.sacrificed))
        if not self.max_wait_s <= self.reference_max_wait_s + 1e-6:
            out.append("max wait")
        if not self.util_gap <= UTIL_POINTS:
            out.append(f"utilisation -{self.util_gap:.2f}")
        if self.usable_gap is not None and not self.usable_gap <= USABLE_POINTS:
            out.append(f"usable -{self.usable_gap:.2f}")
        return out


def paired_ratio_ci95(run: Mapping[str, Any], reference: Mapping[str, Any], product: str,
                      ref_product: str) -> tuple[float, float] | None:
    """The 95 % interval of ``ratio``, paired over seeds: per seed d = this run's p99 of ``product`` - the
    reference's p99 of ``ref_product`` (the same arrivals under both: seed noise cancels); t interval of
    mean(d), over the reference's mean. None with fewer than two seeds, or one missing."""
    mine, theirs = _per_seed(run, product), _per_seed(reference, ref_product)
    d = _paired(mine, theirs)
    if d is None:
        return None
    base = statistics.fmean(float(b) for b in theirs)
    if base <= 0:
        return None
    centre = 1.0 + d.mean / base
    return centre - d.half_width / base, centre + d.half_width / base


def past_limit_ci95(run: Mapping[str, Any], reference: Mapping[str, Any], product: str) -> tuple[float, float] | None:
    """The 95 % interval of ``product``'s margin past its limit, paired over seeds: per seed d = this run's p99 -
    ``limit_s`` of the reference's on the same seed (mean(d) is the mean margin exactly: the limit is linear).
    None with fewer than two seeds, or either run missing them."""
    d = _paired(_per_seed(run, product), [limit_s(float(b)) for b in _per_seed(reference, product)])
    return None if d is None else (d.mean - d.half_width, d.mean + d.half_width)


def per_seed_longest(run: Mapping[str, Any], reference: Mapping[str, Any]) -> PerSeedLongest | None:
    """Each seed's longest wait (``per_seed_max_wait_s``) against best effort's on the same seed; None with
    fewer than two seeds, or either run missing them."""
    mine, theirs = run.get("per_seed_max_wait_s") or [], reference.get("per_seed_max_wait_s") or []
    d = _paired(mine, theirs)
    if d is None:
        return None
    return PerSeedLongest(statistics.fmean(map(float, mine)), statistics.fmean(map(float, theirs)),
                          (d.mean - d.half_width, d.mean + d.half_width), sum(x > 0 for x in d.values), len(d.values))


def _per_seed(run: Mapping[str, Any], product: str) -> Sequence[Any]:
    """``product``'s p99 per seed in ``run`` (empty where it was not kept)."""
    return ((run.get("per_seed_p99") or {}).get(product) or {}).get("per_seed") or []


def _paired(mine: Sequence[Any], theirs: Sequence[Any]) -> SeedSpread | None:
    """Per seed this run's figure minus the reference's (the same arrivals: seed noise cancels); None unless
    both have the same two or more seeds, every difference finite."""
    if not mine or not theirs or len(mine) != len(theirs) or len(mine) < 2:
        return None
    d = SeedSpread(tuple(float(a) - float(b) for a, b in zip(mine, theirs, strict=True)))
    return d if math.isfinite(d.half_width) else None


def limit_s(reference_p99_s: float) -> float:
    """The most a product may wait at p99 before it counts as sacrificed: 1.25 x its best-effort p99 + 5 min."""
    return SACRIFICE_FACTOR * reference_p99_s + SACRIFICE_SLACK_S


def verdict(run: Mapping[str, Any], reference: Mapping[str, Any], catalog: Catalog,
            saturated: Mapping[str, Any] | None = None,
            reference_saturated: Mapping[str, Any] | None = None) -> Verdict:
    """``run`` against ``reference`` (best effort), both as ``simulations.cli`` keeps them."""
    mine, theirs = p99_by_product(run), p99_by_product(reference)
    product, p99 = worst(run)
    ref_product, ref_p99 = worst(reference)
    goal = SHARP_RATIO if whole_cards(ref_product, catalog) else RATIO
    ratio = p99 / ref_p99 if ref_p99 > 0 else (1.0 if p99 <= 0 else math.inf)
    sacrificed = tuple(sorted((p for p in mine if p in theirs and mine[p] > limit_s(theirs[p])), key=product_order))
    usable = None
    if saturated is not None and reference_saturated is not None:
        usable = float(reference_saturated["utilisation_pct"]) - float(saturated["utilisation_pct"])
    return Verdict(product, p99, ratio, goal, sacrificed, float(run["max_wait_s"]), float(reference["max_wait_s"]),
                   float(reference["utilisation_pct"]) - float(run["utilisation_pct"]), usable, ref_p99,
                   paired_ratio_ci95(run, reference, product, ref_product), per_seed_longest(run, reference),
                   tuple((p, past_limit_ci95(run, reference, p)) for p in sacrificed))

