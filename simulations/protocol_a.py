"""Protocol A, FGD-compatible: no departures, shuffled arrivals, workload inflated to 130 %.

Per seed: sample pods with replacement until the requested GPU total would pass
``inflation`` × cluster capacity, shuffle, place one by one (a pod that fits nowhere is
dropped), and record allocation % against arrived % after every arrival. The headline metric,
as in the FGD artifact (``merge_alloc_discrete.py``): unallocated GPU % = 100 − the mean
allocation % over all arrival events where round(arrived %) = 100.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from packing.policies import DEFAULT_POLICY
from packing.products import Catalog, Request
from simulations.cluster import CardModel, build_ledger
from simulations.scheduler import Scheduler, SchedulerModel, run_policy
from simulations.traces import NodeSpec, OpenbPod
from simulations.workload import pod_request, size_class

DEFAULT_SEEDS = tuple(range(42, 52))
DEFAULT_INFLATION = 1.3
CURVE_MAX_PCT = 130


@dataclass(frozen=True)
class ProtocolAConfig:
    policy: str = DEFAULT_POLICY
    rounding: str = "none"
    model: SchedulerModel = field(default_factory=SchedulerModel)
    inflation: float = DEFAULT_INFLATION
    track_host: bool = True
    use_index: bool = False  # best fit through the ledger's sorted index instead of the key cache
    prior: tuple[Request, ...] = ()  # what the policy's mix estimator starts from (catalog slices: the catalog)


@dataclass
class RunA:
    """One seed's run: the allocation curve and the headline numbers."""

    seed: int
    policy: str
    rounding: str
    ties: str
    scores: str
    pods: int
    capacity_milli: int
    unallocated_gpu_pct_at_100: float
    unallocated_gpu_pct_first_100: float
    allocated_pct_final: float
    arrived_pct_final: float
    failed: dict[str, int]
    curve: list[float | None]  # mean allocation % per integer arrived %, 0..130
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def inflate(requests: Sequence[Request], capacity_milli: int, ratio: float, rng: random.Random) -> list[Request]:
    """The workload tuned to ``ratio`` × capacity, shuffled (the artifact's ``TunePodsByNodeTotalResource``):
    below the target, pods sampled with replacement are appended while the next one still fits
    under it (``tuneUpPods``); above it, random pods are removed until it is met (``tuneDownPods``).
    """
    if not requests:
        raise ValueError("no pods to inflate")
    if ratio <= 0:
        raise ValueError(f"inflation must be positive, got {ratio}")
    out = list(requests)
    target = ratio * capacity_milli
    demand = sum(r.total_milli for r in out)
    if demand > target:
        while demand > target:
            demand -= out.pop(rng.randrange(len(out))).total_milli
    elif any(r.total_milli for r in requests):
        while True:
            extra = rng.choice(requests)
            if demand + extra.total_milli > target:
                break
            out.append(extra)
            demand += extra.total_milli
    rng.shuffle(out)
    return out


def headline(arrived: Sequence[float], allocated: Sequence[float]) -> tuple[float, float]:
    """(unallocated % over all events with round(arrived) = 100, the same at the first such event).

    NaN when the run never reaches arrived ≈ 100 %.
    """
    at = [a for x, a in zip(arrived, allocated, strict=True) if round(x) == 100]
    if not at:
        return float("nan"), float("nan")
    return 100.0 - statistics.fmean(at), 100.0 - at[0]


