"""Synthetic workloads and load shaping: Poisson arrivals at a target offered load ρ.

ρ = Σ (cards × share × runtime) / (cluster cards × span of arrivals). Sizes and runtimes are
drawn first, then the arrival rate is set so that the drawn work offers exactly ρ over the
expected span, and the gaps are exponential: the realised load is ρ up to the Poisson noise of
the span. Everything is deterministic for a seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from simulations.traces import Job
from simulations.workload import DEFAULT_RUNTIME_CAP_S

# (product, cards, weight): quarter and half slices dominate by count, whole cards by GPU-time
DEFAULT_MIX: tuple[tuple[str, int, float], ...] = (
    ("v100-25", 1, 0.35),
    ("v100-50", 1, 0.30),
    ("v100-100", 1, 0.30),
    ("v100-100", 2, 0.04),
    ("v100-100", 4, 0.01),
)
DEFAULT_TENANTS = 4


class SyntheticError(ValueError):
    """A synthetic workload or load target that cannot be generated."""


@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate: the offered load against ``cards`` cards, and the shape of the work."""

    cards: int = 64
    rho: float = 0.85
    jobs: int = 20000
    mix: tuple[tuple[str, int, float], ...] = DEFAULT_MIX
    median_runtime_s: float = 900.0
    runtime_sigma: float = 1.6  # lognormal: p99 about 40x the median (the openb tail is heavier)
    runtime_cap_s: float = DEFAULT_RUNTIME_CAP_S
    tenants: int = DEFAULT_TENANTS
    high_priority_share: float = 0.1
    high_priority: int = 10
    product_milli: dict[str, int] = field(default_factory=lambda: {"v100-25": 250, "v100-50": 500, "v100-100": 1000})

    def __post_init__(self) -> None:
        if self.cards < 1 or self.jobs < 1:
            raise SyntheticError(f"need at least one card and one job, got {self.cards} and {self.jobs}")
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise SyntheticError(f"offered load must be positive, got {self.rho}")
        if not self.mix or any(w < 0 for _, _, w in self.mix) or sum(w for _, _, w in self.mix) <= 0:
            raise SyntheticError("the product mix needs positive weights")
        if self.median_runtime_s <= 0 or self.runtime_sigma < 0 or self.runtime_cap_s <= 0:
            raise SyntheticError("runtimes need a positive median and cap and a non-negative sigma")
        if self.tenants < 1 or not 0 <= self.high_priority_share <= 1:
            raise SyntheticError("need at least one tenant and a priority share within 0..1")
        unknown = sorted({p for p, _, _ in self.mix} - set(self.product_milli))
        if unknown:
            raise SyntheticError(f"mix names product(s) without a size: {', '.join(unknown)}")


def poisson_arrivals(n: int, work_milli_s: float, rho: float, capacity_milli: int, rng: random.Random) -> list[float]:
    """``n`` arrival times whose expected span makes ``work_milli_s`` offer load ``rho``."""
    if n < 1 or work_milli_s <= 0 or capacity_milli <= 0 or rho <= 0:
        raise SyntheticError("arrivals need jobs, work, capacity and a positive load")
    span = work_milli_s / (rho * capacity_milli)
    mean_gap = span / n
    t = 0.0
    out: list[float] = []
    for _ in range(n):
        t += rng.expovariate(1.0 / mean_gap)
        out.append(t)
    return out


def generate(spec: SyntheticSpec, seed: int) -> list[Job]:
    """``spec.jobs`` jobs: product mix, capped lognormal runtimes, Zipf tenants, Poisson arrivals."""
    rng = random.Random(seed)
    weights = [w for _, _, w in spec.mix]
    tenants = [f"team-{chr(ord('a') + i)}" if i < 26 else f"team-{i}" for i in range(spec.tenants)]
    tenant_weights = [1.0 / (i + 1) for i in range(spec.tenants)]
    mu = math.log(spec.median_runtime_s)
    shapes: list[tuple[str, int, float, str, int]] = []
    work = 0.0
    for _ in range(spec.jobs):
        product, count, _ = rng.choices(spec.mix, weights)[0]
        runtime = min(spec.runtime_cap_s, max(1.0, rng.lognormvariate(mu, spec.runtime_sigma)))
        tenant = rng.choices(tenants, tenant_weights)[0]
        priority = spec.high_priority if rng.random() < spec.high_priority_share else 0
        shapes.append((product, count, runtime, tenant, priority))
        work += spec.product_milli[product] * count * runtime
    times = poisson_arrivals(spec.jobs, work, spec.rho, spec.cards * 1000, rng)
    return [
        Job(name=f"syn-{i}", arrival=t, duration=runtime, milli=0, count=count, product=product,
            namespace=tenant, priority=priority)
        for i, (t, (product, count, runtime, tenant, priority)) in enumerate(zip(times, shapes, strict=True))
    ]


def job_work(job: Job, milli: int) -> float:
    """milli-GPU-seconds of ``job`` when each of its cards holds ``milli``."""
    return milli * job.count * (job.duration or 0.0)


def resample(pool: Sequence[Job], sizes: Sequence[int], n: int, rho: float, capacity_milli: int,
             seed: int) -> tuple[list[Job], list[int]]:
    """``n`` jobs drawn with replacement from ``pool`` (size and runtime together), arriving as a
    Poisson stream at offered load ``rho``; ``sizes[i]`` is pool job i's milli per card as placed.
    Returns the jobs and, for each, the index of the pool job it copies."""
    if not pool:
        raise SyntheticError("nothing to resample: the trace has no jobs with runtimes")
    if len(sizes) != len(pool):
        raise SyntheticError("one size per pool job")
    rng = random.Random(seed)
    picks = [rng.randrange(len(pool)) for _ in range(n)]
    work = sum(job_work(pool[i], sizes[i]) for i in picks)
    if work <= 0:
        raise SyntheticError("the resampled jobs hold no GPU time")
    times = poisson_arrivals(n, work, rho, capacity_milli, rng)
    jobs = [replace(pool[i], name=f"{pool[i].name}#{k}", arrival=t)
            for k, (i, t) in enumerate(zip(picks, times, strict=True))]
    return jobs, picks


def compress(jobs: Sequence[Job], sizes: Sequence[int], rho: float, capacity_milli: int) -> tuple[list[Job], float]:
    """The trace's own arrivals, time-compressed so that they offer ``rho``; returns the factor.

    Runtimes are kept: only the gaps between arrivals shrink.
    """
    if len(jobs) < 2:
        raise SyntheticError("compression needs at least two jobs")
    t0, t1 = jobs[0].arrival, jobs[-1].arrival
    if t1 <= t0:
        raise SyntheticError("every job arrives at the same time: nothing to compress")
    work = sum(job_work(j, m) for j, m in zip(jobs, sizes, strict=True))
    if work <= 0:
        raise SyntheticError("the trace holds no GPU time")
    factor = rho * capacity_milli * (t1 - t0) / work  # > 1 compresses, < 1 stretches
    return [replace(j, arrival=(j.arrival - t0) / factor) for j in jobs], factor