def curve(arrived: Sequence[float], allocated: Sequence[float], top: int = CURVE_MAX_PCT) -> list[float | None]:
    """Mean allocation % per integer arrived % (None where no event rounds to it)."""
    sums = [0.0] * (top + 1)
    counts = [0] * (top + 1)
    for x, a in zip(arrived, allocated, strict=True):
        k = round(x)
        if 0 <= k <= top:
            sums[k] += a
            counts[k] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def run_seed(nodes: Sequence[NodeSpec], requests: Sequence[Request], card: CardModel, config: ProtocolAConfig,
             seed: int) -> RunA:
    """One protocol A run; deterministic for ``seed``."""
    started = time.perf_counter()
    rng = random.Random(seed)
    ledger = build_ledger(nodes, card, seed=seed, track_host=config.track_host)
    capacity = ledger.capacity_milli()
    if capacity == 0:
        raise ValueError("protocol A needs GPUs: the node list has none")
    workload = inflate(requests, capacity, config.inflation, rng)
    policy = run_policy(config.policy, requests, seed, config.prior)
    scheduler = Scheduler(ledger, policy, config.model, seed=seed, use_index=config.use_index)
    arrived_milli = allocated_milli = 0
    arrived: list[float] = []
    allocated: list[float] = []
    failed: Counter[str] = Counter()
    for i, request in enumerate(workload):
        arrived_milli += request.total_milli
        policy.observe(request)  # the mix estimator sees every arrival, as the extender does
        if scheduler.place(f"pod-{i}", request) is not None:
            allocated_milli += request.total_milli
        else:
            failed[size_class(request)] += 1
        arrived.append(100.0 * arrived_milli / capacity)
        allocated.append(100.0 * allocated_milli / capacity)
    at_100, first_100 = headline(arrived, allocated)
    return RunA(
        seed=seed, policy=policy.name, rounding=config.rounding, ties=config.model.ties, scores=config.model.scores,
        pods=len(workload), capacity_milli=capacity, unallocated_gpu_pct_at_100=at_100,
        unallocated_gpu_pct_first_100=first_100, allocated_pct_final=allocated[-1], arrived_pct_final=arrived[-1],
        failed=dict(sorted(failed.items())), curve=curve(arrived, allocated), seconds=time.perf_counter() - started,
    )


def run(nodes: Sequence[NodeSpec], requests: Sequence[Request], card: CardModel, config: ProtocolAConfig,
        seeds: Sequence[int] = DEFAULT_SEEDS, progress: Callable[[int, int], None] | None = None) -> list[RunA]:
    """Protocol A for every seed; ``progress(done, total)`` after each."""
    out: list[RunA] = []
    for i, seed in enumerate(seeds):
        out.append(run_seed(nodes, requests, card, config, seed))
        if progress is not None:
            progress(i + 1, len(seeds))
    return out


def pod_requests(pods: Sequence[OpenbPod], catalog: Catalog, rounding: str) -> list[Request]:
    """Every ``openb`` pod's request under ``rounding``."""
    return [pod_request(p, catalog, rounding) for p in pods]


def summarize(runs: Sequence[RunA]) -> dict[str, object]:
    """Mean and standard deviation over seeds of the headline metrics, plus the mean curve.

    Seeds whose run never has an arrival event rounding to 100 % (tiny clusters, huge pods) are
    left out of the means; ``seeds_at_100`` counts the others.
    """
    values = [v for r in runs if math.isfinite(v := r.unallocated_gpu_pct_at_100)]
    first = [v for r in runs if math.isfinite(v := r.unallocated_gpu_pct_first_100)]
    final = [r.allocated_pct_final for r in runs]
    mean_curve: list[float | None] = []
    for k in range(CURVE_MAX_PCT + 1):
        points = [c for r in runs if (c := r.curve[k]) is not None]
        mean_curve.append(statistics.fmean(points) if points else None)
    return {
        "policy": runs[0].policy if runs else None,
        "seeds": [r.seed for r in runs],
        "seeds_at_100": len(values),
        "unallocated_gpu_pct_at_100": statistics.fmean(values) if values else float("nan"),
        "unallocated_gpu_pct_at_100_sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "unallocated_gpu_pct_first_100": statistics.fmean(first) if first else float("nan"),
        "allocated_pct_final": statistics.fmean(final) if final else float("nan"),
        "seconds_per_run": statistics.fmean(r.seconds for r in runs) if runs else 0.0,
        "curve": mean_curve,
    }
